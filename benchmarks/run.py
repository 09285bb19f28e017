r"""Run one algorithm script over a grid of env ids x seeds at a step budget, in parallel.

    python benchmarks/run.py --algo ppo_continuous --env dm_control/cartpole/balance \
        --seeds 1 2 --budget 200k --out benchmarks/results/ppo_continuous.csv [-- --num-envs 4]

Each run is the script's real command line in its own process (`--jobs`, default one per
core), with its own `--output-dir`. When it finishes, its evaluations are read back from
the TensorBoard events (`eval/return_mean`, `eval/return_std`) and written to the CSV, one
row per evaluation (columns in `common.RESULT_FIELDS`: with the training backend and the CPU model, so a figure
can be traced to where it was made, and its source: the script's commit and blob at the run's start, the hash of the
args the run recorded in its checkpoint, the package versions), and the run is marked done.

Resumable: the same command again skips finished runs; a run that was killed halfway
(no done marker) is deleted and redone, and its rows replace any it left in the CSV.
Arguments after `--` go to the script; they name the config in the CSV's `tag` column
unless `--tag` is given. Budgets: one number for every env, and/or `ENV=N` per env.
`--suite control` names a grid: the control-suite tasks and budgets the defaults are judged on.
`--final-episodes N` then evaluates each finished run's last checkpoint again on N episodes (the script's own
`--eval-only`, so the same starts for every run of a seed) and writes each episode's return, one row a run, to
`<out without .csv>_final.csv`, which `report.py` reads beside `--out`; a run that has its row is not evaluated again.

Each run gets `OMP_NUM_THREADS` = cores / `--jobs` unless it is set. Two runners side by side do not know
of each other: give each `OMP_NUM_THREADS=1` (two runs of two threads on two cores ran 25x slower here).

On a cluster, `--slurm` submits the same selection as one Slurm array job, one task a run (the runs not done yet, and
not queued from an earlier submission). Each task is this runner on its one run (`--jobs 1`, `OMP_NUM_THREADS` = the
task's `--cpus-per-task` unless it is set), so it runs the same command line, and it writes the run's rows to a shard of
its own, `<run dir>/rows.csv` (concurrent appends to one CSV on a shared filesystem lose rows). The same command with
`--merge` instead of `--slurm` copies the finished runs' shards into `--out` (a run already there as its shard has it
is left alone, so merging twice changes nothing) and says, one line a run, which tasks failed and where their logs
are. `--slurm --dry-run` prints the job script; `--slurm --wait` waits for the job and merges.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import slurm  # noqa: E402

MANAGED = ("--env-id", "--seed", "--total-timesteps", "--output-dir")
LOG_TAIL_LINES = 15
# --final-episodes: the script imported by its path, its `--eval-only` run on a checkpoint, each episode's return saved.
FINAL_EVAL = """import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import common
script = common.load_script(Path(sys.argv[2]))
flags = ["--eval-only", "--checkpoint", sys.argv[3], "--eval-episodes", sys.argv[4], "--output-dir", sys.argv[5]]
summary = script.train(script.tyro.cli(script.Args, args=[*flags, "--no-cuda"]))
Path(sys.argv[6]).write_text(json.dumps([float(r) for r in summary["eval_returns"]]))
"""
SHARD = "rows.csv"  # a Slurm task's rows, in its run's folder; --merge copies them into --out


@dataclass
class Run:
    algo: str
    tag: str
    env: str
    seed: int
    budget: int
    dir: Path

    @property
    def key(self) -> dict:
        return {"algo": self.algo, "tag": self.tag, "env": self.env, "seed": self.seed, "budget": self.budget}

    @property
    def done_file(self) -> Path:
        return self.dir / "done.json"

    def __str__(self) -> str:
        return f"{self.algo} [{self.tag}] {self.env} seed {self.seed} ({self.budget} steps)"


def plan(args, extra: list[str]) -> list[Run]:
    """Every run of the grid, longest first (better packing of the parallel jobs)."""
    budgets = common.parse_budgets(args.budget, args.env)
    algo = args.script.stem
    runs = [
        Run(
            algo,
            args.tag,
            env,
            seed,
            budgets[env],
            args.work_dir / algo / common.slug(args.tag) / common.slug(env) / f"seed{seed}-{budgets[env]}",
        )
        for env in args.env
        for seed in args.seeds
    ]
    for run in (r for r in runs if r.done_file.exists()):  # never mix two configs under one tag
        done = json.loads(run.done_file.read_text())
        if (done["tag"], done["extra_args"]) != (run.tag, extra):
            raise common.BenchmarkError(
                f"{run}: {run.dir} holds a finished run of tag {done['tag']!r} with script "
                f"args {done['extra_args']}, not {extra}; give this config its own --tag"
            )
    return sorted(runs, key=lambda r: -r.budget)


class Runner:
    def __init__(self, args, extra: list[str]):
        self.args, self.extra = args, extra
        self.lock = threading.Lock()  # console lines and the process list
        self.procs: set[subprocess.Popen] = set()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # One thread per process when the cores are shared out, unless the user chose otherwise.
        # The scripts' update and EnvPool (--torch-threads 0) follow it.
        self.env.setdefault("OMP_NUM_THREADS", str(max(1, common.cores() // args.jobs)))
        self.versions = common.package_versions()  # the scripts run on this interpreter

    def say(self, msg: str) -> None:
        with self.lock:
            print(msg, flush=True)

    def command(self, run: Run) -> list[str]:
        return [
            sys.executable,
            str(self.args.script),
            "--env-id",
            run.env,
            "--seed",
            str(run.seed),
            "--total-timesteps",
            str(run.budget),
            "--output-dir",
            str(run.dir / "tb"),
            *self.extra,
        ]

    def record(self, run: Run, source: dict) -> list[dict]:
        """Read the run's evaluations back from its TensorBoard events into CSV rows (replacing old ones). `source`: the
        commit, script blob and package versions of the run's start (`unknown` where a run finished before run.py
        recorded them); the args hash comes from what the run itself recorded."""
        run_dirs = sorted((d for d in (run.dir / "tb").glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime)
        curve = common.read_eval_curve(run_dirs[-1]) if run_dirs else []
        if not curve:
            raise common.BenchmarkError(f"{run}: no eval/return_mean in the TensorBoard events under {run.dir / 'tb'}")
        # A script without --env-backend (ppo_discrete.py) steps gymnasium's envs.
        backend = common.read_hyperparameters(run_dirs[-1]).get("env_backend", "gymnasium")
        cpu = common.cpu_model()
        args = common.read_run_args(run_dirs[-1])
        source = {f: source.get(f, common.UNKNOWN) for f in ("commit", "script", "versions")}
        source["args_hash"] = common.args_hash(args) if args else common.UNKNOWN
        rows = [
            {
                **run.key,
                "step": p["step"],
                "wall_time": round(p["wall_time"], 3),
                "eval_return": round(p["eval_return"], 4),
                "eval_std": round(p["eval_std"], 4),
                "train_return": "" if math.isnan(p["train_return"]) else round(p["train_return"], 4),
                "backend": backend,
                "cpu": cpu,
                **source,
            }
            for p in curve
        ]
        common.write_rows(self.args.out, common.RESULT_FIELDS, rows, replace=run.key)
        return rows

    def execute(self, run: Run) -> bool:
        """Run one grid point from scratch; True when it finished and its rows are in the CSV."""
        if run.dir.exists():
            shutil.rmtree(run.dir)  # a run killed halfway: start it again
        run.dir.mkdir(parents=True)
        start = time.time()
        source = {**common.script_source(self.args.script), "versions": self.versions}  # the code this run starts on
        with open(run.dir / "log.txt", "w") as log:
            proc = subprocess.Popen(self.command(run), cwd=run.dir, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            with self.lock:
                self.procs.add(proc)
            rc = proc.wait()
            with self.lock:
                self.procs.discard(proc)
        if rc != 0:
            tail = (run.dir / "log.txt").read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            self.say(f"FAILED {run}: exit code {rc}, log {run.dir / 'log.txt'}:\n    " + "\n    ".join(tail))
            return False
        try:
            rows = self.record(run, source)
        except common.BenchmarkError as e:
            self.say(f"FAILED {e}")
            return False
        final = rows[-1]
        run.done_file.write_text(
            json.dumps(
                {
                    **run.key,
                    "extra_args": self.extra,
                    "source": source,
                    "rows": len(rows),
                    "final_step": final["step"],
                    "final_eval_return": final["eval_return"],
                    "seconds": time.time() - start,
                },
                indent=1,
            )
        )
        self.say(f"done    {run}: eval return {final['eval_return']:.1f} at step {final['step']}, {time.time() - start:.0f}s")
        return True

    def reevaluate(self, run: Run) -> bool:
        """A finished run's last checkpoint on --final-episodes episodes: one row of each episode's return."""
        done, episodes = json.loads(run.done_file.read_text()), self.args.final_episodes
        run_dirs = sorted((d for d in (run.dir / "tb").glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime)
        checkpoint = run_dirs[-1] / f"{run.algo}_last.pt" if run_dirs else run.dir / "tb"
        out = run.dir / "final"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        command = [sys.executable, "-c", FINAL_EVAL, str(Path(__file__).parent), str(self.args.script), str(checkpoint)]
        with open(out / "log.txt", "w") as log:
            command += [str(episodes), str(out / "tb"), str(out / "returns.json")]
            rc = subprocess.run(command, cwd=out, env=self.env, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            self.say(f"FAILED final evaluation of {run}: exit code {rc}, log {out / 'log.txt'}")
            return False
        returns = np.array(json.loads((out / "returns.json").read_text()))
        args = common.read_run_args(run_dirs[-1])
        source = {f: done.get("source", {}).get(f, common.UNKNOWN) for f in ("commit", "script", "versions")}
        source["args_hash"] = common.args_hash(args) if args else common.UNKNOWN
        row = {**run.key, "step": done["final_step"], "episodes": episodes, **source}
        row |= {"return_mean": round(returns.mean(), 4), "return_std": round(returns.std(), 4)}
        row["returns"] = " ".join(f"{r:.1f}" for r in returns)
        common.write_rows(common.final_csv(self.args.out), common.FINAL_FIELDS, [row], replace=run.key)
        self.say(f"final   {run}: {returns.mean():.1f} ± {returns.std():.1f} over {episodes} episodes")
        return True

    def complete(self, run: Run, train: bool, evaluate: bool) -> bool:
        return (not train or self.execute(run)) and (not evaluate or self.reevaluate(run))

    def run_all(self, runs: list[Run]) -> int:
        todo = [r for r in runs if not r.done_file.exists()]
        # Finished runs whose rows are missing (e.g. a deleted CSV) are read back, not rerun.
        _, existing = common.read_csv(self.args.out)
        have = {tuple(r[k] for k in common.RUN_KEY) for r in existing}
        for run in runs:
            if run not in todo and tuple(str(v) for v in run.key.values()) not in have:
                self.record(run, json.loads(run.done_file.read_text()).get("source", {}))
        self.say(
            f"{len(runs)} runs: {len(runs) - len(todo)} already done, {len(todo)} to run "
            f"with {self.args.jobs} jobs of {self.env['OMP_NUM_THREADS']} threads each -> {self.args.out}"
        )
        _, finals = common.read_csv(common.final_csv(self.args.out))
        evaluated = {tuple(r[k] for k in common.RUN_KEY) for r in finals if r["episodes"] == str(self.args.final_episodes)}
        reevaluate = [self.args.final_episodes > 0 and tuple(str(v) for v in r.key.values()) not in evaluated for r in runs]
        work = [(run, run in todo, again) for run, again in zip(runs, reevaluate, strict=True) if run in todo or again]
        failed = 0
        with ThreadPoolExecutor(self.args.jobs) as pool:
            futures = [pool.submit(self.complete, *item) for item in work]
            try:
                for future in as_completed(futures):
                    failed += not future.result()
            except KeyboardInterrupt:  # the scripts got the Ctrl-C too; wait for them to save and stop
                for f in futures:
                    f.cancel()
                with self.lock:
                    for proc in self.procs:
                        proc.terminate()
                self.say("interrupted: unfinished runs will be redone when the same command is run again")
                return 130
        if failed:
            self.say(f"{failed} of {len(work)} runs failed; rerun the same command to retry them")
        return 1 if failed else 0


def parse_args(argv: list[str]):
    own, extra = common.split_passthrough(argv)
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --algo ALGO (--env ENV [ENV ...] --budget N|ENV=N [...] | --suite NAME) [options] [-- script args]",
    )
    p.add_argument("--algo", required=True, help=f"one of {', '.join(common.ALGOS)}, or a path to a script")
    p.add_argument("--env", nargs="+", help="env ids, e.g. dm_control/cartpole/balance CartPole-v1")
    p.add_argument(
        "--suite", choices=sorted(common.SUITES), help="a named grid of envs and budgets (--env / --budget add to it)"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds (default: 1)")
    p.add_argument(
        "--budget", nargs="+", default=[], help="env steps per run: N for every env and/or ENV=N per env (200000, 200k, 1M)"
    )
    p.add_argument("--out", type=Path, help="results CSV (default: benchmarks/results/<algo>.csv)")
    p.add_argument("--tag", help="config label in the CSV (default: the args after --, or 'default')")
    p.add_argument("--jobs", type=int, default=common.cores(), help="parallel runs (default: number of cores)")
    p.add_argument(
        "--final-episodes", type=int, default=0, help="evaluate each finished run's last checkpoint again on N episodes"
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        help="where the runs' TensorBoard files, checkpoints and logs go (default: <out without .csv>_runs/)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the runs and their status, run nothing (with --slurm: the job script)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--slurm", action="store_true", help="submit the runs not done yet as one Slurm array job")
    where.add_argument("--merge", action="store_true", help="copy the rows of the runs the Slurm tasks finished into --out")
    slurm.add_options(p, cpus_default="1")
    args = p.parse_args(own)
    slurm.validate(args, args.slurm)
    if not args.env and not args.suite:
        raise common.BenchmarkError("give --env ENV [ENV ...] or --suite NAME")
    if args.suite:  # the suite's envs and budgets first; the command line's own --env / --budget ENV=N after them
        args.env = list(common.SUITES[args.suite]) + (args.env or [])
        args.budget = [f"{env}={budget}" for env, budget in common.SUITES[args.suite].items()] + args.budget
    args.env, args.seeds = list(dict.fromkeys(args.env)), list(dict.fromkeys(args.seeds))  # no run twice
    args.script = common.resolve_script(args.algo)
    common.reject_managed(extra, MANAGED, "run.py")
    if args.jobs < 1:
        raise common.BenchmarkError(f"--jobs must be at least 1, got {args.jobs}")
    if args.final_episodes < 0:
        raise common.BenchmarkError(f"--final-episodes must be 0 (none) or more, got {args.final_episodes}")
    args.tag = common.config_tag(args.tag, extra)
    args.out = (args.out or common.ROOT / "benchmarks" / "results" / f"{args.script.stem}.csv").resolve()
    args.work_dir = (args.work_dir or args.out.with_name(args.out.stem + "_runs")).resolve()
    return args, extra


# ---------------------------------------------------------------------------------------
# Slurm: one array job, a task a run; each task's rows in a shard, merged into --out by one command
# ---------------------------------------------------------------------------------------
@dataclass
class SlurmState:
    """Where each run of the selection stands with Slurm."""

    done: list[Run]
    queued: list[tuple[Run, str]]  # (run, its task 'job_i') still pending or running
    failed: list[tuple[Run, str]]  # (run, why and where its log is): its task ended without finishing it
    unsubmitted: list[Run]


def slurm_state(args, runs: list[Run]) -> SlurmState:
    """Done (its done.json), else the latest task submitted for it: still in the queue, or ended (it wrote its exit
    code, or it left the queue without one: killed), else never submitted. Each `--slurm` keeps its job's runs in
    `<work dir>/slurm/<job>.json`."""
    logs = args.work_dir / "slurm"
    latest: dict[Path, tuple[str, int]] = {}
    for manifest in sorted(logs.glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
        for i, run_dir in enumerate(json.loads(manifest.read_text())["runs"]):
            latest[Path(run_dir)] = (manifest.stem, i)
    state = SlurmState([], [], [], [])
    unended = [
        r for r in runs if not r.done_file.exists() and r.dir in latest and slurm.exit_code(logs, *latest[r.dir]) is None
    ]
    active = slurm.active_tasks() if unended else set()
    for run in runs:
        if run.done_file.exists():
            state.done.append(run)
        elif run.dir not in latest:
            state.unsubmitted.append(run)
        elif latest[run.dir] in active:
            state.queued.append((run, "{}_{}".format(*latest[run.dir])))
        else:
            state.failed.append((run, slurm.task_failure(logs, *latest[run.dir], log=run.dir / "log.txt")))
    return state


def command_line(args, *replace: str) -> str:
    """This command as typed, its Slurm options replaced by `replace` (e.g. `--merge`)."""
    own, extra = common.split_passthrough(sys.argv[1:])
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else sys.executable
    return shlex.join([python, sys.argv[0], *slurm.strip_options(own, False), *replace, *(["--", *extra] if extra else [])])


def submit(args, extra: list[str], runs: list[Run]) -> int:
    """The runs that are not done and not queued, as one array job (a failed run's task is submitted again)."""
    state = slurm_state(args, runs)
    failed = {id(run) for run, _ in state.failed}
    todo = [r for r in runs if id(r) in failed or r in state.unsubmitted]
    out = sys.stderr if args.dry_run else sys.stdout  # --dry-run: stdout is the job script alone
    print(
        f"{len(runs)} runs: {len(state.done)} already done, {len(state.queued)} queued or running in Slurm, "
        f"{len(todo)} to submit" + (f" ({len(failed)} of them failed before)" if failed else ""),
        file=out,
    )
    for run, why in state.failed:
        print(f"retry   {run}: {why}", file=out)
    merge_command = command_line(args, "--merge")
    if not todo:
        if args.wait and not args.dry_run:  # the runs queued by earlier submissions, then the merge
            print("nothing submitted", flush=True)
            if state.queued:
                slurm.wait(sorted({task.split("_")[0] for _, task in state.queued}))
            return merge(args, runs)
        print(f"nothing submitted; to copy the finished runs' rows into {args.out}: {merge_command}", file=out)
        return 0
    logs = args.work_dir / "slurm"
    # Each task: this runner on one run, as a local invocation would run it, its rows to the run's own shard.
    head = [sys.executable, str(Path(__file__).resolve()), f"--algo={args.script}", f"--tag={args.tag}"]
    head += [f"--work-dir={args.work_dir}", "--jobs=1"]
    tasks = [[f"--env={r.env}", f"--seeds={r.seed}", f"--budget={r.budget}", f"--out={r.dir / SHARD}"] for r in todo]
    notes = [
        f"run.py --slurm: {len(todo)} runs of {args.script.name} [{args.tag}], one a task. Each task is run.py on its run",
        "(--jobs 1), the script's command line in its run's folder, its rows to <run folder>/rows.csv. When they end,",
        f"copy the rows into {args.out}: {merge_command}",
    ]
    script = slurm.job_script(
        f"run.py-{args.script.stem}", head, tasks, ["--", *extra] if extra else [], args, args.cpus_per_task or 1, logs, notes
    )
    if args.dry_run:
        print(script, end="")
        return 0
    job = slurm.submit(script, logs)
    (logs / f"{job}.json").write_text(json.dumps({"job": job, "runs": [str(r.dir) for r in todo]}, indent=1))
    print(
        f"submitted job {job}: {len(todo)} tasks; each task's console in {logs}/{job}_<task>.out, job script {logs}/{job}.sh"
    )
    if args.wait:
        slurm.wait([job])
        return merge(args, runs)
    print(f"when it has ended, copy the rows into {args.out}: {merge_command}")
    return 0


def merge(args, runs: list[Run]) -> int:
    """Copy each finished run's shard into --out, replacing that run's rows there; a run whose rows there are already
    its shard's is left alone, so a second merge writes nothing. Each failed task: one line, with its log."""
    state = slurm_state(args, runs)
    _, existing = common.read_csv(args.out)
    in_out: dict[tuple, list[dict]] = {}
    for row in existing:
        in_out.setdefault(tuple(row[k] for k in common.RUN_KEY), []).append({f: row.get(f, "") for f in common.RESULT_FIELDS})
    merged = rows = same = 0
    for run in state.done:
        header, shard = common.read_csv(run.dir / SHARD)
        if not header:
            continue  # a run the local runner did: its rows went to its --out
        if in_out.get(tuple(str(v) for v in run.key.values())) == [
            {f: r.get(f, "") for f in common.RESULT_FIELDS} for r in shard
        ]:
            same += 1
            continue
        if not args.dry_run:
            common.write_rows(args.out, common.RESULT_FIELDS, shard, replace=run.key)
        merged, rows = merged + 1, rows + len(shard)
    for run, why in state.failed:
        print(f"FAILED  {run}: {why}")
    for run, task in state.queued:
        print(f"queued  {run}: Slurm task {task} is still pending or running")
    for run in state.unsubmitted:
        print(f"missing {run}: not done, and no Slurm task was submitted for it")
    print(
        f"{'would merge' if args.dry_run else 'merged'} {merged} runs ({rows} rows) into {args.out}; {same} already there; "
        f"{len(state.failed)} failed, {len(state.queued)} queued or running, {len(state.unsubmitted)} not submitted"
    )
    if state.failed:
        print(f"to run the failed ones again: {command_line(args, '--slurm')}")
    return 1 if state.failed else 0


def main() -> int:
    args, extra = parse_args(sys.argv[1:])
    runs = plan(args, extra)
    if args.merge:
        return merge(args, runs)
    if args.slurm:
        return submit(args, extra, runs)
    if args.dry_run:
        for run in runs:
            print(f"{'done' if run.done_file.exists() else 'todo'}  {run}  -> {run.dir}")
        return 0
    return Runner(args, extra).run_all(runs)


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

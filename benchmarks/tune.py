r"""Hyperparameter search with Optuna over an algorithm script's real command line.

    python benchmarks/tune.py --algo vmpo_continuous --env dm_control/cartpole/balance --budget 200k --trials 40 --seeds 1 2
    python benchmarks/tune.py --algo vmpo_continuous --suite control --trials 20 --seeds 1 2 [-- fixed script args]
    optuna-dashboard sqlite:///benchmarks/results/tune/<study>/study.db    # the study's plots, live

A trial draws flags from the script's search space (`SPACES`), runs the script once per task and seed in parallel,
and reports each evaluation to Optuna's pruner, which may stop it. The objective: the final deterministic evaluation,
mean over seeds; over several tasks, the geometric mean of each task's return / a reference return. The study lives
in `<out>/study.db` unless `--storage` names another Optuna URL or a journal file; the same command continues it, and
workers with the same command and storage share it (`--slurm N`: N of them as one Slurm array job). A worker that
stops writes `<out>/trials.csv` and `<out>/best_command.txt`; the plots are optuna-dashboard's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import optuna
import tyro
from optuna.storages.journal import JournalFileBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import slurm  # noqa: E402

Error = common.BenchmarkError  # one line on stderr, exit code 1
POLL_SECONDS = 1.0  # how often a running trial's TensorBoard events are read
STOP_SECONDS = 10.0  # grace between terminate and kill of a pruned trial's process
HEARTBEAT, GRACE = 60, 180  # database storages: a trial whose worker died is failed after the grace
FAILURES_IN_A_ROW = 10  # a worker gives up after this many failed trials in a row
SCORE_FLOOR = 0.01  # several tasks: a task's score (return / reference) counts as at least this in the geometric mean
DM_CONTROL_MAX_RETURN = 1000.0  # 1000 steps of a reward in [0, 1]: the reference of a dm_control task without a figure


# --- Search spaces ---------------------------------------------------------------------
# One per script: an Args field -> a list of choices (hidden sizes as "64x64") or a Range (integers where both bounds
# are; log-uniform with log=True). A field the script's Args lacks is left out, and so is --init-log-std where the
# Beta trains (it has no std).
class Range(NamedTuple):
    low: float
    high: float
    log: bool = False


SIZES, LOG_LR = ["64x64", "128x128", "256x256"], Range(3e-5, 3e-3, log=True)
# fmt: off
SPACES: dict[str, dict[str, Range | list]] = {
    "ppo_discrete": {
        "learning_rate": LOG_LR, "anneal_lr": [True, False], "update_epochs": Range(1, 20),
        "num_envs": [4, 8, 16, 32], "num_steps": [8, 16, 32, 64, 128, 256, 512], "num_minibatches": [1, 2, 4, 8, 16],
        "clip_coef": [0.1, 0.2, 0.3, 0.4], "max_grad_norm": [0.3, 0.5, 1.0, 2.0, 5.0],
        "gamma": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999], "gae_lambda": [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0],
        "ent_coef": Range(1e-8, 0.1, log=True), "vf_coef": Range(0.1, 1.0),
        "policy_hidden_sizes": [*SIZES, "64x64x64"], "value_hidden_sizes": [*SIZES, "64x64x64"],
    },
    "ppo_continuous": {
        "learning_rate": LOG_LR, "anneal_lr": [True, False], "update_epochs": Range(1, 20),
        "num_envs": [1, 2, 4, 8, 16], "num_steps": [64, 128, 256, 512, 1024, 2048], "num_minibatches": [1, 2, 4, 8, 16, 32],
        "clip_coef": [0.1, 0.2, 0.3, 0.4], "max_grad_norm": [0.3, 0.5, 1.0, 2.0, 5.0],
        "gamma": [0.95, 0.98, 0.99, 0.995, 0.999], "gae_lambda": [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0],
        "ent_coef": Range(1e-8, 1e-2, log=True), "vf_coef": Range(0.1, 1.0),
        "policy_hidden_sizes": SIZES, "value_hidden_sizes": [*SIZES, "512x512"],
        "init_log_std": Range(-2.0, 0.5), "reward_scaling": [True, False],
    },
    "vmpo_continuous": {
        "policy_lr": LOG_LR, "value_lr": LOG_LR, "anneal_lr": [False, True],
        "temperature_lr": Range(1e-3, 0.1, log=True), "alpha_lr": Range(1e-3, 0.1, log=True),
        "num_envs": [4, 8, 16], "num_steps": [32, 64, 128, 256, 512], "m_steps": [1, 4, 10, 20, 40, 80, 120],
        "num_minibatches": [1, 2, 4, 8, 16],  # all divide every rollout here
        "topk_fraction": Range(0.2, 1.0), "epsilon_eta": Range(0.01, 1.0, log=True),
        "epsilon_mu": Range(1e-3, 0.5, log=True), "epsilon_sigma": Range(1e-5, 1e-2, log=True),
        "gamma": [0.95, 0.98, 0.99, 0.995], "gae_lambda": [0.8, 0.9, 0.95, 0.98, 1.0],
        "policy_hidden_sizes": [*SIZES, "512x512"], "value_hidden_sizes": [*SIZES, "512x512"],
        "ppo_like_backbone": [False, True],
        # departures from the paper
        "m_step": ["seed", "clip"], "m_step_clip": [0.1, 0.2, 0.3], "init_log_std": Range(-2.0, 0.5),
    },
}
# fmt: on


def search_space(algo: str, args: Any) -> dict[str, Range | list]:
    """The script's space for its Args (its defaults, the env and the fixed args after `--`)."""
    policy = getattr(args, "policy", "gaussian")  # auto: the Gaussian on the control suite, the Beta elsewhere
    gaussian = policy == "gaussian" or (policy == "auto" and args.env_id.startswith("dm_control/"))
    return {k: v for k, v in SPACES[algo].items() if hasattr(args, k) and (k != "init_log_std" or gaussian)}


def sample(trial, space: dict[str, Range | list]) -> list[str]:
    """Draw every parameter of `space`; the script's flags (`--num-envs 8 --no-anneal-lr --value-hidden-sizes 64 64`)."""
    out = []
    for name, choices in space.items():
        if isinstance(choices, Range):
            suggest = trial.suggest_int if isinstance(choices.low, int) else trial.suggest_float
            value = suggest(name, choices.low, choices.high, log=choices.log)
        else:
            value = trial.suggest_categorical(name, choices)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            text = f"{value:.4g}" if isinstance(value, float) else str(value)
            out += [flag, *(text.split("x") if name.endswith("hidden_sizes") else [text])]
    return out


# --- Command line and the checks before the first trial --------------------------------
class Task(NamedTuple):
    env: str
    budget: int
    tool_args: list[str]  # script args the tool adds (the evaluation interval)
    base_args: Any  # the script's Args: its defaults, the env, the budget and the fixed args
    reference: float | None  # several tasks: the return that scores 1


def task_means(s, runs: list[SeedRun], values: list[float]) -> dict[str, float]:  # {env: mean over its seeds}
    return {t.env: statistics.fmean(v for r, v in zip(runs, values, strict=True) if r.task is t) for t in s.tasks}


def score(s, runs: list[SeedRun], values: list[float]) -> float:
    """The objective from one value per run: the mean over seeds; over several tasks, the geometric mean of each mean /
    its reference, at least SCORE_FLOOR: a gain counts the same on every task, and a task that fails pulls it down."""
    means = task_means(s, runs, values)
    if len(s.tasks) == 1:
        return means[s.tasks[0].env]
    # LaTeX: J = \Big(\prod_{k=1}^{K} \max\big(R_k / R_k^{\mathrm{ref}},\ 0.01\big)\Big)^{1/K}
    return statistics.geometric_mean(max(means[t.env] / t.reference, SCORE_FLOOR) for t in s.tasks)


def steps_text(n: int) -> str:  # 200000 -> '200k', 1000000 -> '1M', 2048 -> '2048'
    return next((f"{n // size}{unit}" for unit, size in (("M", 10**6), ("k", 10**3)) if n % size == 0), str(n))


def parse_cli(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    own, fixed = common.split_passthrough(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--algo", required=True, help=f"one of {', '.join(SPACES)}, or a path to a script of the same name")
    add("--env", nargs="+", help="env id(s); several: one config scored on all (geometric mean of return / reference)")
    add("--suite", choices=sorted(common.SUITES), help="the tasks and budgets of a named suite (--env / --budget add to it)")
    add("--budget", nargs="+", default=[], help="env steps per run: N for every env and/or ENV=N per env (200k, 1M)")
    add("--reference", nargs="+", default=[], metavar="ENV=R", help="several tasks: the return that scores 1 on ENV")
    add("--trials", type=int, required=True, help="finished trials (complete or pruned) the study should have")
    add("--seeds", nargs="+", type=int, default=[1], help="seeds of each trial, run in parallel (default: 1)")
    add("--storage", help="an Optuna storage URL or a journal file (journal:PATH); default: sqlite:///<out>/study.db")
    add("--study", help="study name (default: <algo>-<env>-<budget>)")
    add("--out", type=Path, help="outputs and trial runs (default: benchmarks/results/tune/<study>/)")
    add("--params", nargs="+", metavar="NAME", help="search only these parameters; the rest keep the script's defaults")
    add("--evals", type=int, default=5, help="evaluations per run, unless the script args set --eval-interval (default: 5)")
    add("--pruner", default="median", help="median (default: after 5 complete trials), none, or threshold:X")
    add("--warmup", help="env steps before a trial can be pruned (default: a third of the longest budget)")
    add("--slurm", type=int, metavar="N", help="submit N workers as one Slurm array job, all on --storage")
    add("--dry-run", action="store_true", help="with --slurm: print the job script, submit nothing")
    slurm.add_options(p, cpus_default="the runs of a trial, tasks x seeds")
    return p.parse_args(own), fixed


def script_args(module, script: Path, argv: list[str], fixed: list[str]):
    """The script's Args through its own parser, then its own checks (`check_args`: the env id too), each failure
    one line. The continuous scripts choose MuJoCo's GL backend first (their check builds an env)."""
    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            args = tyro.cli(module.Args, args=argv, prog=script.name)
        module.check_args(args, *([module.choose_gl_backend(False)] if hasattr(module, "choose_gl_backend") else []))
        return args
    except SystemExit:
        detail = next((ln.strip() for ln in text.getvalue().splitlines()[1:] if ln.strip().strip("-")), "rejected")
        raise Error(f"{script.name} rejects the args after -- ({shlex.join(fixed)}): {detail}") from None
    except Exception as e:  # a ConfigError is the script's own message
        message = str(e) if type(e).__name__ == "ConfigError" else f"{script.name} cannot run {argv[1]!r}: {e!r}"
        raise Error(message) from None


def make_pruner(spec: str, warmup: int):
    if spec in ("median", "none"):
        return optuna.pruners.MedianPruner(n_warmup_steps=warmup) if spec == "median" else optuna.pruners.NopPruner()
    with contextlib.suppress(ValueError):
        if spec.startswith("threshold:") and math.isfinite(lower := float(spec.split(":", 1)[1])):
            return optuna.pruners.ThresholdPruner(lower=lower, n_warmup_steps=warmup)
    raise Error(f"--pruner {spec!r}: use median, none or threshold:X (X a number)")


def setup(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check everything that can be checked without running a trial: the command line, and what a trial
    needs (`tasks`, `space`, `study`, `out`, `storage`, `config`...), all in one namespace."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the trials' environment, before a script is imported
    opts, fixed = parse_cli(argv)
    slurm.validate(opts, opts.slurm is not None)
    if (opts.slurm or 1) < 1 or opts.trials < 1 or opts.evals < 0:
        raise Error("--slurm N and --trials must be at least 1, --evals at least 0")
    if opts.dry_run and opts.slurm is None:
        raise Error("--dry-run prints the Slurm job script: give --slurm N")
    script = common.resolve_script(opts.algo)
    if script.stem not in SPACES:
        raise Error(f"--algo {opts.algo!r}: no search space for {script.stem} (tune.py has {', '.join(SPACES)})")
    common.reject_managed(fixed, ("--env-id", "--seed", "--total-timesteps", "--output-dir"), "tune.py")
    if not opts.env and not opts.suite:
        raise Error("give --env ENV [ENV ...] with --budget, or --suite NAME")
    suite = common.SUITES.get(opts.suite, {})  # the suite's envs and budgets first; --env / --budget ENV=N add to them
    envs = list(dict.fromkeys([*suite, *(opts.env or [])]))
    budgets = common.parse_budgets([*(f"{env}={steps}" for env, steps in suite.items()), *opts.budget], envs)
    references = task_references(opts.reference, envs)
    warmup = opts.warmup or str(max(budgets.values()) // 3)
    opts.warmup = 0 if warmup == "0" else common.parse_steps(warmup)
    opts.pruner = make_pruner(opts.pruner, opts.warmup)  # a bad --pruner fails here
    module = common.load_script(script)
    names = {token[2:].split("=", 1)[0].replace("-", "_") for token in fixed if token.startswith("--")}  # set after --
    fixed_names = {n if n in module.Args.__dataclass_fields__ else n.removeprefix("no_") for n in names}
    tasks = []
    for env_id, budget in budgets.items():
        own = [] if "eval_interval" in fixed_names or not opts.evals else ["--eval-interval", str(budget // opts.evals or 1)]
        base = script_args(module, script, ["--env-id", env_id, "--total-timesteps", str(budget), *own, *fixed], fixed)
        tasks.append(Task(env_id, budget, own, base, references.get(env_id)))

    space = search_space(script.stem, tasks[0].base_args)  # the space follows the script's Args, not the env
    if unknown := sorted(set(opts.params or []) - set(space)):
        raise Error(f"--params {' '.join(unknown)}: not in the search space of {script.stem} ({', '.join(space)})")
    space = {k: v for k, v in space.items() if k in (opts.params or space) and k not in fixed_names}
    if not space:
        raise Error("nothing to search: every parameter is fixed by the script args after --")
    name = "+".join(f"{e}-{steps_text(b)}" for e, b in budgets.items()).replace("/", "-")
    study = opts.study or f"{script.stem}-" + (f"suite-{opts.suite}" if opts.suite and envs == list(suite) else name)
    out = (opts.out or common.ROOT / "benchmarks" / "results" / "tune" / common.slug(study)).resolve()
    storage = opts.storage or f"sqlite:///{out / 'study.db'}"
    if opts.slurm is not None and storage.startswith("sqlite:"):
        raise Error(
            f"--storage {storage}: SQLite's file locks do not hold on the network filesystem the nodes share; use PostgreSQL "
            "(postgresql://USER:PASSWORD@HOST/DB), MySQL (mysql+pymysql://...), or a journal file every node mounts (journal:PATH)"
        )
    opts.__dict__.update(script=script, algo=script.stem, tasks=tasks, seeds=list(dict.fromkeys(opts.seeds)), fixed=fixed)
    opts.__dict__.update(space=space, study=study, out=out, storage=storage, env=env, longest=max(budgets.values()))
    # The runs share the cores unless the user chose otherwise; the scripts' update and EnvPool follow it.
    env.setdefault("OMP_NUM_THREADS", str(max(1, common.cores() // (len(tasks) * len(opts.seeds)))))
    by_env = {t.env: [t.budget, t.reference, t.tool_args] for t in tasks}  # the config a second worker must match:
    opts.config = dict(algo=script.stem, tasks=by_env, seeds=opts.seeds, fixed_args=fixed, searched=sorted(space))
    return opts


def task_references(items: list[str], envs: list[str]) -> dict[str, float]:
    """{env: the return that scores 1} for a study over several tasks: `--reference ENV=R`, else the widely used PPO's
    figure, else 1000 on a dm_control task (its most); {} for one task (its objective is its return)."""
    given = {env: value for env, _, value in (item.rpartition("=") for item in items)}
    if bad := [f"{e}={v}" for e, v in given.items() if e not in envs or not v.replace(".", "", 1).isdigit() or not float(v)]:
        raise Error(f"--reference {bad[0]!r}: give ENV=R with ENV one of the study's envs and R a positive return")
    if len(envs) == 1 and given:
        raise Error("--reference scores a study over several tasks; with one env the objective is its return")
    most = {e: DM_CONTROL_MAX_RETURN for e in envs if e.startswith("dm_control/")}
    references = {e: float(given[e]) if e in given else common.REFERENCE_RETURNS.get(e, most.get(e)) for e in envs}
    if len(envs) > 1 and (missing := [e for e, r in references.items() if r is None]):
        raise Error(f"no reference return for {missing[0]}: give --reference {missing[0]}=R (its score 1)")
    return references if len(envs) > 1 else {}


# --- Storage and study -----------------------------------------------------------------
def journal_path(storage: str) -> str | None:  # journal:PATH -> PATH
    return storage.removeprefix("journal:") if storage.startswith("journal:") else None


def dashboard_command(storage: str) -> str:  # the command that opens the study in optuna-dashboard
    path = journal_path(storage)
    return "optuna-dashboard " + shlex.quote(str(Path(path).resolve()) if path else storage)


def open_study(s: argparse.Namespace):
    """Create or load the study; refuse to join one that was started with another config."""
    path = journal_path(s.storage)
    try:
        if path or s.storage.startswith("sqlite:///"):
            Path(path or s.storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if path:
            storage = optuna.storages.JournalStorage(JournalFileBackend(str(Path(path).resolve())))
        else:  # with heartbeats: the trial of a worker that died is failed after the grace period
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(s.storage, heartbeat_interval=HEARTBEAT, grace_period=GRACE)
    except Exception as e:
        raise Error(f"--storage {s.storage!r}: cannot open it: {str(e).splitlines()[0]}") from None
    sampler = optuna.samplers.TPESampler(constant_liar=True)  # workers spread, not collide
    study = optuna.create_study(
        storage=storage, study_name=s.study, sampler=sampler, pruner=s.pruner, direction="maximize", load_if_exists=True
    )
    stored = study.user_attrs.get("config")
    if stored is None:
        study.set_user_attr("config", s.config)
    elif stored != s.config:
        diff = {k: (stored.get(k), v) for k, v in s.config.items() if stored.get(k) != v}
        raise Error(
            f"study {s.study!r} in {s.storage} was started with another config (stored, now): {diff}; use another --study"
        )
    return study


def count_finished(study) -> int:
    return sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials(deepcopy=False))  # a failed one is retried


# --- One trial: its runs in parallel, their evaluations reported as they appear ---------
class SeedRun:
    """One task and seed of one trial: the script's process, its log, its evaluations read back as they appear."""

    def __init__(self, s: argparse.Namespace, task: Task, trial_dir: Path, seed: int, sampled: list[str]):
        self.task, self.seed, self.reader = task, seed, None
        self.dir = trial_dir / ("" if len(s.tasks) == 1 else common.slug(task.env)) / f"seed{seed}"
        self.dir.mkdir(parents=True)
        command = [sys.executable, str(s.script), "--env-id", task.env, "--seed", str(seed), "--total-timesteps"]
        command += [str(task.budget), "--output-dir", str(self.dir / "tb"), *task.tool_args, *sampled, *s.fixed]
        self.log = open(self.dir / "log.txt", "w")
        self.proc = subprocess.Popen(command, cwd=self.dir, env=s.env, stdout=self.log, stderr=subprocess.STDOUT)

    def evals(self) -> dict[int, float]:  # {step: eval/return_mean} so far; the run directory comes with the writer
        if self.reader is None and (run_dirs := [d for d in (self.dir / "tb").glob("*") if d.is_dir()]):
            self.reader = common.EvalReader(run_dirs[0])
        return {p["step"]: p["eval_return"] for p in self.reader.read()} if self.reader else {}

    def failure(self) -> str:
        tail = " | ".join(ln.strip() for ln in (self.dir / "log.txt").read_text(errors="replace").strip().splitlines()[-8:])
        return f"{self.task.env} seed {self.seed} exited with code {self.proc.returncode} ({self.dir / 'log.txt'}): {tail}"

    def stop(self) -> None:  # terminate, then kill, and wait
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_SECONDS)
        self.proc.kill()  # after it ended: nothing
        self.proc.wait()
        self.log.close()


def slots(s: argparse.Namespace, task: Task, curve: dict[int, float]) -> dict[int, float]:
    """{step: eval} -> {slot: eval}. An evaluation is reported at its slot, the multiple of the interval it follows: the
    scripts evaluate at the first update past each multiple, so batch sizes move the steps, and the median pruner only
    compares values reported at the same step. Slots are on the longest budget's axis (several tasks). The first
    evaluation in a slot wins: a second there is the final one (a budget not a multiple of the batch), at the budget."""
    interval, slotted = task.base_args.eval_interval, {}  # the interval is the same for every trial
    for step in sorted(curve) if interval else []:
        slotted.setdefault(min(task.budget, step // interval * interval) * s.longest // task.budget, curve[step])
    return slotted


def objective(s: argparse.Namespace, trial) -> float:
    """Run one trial: its runs (tasks x seeds) in parallel, each evaluation reported to the pruner once every run has
    made it; the final one at the longest budget. A failed run fails the trial: a NaN value, its error in `error`."""

    def report(step: int, value: float) -> None:
        trial.report(value, step)
        reported.add(step)
        print(f"trial {trial.number}: step {step}: {'eval' if len(s.tasks) == 1 else 'score'} {value:.2f}", flush=True)
        if step < s.longest and trial.should_prune():
            trial.set_user_attr("pruned_at_step", step)
            raise optuna.TrialPruned(f"{value:.2f} at step {step}")

    def fail(error: str) -> float:
        trial.set_user_attr("error", error)
        print(f"trial {trial.number}: failed: {error}", flush=True)
        return math.nan

    sampled, trial_dir, reported, runs = sample(trial, s.space), s.out / "trials" / str(trial.number), set(), []
    trial.set_user_attr("flags", sampled)
    shutil.rmtree(trial_dir, ignore_errors=True)  # left by an older study of the same name
    print(f"trial {trial.number}: start: {shlex.join(sampled)}", flush=True)
    try:
        runs = [SeedRun(s, task, trial_dir, seed, sampled) for task in s.tasks for seed in s.seeds]
        while True:
            done = all(r.proc.poll() is not None for r in runs)  # before reading: no eval is missed
            if failed := [r.failure() for r in runs if r.proc.poll() not in (None, 0)]:
                return fail(failed[0])
            curves = [r.evals() for r in runs]
            slotted = [slots(s, r.task, c) for r, c in zip(runs, curves, strict=True)]
            for slot in sorted(set.intersection(*map(set, slotted)) - reported):
                report(slot, score(s, runs, [c[slot] for c in slotted]))
            if done:
                break
            time.sleep(POLL_SECONDS)
    finally:
        for r in runs:
            r.stop()
    if missing := [f"{r.task.env} seed {r.seed}" for r, c in zip(runs, curves, strict=True) if not c]:
        return fail(f"no eval/return_mean logged by {', '.join(missing)} (in {trial_dir})")
    finals = [curve[max(curve)] for curve in curves]  # each run's last evaluation: the final one
    trial.set_user_attr("task_returns", task_means(s, runs, finals))
    if s.longest not in reported:
        report(s.longest, score(s, runs, finals))
    return score(s, runs, finals)


# --- Outputs: the trials table and the best command (the plots are optuna-dashboard's) --
def atomic_write(path: Path, write) -> None:
    """Write through a temporary file and os.replace, so concurrent workers never leave a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write(tmp := path.with_name(f".{path.name}.{os.getpid()}"))
    os.replace(tmp, path)


def best_commands(s: argparse.Namespace, trial) -> str:
    """The best trial as ready-to-paste command lines: one run of the script, and run.py over its tasks and 2 seeds."""
    args, first = [*trial.user_attrs.get("flags", []), *s.fixed], s.tasks[0]
    one = ["python", os.path.relpath(s.script, common.ROOT), "--env-id", first.env, "--total-timesteps", str(first.budget)]
    budgets = [steps_text(first.budget)] if len(s.tasks) == 1 else [f"{t.env}={steps_text(t.budget)}" for t in s.tasks]
    grid = ["python", "benchmarks/run.py", "--algo", s.algo, "--env", *(t.env for t in s.tasks), "--seeds", "1", "2"]
    grid += ["--budget", *budgets, "--tag", f"{s.study}-trial{trial.number}", "--", *args]
    lines = [f"# best trial {trial.number} of study {s.study}: value {trial.value:.2f}", shlex.join([*one, *args])]
    return "\n".join([*lines, "# the same config with the benchmark runner, 2 seeds", shlex.join(grid), ""])


def write_outputs(s: argparse.Namespace, study) -> None:
    """trials.csv (Optuna's table of the trials, the flags as one command line) and best_command.txt."""
    table = study.trials_dataframe(attrs=("number", "state", "value", "duration", "params", "user_attrs"))
    if "user_attrs_flags" in table:
        table["user_attrs_flags"] = table["user_attrs_flags"].map(lambda f: shlex.join(f) if isinstance(f, list) else "")
    atomic_write(s.out / "trials.csv", lambda tmp: table.to_csv(tmp, index=False))
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    counts = {k: states.count(k) for k in ("COMPLETE", "PRUNED", "FAIL", "RUNNING") if k in states}
    print(f"\nstudy {s.study}: {len(table)} trials (" + ", ".join(f"{n} {k.lower()}" for k, n in counts.items()) + ")")
    if counts.get("COMPLETE"):
        commands = best_commands(s, study.best_trial)
        atomic_write(s.out / "best_command.txt", lambda tmp: tmp.write_text(commands))
        print(commands, end="")
    written = "trials.csv" + (", best_command.txt" if counts.get("COMPLETE") else "")
    print(f"written to {s.out}: {written}; plots: {dashboard_command(s.storage)}", flush=True)


# --- Main ------------------------------------------------------------------------------
def submit_workers(s: argparse.Namespace) -> int:
    """--slurm N: N workers as one array job, each this command without the job's options, all on one study."""
    workers, logs, trials = s.slurm, s.out / "slurm", s.trials
    own = slurm.strip_options(common.split_passthrough(sys.argv[1:])[0], slurm_takes_value=True)
    command = [sys.executable, str(Path(__file__).resolve()), *own, *(["--", *s.fixed] if s.fixed else [])]
    notes = [f"tune.py --slurm {workers}: {workers} workers of the command below; each stops at {trials} finished trials"]
    cpus = s.cpus_per_task or len(s.tasks) * len(s.seeds)
    script = slurm.job_script(f"tune.py-{s.study}", command, [[]] * workers, [], s, cpus, logs, notes)
    if s.dry_run:
        print(script, end="")
        return 0
    study = open_study(s)  # the storage answers, and the study's config is stored or matches, before anything is submitted
    if (finished := count_finished(study)) >= trials:
        print(f"study {s.study} in {s.storage}: {finished} of {trials} trials finished; nothing submitted")
        return 0
    job = slurm.submit(script, logs)
    print(f"submitted job {job}: {workers} workers joining study {s.study} in {s.storage} ({finished} of {trials} finished)")
    print(f"each worker's console in {logs}/{job}_<task>.out; plots, live: {dashboard_command(s.storage)}", flush=True)
    if not s.wait:
        return 0
    slurm.wait([job])
    failed = [i for i in range(workers) if slurm.exit_code(logs, job, i) != 0]
    for i in failed:
        print(f"FAILED  worker {i}: {slurm.task_failure(logs, job, i)}")
    write_outputs(s, study)
    return 1 if failed else 0


def main() -> int:
    s = setup(sys.argv[1:])
    if s.slurm is not None:
        return submit_workers(s)
    study = open_study(s)
    todo = max(0, s.trials - (finished := count_finished(study)))
    print(f"study {s.study} in {s.storage}: {finished} of {s.trials} trials finished (complete or pruned), {todo} to go")
    print(f"plots, live: {dashboard_command(s.storage)}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the running trial fails, its runs stop
    failed: list[bool] = []  # failed trials do not count toward --trials: a setup where every run fails would never end

    def give_up(study, trial) -> None:
        failed.append(trial.state.name == "FAIL")
        if failed[-FAILURES_IN_A_ROW:] == [True] * FAILURES_IN_A_ROW:
            study.stop()

    code = 0
    try:
        if todo:
            counted = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)  # other workers' trials too
            stop_at = optuna.study.MaxTrialsCallback(s.trials, states=counted)
            study.optimize(lambda trial: objective(s, trial), callbacks=[stop_at, give_up])
    except KeyboardInterrupt:
        print("\ninterrupted: the running trial is marked failed; the same command continues the study", flush=True)
        code = 130
    write_outputs(s, study)
    if failed[-FAILURES_IN_A_ROW:] == [True] * FAILURES_IN_A_ROW:  # a broken setup, not bad luck
        print(f"stopped: {FAILURES_IN_A_ROW} trials failed in a row; the last one: {study.trials[-1].user_attrs.get('error')}")
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

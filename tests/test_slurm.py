"""`run.py --slurm` and `tune.py --slurm N`.

Without a cluster (in `make test`): the job script `--dry-run` prints (one array job, one task a selected run, the
cluster options), the storage `tune.py --slurm` refuses (SQLite), options of the job given without `--slurm`.

Marked `slurm` (deselected by pytest.ini; `make test-slurm` starts a one-node Slurm on this machine, runs them and stops
it): jobs submitted to that real cluster. A 2-task array of ppo_discrete.py on CartPole-v1 gives after the merge the
local runner's rows number for number, and a second merge changes nothing; resubmitting the same command submits
nothing; a failed task is reported with its log; `tune.py --slurm 2` completes 4 trials in one study on a journal file.
Where no cluster answers, these tests fail and say so: they are never skipped.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from helpers import ROOT, run_cli

BENCH = ROOT / "benchmarks"
# 512 steps per update, an evaluation at 1024 and the final one at 2048 (as tests/test_benchmarks.py's grid).
SCRIPT_ARGS = ["--num-envs", "4", "--num-steps", "128", "--eval-interval", "1024", "--eval-episodes", "2"]
CONTROL = {  # the control suite: env -> budget (common.SUITES["control"])
    "dm_control/cartpole/balance": 200_000,
    "dm_control/cartpole/swingup": 500_000,
    "dm_control/walker/walk": 1_000_000,
    "dm_control/finger/spin": 500_000,
    "dm_control/ball_in_cup/catch": 500_000,
    "dm_control/hopper/stand": 500_000,
}
SHARED = (
    "use PostgreSQL (postgresql://USER:PASSWORD@HOST/DB), MySQL (mysql+pymysql://...), or a journal file every node mounts"
)


def bench(tool: str, *args, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli(tool, [str(a) for a in args], cwd=cwd, script_dir=BENCH, timeout=timeout)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def array_tasks(script: str) -> list[list[str]]:
    """The per-task arguments of a job script's `case` arms, in task order (checked to be 0, 1, 2, ...)."""
    arms = re.findall(r"^  (\d+)\) task=\((.*)\) ;;$", script, re.M)
    assert [int(i) for i, _ in arms] == list(range(len(arms)))
    return [arm.split() for _, arm in arms]


def array_size(script: str) -> int:
    (last,) = re.findall(r"^#SBATCH --array=0-(\d+)$", script, re.M)  # one array job
    return int(last) + 1


# ---------------------------------------------------------------------------------------
# Without a cluster
# ---------------------------------------------------------------------------------------
def test_dry_run_prints_one_array_job_of_a_task_a_selected_run(tmp_path):
    """The README's control-suite command (6 tasks x 5 seeds): 30 tasks, each the runner on one run at its budget, its
    rows to its own shard; a run already done is not among them; the cluster's options are in the script; a valid
    bash script on stdout alone, and nothing written."""
    out = tmp_path / "results" / "ppo_continuous.csv"
    command = ["--algo", "ppo_continuous", "--suite", "control", "--seeds", 11, 12, 13, 14, 15, "--tag", "defaults"]
    command += ["--out", out, "--slurm", "--dry-run"]
    proc = bench("run.py", *command, "--partition", "gpu", "--time", "2:00:00", "--cpus-per-task", 2,
                 "--gpus-per-task", 1, "--sbatch-args=--account=lab --qos=long")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert script.startswith("#!/bin/bash\n") and script.count("#SBATCH --array=") == 1
    assert array_size(script) == 30 and "30 runs: 0 already done, 0 queued or running in Slurm, 30 to submit" in proc.stderr
    tasks = array_tasks(script)
    work = out.parent / "ppo_continuous_runs" / "ppo_continuous" / "defaults"
    shard = "{}/{}/seed{}-{}/rows.csv"
    expected = [  # longest first, as the local runner
        [
            f"--env={env}",
            f"--seeds={seed}",
            f"--budget={budget}",
            "--out=" + shard.format(work, env.replace("/", "-"), seed, budget),
        ]
        for env, budget in sorted(CONTROL.items(), key=lambda e: -e[1])
        for seed in (11, 12, 13, 14, 15)
    ]
    assert tasks == expected
    for option in ["--partition=gpu", "--time=2:00:00", "--cpus-per-task=2", "--gres=gpu:1", "--account=lab --qos=long"]:
        assert f"\n#SBATCH {option}\n" in script, option
    runner = f"{sys.executable} {BENCH / 'run.py'} --algo={ROOT / 'ppo_continuous.py'} --tag=defaults "
    assert f'\n{runner}--work-dir={out.parent / "ppo_continuous_runs"} --jobs=1 "${{task[@]}}"\n' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not out.parent.exists(), "a dry run writes nothing"

    done = work / "dm_control-walker-walk" / "seed13-1000000"  # a finished run is not submitted again
    done.mkdir(parents=True)
    key = {"algo": "ppo_continuous", "tag": "defaults", "env": "dm_control/walker/walk", "seed": 13, "budget": 1_000_000}
    (done / "done.json").write_text(json.dumps({**key, "extra_args": []}))
    proc = bench("run.py", *command)
    assert proc.returncode == 0, proc.stderr
    assert array_size(proc.stdout) == 29 and array_tasks(proc.stdout) == [
        t for t in expected if t[3] != f"--out={done}/rows.csv"
    ]


def test_tune_dry_run_prints_n_workers_of_the_same_command(tmp_path):
    journal = tmp_path / "study.log"
    command = ["--algo", "ppo_discrete", "--env", "CartPole-v1", "--budget", 2048, "--trials", 10, "--seeds", 1, 2]
    command += ["--storage", f"journal:{journal}", "--out", tmp_path / "out"]
    proc = bench("tune.py", *command, "--slurm", 3, "--time=30", "--dry-run", "--", "--eval-episodes", 2)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert array_size(script) == 3 and array_tasks(script) == []
    assert "\n#SBATCH --cpus-per-task=2\n" in script and "\n#SBATCH --time=30\n" in script  # a CPU per run of a trial
    worker = f"{sys.executable} {BENCH / 'tune.py'} " + " ".join(map(str, command)) + " -- --eval-episodes 2"
    assert f"\n{worker}\n" in script  # every worker: the command without the Slurm options
    assert not journal.exists() and not (tmp_path / "out").exists(), "a dry run creates no study and writes nothing"


def test_the_cluster_commands_of_the_benchmarks_readme(tmp_path, monkeypatch):
    """benchmarks/README.md's "On a cluster" commands: each script's submission, under its defaults' tag, is one array
    job of a task a run the local runner would run (44: the 22-task table on seeds 1-2), its merge is the same selection,
    the report reads the merged CSVs; the tune.py search is N workers of the command without --slurm, and its report command is that
    command."""
    text = (BENCH / "README.md").read_text().split("## On a cluster\n", 1)[1].split("\n## ", 1)[0]
    runs, search = re.findall(r"```bash\n(.*?)```", text, re.S)
    submit, merge, report = runs.splitlines()
    loop = r"for run in (.+); do set -- \$run; python benchmarks/run\.py (.+); done"
    (pairs, submit_args), (merge_pairs, merge_args) = re.fullmatch(loop, submit).groups(), re.fullmatch(loop, merge).groups()
    monkeypatch.syspath_prepend(str(BENCH))
    from report import BASE_TAGS  # each script's defaults' tag

    assert pairs == merge_pairs == " ".join(f'"{algo} {tag}"' for algo, tag in BASE_TAGS.items())
    assert merge_args == submit_args.replace(" --slurm --time 1:00:00", " --merge") != submit_args
    assert report == "python benchmarks/report.py benchmarks/results/{ppo_continuous,vmpo_continuous,anchors}.csv --out report"
    for algo, tag in BASE_TAGS.items():
        args = [*submit_args.replace("$1", algo).replace("$2", tag).split(), "--out", tmp_path / f"{algo}.csv", "--dry-run"]
        local = bench("run.py", *[a for a in args if a not in ("--slurm", "--time", "1:00:00")], cwd=ROOT)
        job = bench("run.py", *args, cwd=ROOT)
        assert local.returncode == 0 and job.returncode == 0, local.stderr + job.stderr
        todo = re.findall(rf"^todo  \S+ \[{re.escape(tag)}\] (\S+) seed (\d+) \((\d+) steps\)", local.stdout, re.M)
        assert len(todo) == 44 and array_size(job.stdout) == 44
        assert sorted(todo) == sorted((t[0][6:], t[1][8:], t[2][9:]) for t in array_tasks(job.stdout))
        assert "\n#SBATCH --time=1:00:00\n" in job.stdout

    first, _, third = [" ".join(c.split()) for c in search.replace("\\\n", " ").split("\n") if c.strip()]
    assert first.startswith("python benchmarks/tune.py ") and third.split(" #")[0] == first.replace(
        " --slurm 8 --time 12:00:00", ""
    )
    proc = bench("tune.py", *first.split()[2:], "--dry-run", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert array_size(proc.stdout) == 8 and "\n#SBATCH --time=12:00:00\n" in proc.stdout
    worker = f"{sys.executable} {BENCH / 'tune.py'} " + third.split(" #")[0].split(" ", 2)[2]
    assert f"\n{worker}\n" in proc.stdout


@pytest.mark.parametrize("storage", [None, "sqlite:////nfs/tune/study.db", "sqlite://"])
def test_tune_refuses_sqlite_for_workers_on_several_nodes(tmp_path, storage):
    """The nodes share a network filesystem, where SQLite's file locks do not hold: Optuna would take the file and the
    workers could corrupt or split the study. The default storage is SQLite too."""
    command = ["--algo", "ppo_discrete", "--env", "CartPole-v1", "--budget", 2048, "--trials", 4, "--out", tmp_path / "out"]
    proc = bench("tune.py", *command, *(["--storage", storage] if storage else []), "--slurm", 2, cwd=tmp_path)
    (line,) = proc.stderr.strip().splitlines()
    expected = storage or f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    assert proc.returncode == 1 and line.startswith(f"error: --storage {expected}: SQLite's file locks"), proc.stderr
    assert SHARED in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("**/study.*")), "nothing is created or submitted"


@pytest.mark.parametrize(
    "tool, args, flags",
    [
        ("run.py", ["--partition", "gpu", "--time", "1:00:00"], "--partition --time"),
        ("tune.py", ["--trials", "1", "--wait"], "--wait"),
    ],
)
def test_options_of_the_job_without_slurm_are_one_line(tmp_path, tool, args, flags):
    proc = bench(tool, "--algo", "ppo_discrete", "--env", "CartPole-v1", "--budget", 2048, *args, "--out", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: {flags}: options of the Slurm job, given without --slurm"
    ]


# ---------------------------------------------------------------------------------------
# On a real cluster (make test-slurm)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """The cluster answers and its node takes jobs; otherwise the test fails and says why (never a skip)."""
    if not shutil.which("sbatch"):
        pytest.fail("no sbatch on this machine: these tests submit to a real Slurm; run them with `make test-slurm`")
    proc = subprocess.run(["sinfo", "--noheader", "--format", "%T"], capture_output=True, text=True, timeout=60)
    states = proc.stdout.split()
    if proc.returncode != 0 or not set(states) & {"idle", "mixed", "allocated"}:
        pytest.fail(
            f"no Slurm node takes jobs (sinfo: exit code {proc.returncode}, {proc.stderr.strip().splitlines()[-1:] or states}; "
            f"SLURM_CONF={os.environ.get('SLURM_CONF')}): run these tests with `make test-slurm`"
        )


def active(job: str) -> bool:
    proc = subprocess.run(["squeue", "--noheader", "--array", "--format", "%i"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return any(line.split("_")[0] == job for line in proc.stdout.split())


def wait_for_job(job: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while active(job):
        assert time.time() < deadline, f"job {job} still in the queue after {timeout} s"
        time.sleep(1)


def submitted_job(stdout: str) -> str:
    (job,) = re.findall(r"^submitted job (\d+): ", stdout, re.M)
    return job


def own_script(tmp_path: Path) -> Path:
    """ppo_discrete.py as committed here, in a git repository of its own: the test's numbers do not move when someone
    edits the working tree's script meanwhile, and the rows still name a commit."""
    repo = tmp_path / "code"
    repo.mkdir()
    shutil.copy(ROOT / "ppo_discrete.py", repo)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "ppo_discrete.py"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True)
    return repo / "ppo_discrete.py"


@pytest.fixture(scope="module")
def array(cluster, tmp_path_factory):
    """The same 2 runs (seeds 1 and 2, 2048 steps) through the local runner and as a 2-task array job, then merged."""
    tmp = tmp_path_factory.mktemp("array")
    script = own_script(tmp)
    grid = ["--algo", script, "--env", "CartPole-v1", "--seeds", 1, 2, "--budget", 2048]
    local = bench("run.py", *grid, "--out", tmp / "local.csv", "--jobs", 2, "--", *SCRIPT_ARGS)
    assert local.returncode == 0, local.stdout + local.stderr
    command = [*grid, "--out", tmp / "slurm" / "results.csv", "--slurm", "--", *SCRIPT_ARGS]
    submitted = bench("run.py", *command)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted_job(submitted.stdout)
    wait_for_job(job)
    merge = [a if a != "--slurm" else "--merge" for a in command]
    merged = bench("run.py", *merge)
    return tmp, command, merge, job, submitted, merged


@pytest.mark.slurm
def test_array_job_rows_equal_the_local_runners_and_a_second_merge_changes_nothing(array):
    tmp, _, merge, job, submitted, merged = array
    assert "2 runs: 0 already done, 0 queued or running in Slurm, 2 to submit" in submitted.stdout
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 2 runs (4 rows) into" in merged.stdout and "0 failed, 0 queued or running, 0 not submitted" in merged.stdout
    logs = tmp / "slurm" / "results_runs" / "slurm"
    assert [(logs / f"{job}_{task}.rc").read_text().strip() for task in (0, 1)] == ["0", "0"]

    local, slurm = read_csv(tmp / "local.csv"), read_csv(tmp / "slurm" / "results.csv")
    assert list(slurm[0]) == list(local[0])

    def numbers(rows):  # every column but the wall time, which no two runs share
        return sorted(({k: v for k, v in r.items() if k != "wall_time"} for r in rows), key=lambda r: (r["seed"], r["step"]))

    assert len(slurm) == 4 and numbers(slurm) == numbers(local)
    assert {r["seed"] for r in slurm} == {"1", "2"} and {r["step"] for r in slurm} == {"1024", "2048"}
    for row in slurm:  # each shard's rows carry their source: a commit (clean: the script's own repository), blob, hash
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]) and re.fullmatch(r"[0-9a-f]{40}", row["script"]), row
        assert re.fullmatch(r"[0-9a-f]{10}", row["args_hash"]) and row["versions"].startswith("torch="), row
    shards = sorted((tmp / "slurm" / "results_runs").glob("**/rows.csv"))  # one a task, merged as they are
    assert len(shards) == 2 and [r for shard in shards for r in read_csv(shard)] == slurm

    out = tmp / "slurm" / "results.csv"
    before = (out.read_bytes(), out.stat().st_mtime_ns)
    again = bench("run.py", *merge)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "merged 0 runs (0 rows) into" in again.stdout and "; 2 already there;" in again.stdout
    assert (out.read_bytes(), out.stat().st_mtime_ns) == before, "a second merge must change nothing"


@pytest.mark.slurm
def test_resubmitting_the_same_command_submits_nothing(array, tmp_path):
    tmp, command, _, _, _, _ = array
    logs = tmp / "slurm" / "results_runs" / "slurm"
    files = sorted(logs.iterdir())
    proc = bench("run.py", *command)  # every run done
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 runs: 2 already done, 0 queued or running in Slurm, 0 to submit" in proc.stdout
    assert "nothing submitted" in proc.stdout and "submitted job" not in proc.stdout
    assert sorted(logs.iterdir()) == files, "no job script, no job"

    # Runs still queued (a held job: it stays pending) are not submitted twice either; cancelled, they are failed tasks.
    held = ["--algo", own_script(tmp_path), "--env", "CartPole-v1", "--seeds", 1, 2, "--budget", 1024]
    held += ["--out", tmp_path / "r.csv", "--slurm"]
    proc = bench("run.py", *held, "--sbatch-args=--hold")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_job(proc.stdout)
    try:
        again = bench("run.py", *held)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "2 runs: 0 already done, 2 queued or running in Slurm, 0 to submit" in again.stdout
        assert "nothing submitted" in again.stdout and len(list((tmp_path / "r_runs" / "slurm").glob("*.sh"))) == 1
    finally:
        subprocess.run(["scancel", job], check=True, timeout=60)
    wait_for_job(job)
    merge = bench("run.py", *[a if a != "--slurm" else "--merge" for a in held])
    lines = [line for line in merge.stdout.splitlines() if line.startswith("FAILED")]
    assert merge.returncode == 1 and len(lines) == 2, merge.stdout
    for task, line in enumerate(lines):
        assert f"Slurm task {job}_{task} ended without an exit code (cancelled" in line
        assert f"log {tmp_path / 'r_runs' / 'slurm' / f'{job}_{task}.out'}" in line


@pytest.mark.slurm
def test_a_failed_task_is_reported_with_its_log(cluster, tmp_path):
    """One run of the array fails (an env id the script rejects), the other finishes: one line for the failed task
    names its run and its log, the finished run is merged, and the same command would submit only the failed one."""
    command = ["--algo", "ppo_discrete", "--env", "NoSuchEnv-v0", "CartPole-v1", "--budget", 512, "--out", tmp_path / "r.csv"]
    script_args = ["--", "--eval-episodes", 1]
    proc = bench("run.py", *command, "--slurm", "--wait", *script_args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    job = submitted_job(proc.stdout)
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    run = tmp_path / "r_runs" / "ppo_discrete" / "eval-episodes-1" / "NoSuchEnv-v0" / "seed1-512"
    log = run / "log.txt"
    assert line.startswith(
        f"FAILED  ppo_discrete [eval-episodes 1] NoSuchEnv-v0 seed 1 (512 steps): Slurm task {job}_0 exit code 1"
    )
    assert f"log {log} (Slurm's output: {tmp_path / 'r_runs' / 'slurm' / f'{job}_0.out'})" in line
    last = [ln.strip() for ln in log.read_text().splitlines() if ln.strip()][-1]
    assert line.endswith(f": {last}") and "NoSuchEnv-v0" in last
    assert "merged 1 runs (1 rows)" in proc.stdout and "1 failed, 0 queued or running" in proc.stdout
    assert {r["env"] for r in read_csv(tmp_path / "r.csv")} == {"CartPole-v1"}

    retry = bench("run.py", *command, "--slurm", "--dry-run", *script_args)
    assert retry.returncode == 0, retry.stderr
    assert "2 runs: 1 already done, 0 queued or running in Slurm, 1 to submit (1 of them failed before)" in retry.stderr
    assert array_tasks(retry.stdout) == [["--env=NoSuchEnv-v0", "--seeds=1", "--budget=512", f"--out={run}/rows.csv"]]


@pytest.mark.slurm
def test_tune_with_two_workers_completes_4_trials_in_one_study_on_a_journal_file(cluster, tmp_path):
    journal = tmp_path / "shared" / "study.log"
    command = ["--algo", "ppo_discrete", "--env", "CartPole-v1", "--budget", 2048, "--evals", 2, "--params", "learning_rate"]
    command += ["--trials", 4, "--storage", f"journal:{journal}", "--study", "slurm", "--out", tmp_path / "out"]
    proc = bench("tune.py", *command, "--slurm", 2, "--wait", "--", "--eval-episodes", 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_job(proc.stdout)
    logs = tmp_path / "out" / "slurm"
    assert [(logs / f"{job}_{task}.rc").read_text().strip() for task in (0, 1)] == ["0", "0"]
    started = [
        {int(n) for n in re.findall(r"^trial (\d+): start:", (logs / f"{job}_{task}.out").read_text(), re.M)}
        for task in (0, 1)
    ]
    assert all(started) and not started[0] & started[1], f"both workers run trials, none twice: {started}"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="slurm", storage=storage).get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == sorted(started[0] | started[1])
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert 4 <= len(complete) <= 5, [t.state.name for t in trials]  # each worker stops at 4; the other may finish one more
    assert len({t.params["learning_rate"] for t in complete}) == len(complete)
    assert f"study slurm: {len(trials)} trials ({len(complete)} complete" in proc.stdout
    assert len(read_csv(tmp_path / "out" / "trials.csv")) == len(trials)

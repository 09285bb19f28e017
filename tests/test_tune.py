"""The Optuna search tool (`benchmarks/tune.py`) through its real command line, with real
Optuna storages and the real `ppo_discrete.py` on CartPole-v1 at tiny budgets: two workers
sharing one study, which the optuna-dashboard command it prints opens; pruning that ends a run
early; resuming a killed study; a crashed run failing only its trial; bad input as one line;
the files it writes; and every draw of each script's search space a command line the script accepts."""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from helpers import ROOT, read_scalars, run_cli, single_run_dir

TUNE = ROOT / "benchmarks" / "tune.py"
BUDGET = 2048
# Only the learning rate is searched: the script's 16 envs x 16 steps stay, 8 updates per run;
# evaluations at 1024 and 2048 (--evals 2), 2 episodes each.
SEARCH = [
    "--algo",
    "ppo_discrete",
    "--env",
    "CartPole-v1",
    "--budget",
    str(BUDGET),
    "--evals",
    "2",
    "--params",
    "learning_rate",
]
SCRIPT_ARGS = ["--", "--eval-episodes", "2"]


def tune(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(TUNE.name, [str(a) for a in args], script_dir=TUNE.parent, timeout=timeout)


def start_tune(*args, log: Path) -> subprocess.Popen:
    """The tool in the background, its console output (stdout and stderr) in ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, str(TUNE), *map(str, args)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def study_trials(storage, name: str) -> list:
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def states(trials) -> list[str]:
    return [t.state.name for t in sorted(trials, key=lambda t: t.number)]


def processes_under(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` (a trial's runs are started with it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if str(path) in text and "pytest" not in text:
            found.append(text)
    return found


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_workers_share_one_study_and_write_the_outputs(tmp_path):
    journal = tmp_path / "shared" / "study.log"
    command = [
        *SEARCH,
        "--trials",
        3,
        "--storage",
        f"journal:{journal}",
        "--study",
        "shared",
        "--out",
        tmp_path / "out",
        *SCRIPT_ARGS,
    ]
    logs = [tmp_path / "worker0.txt", tmp_path / "worker1.txt"]
    workers = [start_tune(*command, log=log) for log in logs]
    for w, log in zip(workers, logs, strict=True):
        assert w.wait(timeout=300) == 0, log.read_text()

    started = [
        {
            int(line.split()[1].rstrip(":"))
            for line in log.read_text().splitlines()
            if line.startswith("trial ") and ": start:" in line
        }
        for log in logs
    ]
    assert all(started), f"each worker should run trials, got {started}"
    assert not started[0] & started[1], f"a trial number ran in both workers: {started}"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = study_trials(storage, "shared")
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and set(numbers) == started[0] | started[1]
    assert states(trials).count("COMPLETE") >= 3  # the workers overshoot by at most one trial each
    for t in trials:  # each trial's run wrote its own events, its final evaluation is the objective
        scalars = read_scalars(single_run_dir(tmp_path / "out" / "trials" / str(t.number) / "seed1" / "tb"))
        assert scalars["eval/return_mean"][-1] == (BUDGET, pytest.approx(t.value))

    out = tmp_path / "out"
    rows = read_csv(out / "trials.csv")  # Optuna's table of the trials
    assert [int(r["number"]) for r in rows] == sorted(numbers)
    assert [float(r["value"]) for r in rows] == pytest.approx([t.value for t in sorted(trials, key=lambda t: t.number)])
    assert all(r["user_attrs_flags"] == f"--learning-rate {float(r['params_learning_rate']):.4g}" for r in rows), rows
    top = max(t.value for t in trials)
    best = [t for t in trials if t.value == top]  # ties are likely at this budget
    commands = (out / "best_command.txt").read_text()
    assert any(f"--total-timesteps {BUDGET} {' '.join(t.user_attrs['flags'])} --eval-episodes 2" in commands for t in best), (
        commands
    )
    assert "benchmarks/run.py --algo ppo_discrete" in commands

    # The plots: the command the tool prints opens the study in optuna-dashboard, every trial's evaluations in it.
    (command,) = {line.split("plots, live: ", 1)[1] for line in logs[0].read_text().splitlines() if "plots, live: " in line}
    assert command == f"optuna-dashboard {journal}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    executable = Path(sys.executable).with_name("optuna-dashboard")
    dashboard = subprocess.Popen([str(executable), *shlex.split(command)[1:], "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/api/studies"
        wait_for(lambda: reachable(url), 60, "optuna-dashboard to answer")
        (summary,) = json.load(urllib.request.urlopen(url))["study_summaries"]
        assert summary["study_name"] == "shared"
        served = json.load(urllib.request.urlopen(f"{url}/{summary['study_id']}?after=0"))["trials"]
        curves = {t["number"]: {v["step"]: v["value"] for v in t["intermediate_values"]} for t in served}
        assert curves == {t.number: pytest.approx(t.intermediate_values) for t in trials}
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except OSError:
        return False
    return True


def test_pruned_trial_ends_its_run_early(tmp_path):
    budget = 40_000  # far more than the run reaches before its first evaluation is read back
    proc = tune(
        "--algo",
        "ppo_discrete",
        "--env",
        "CartPole-v1",
        "--budget",
        budget,
        "--evals",
        40,
        "--params",
        "learning_rate",
        "--trials",
        1,
        "--out",
        tmp_path,
        "--pruner",
        "threshold:1000",
        "--warmup",
        0,
        *SCRIPT_ARGS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial,) = study_trials(f"sqlite:///{tmp_path / 'study.db'}", "ppo_discrete-CartPole-v1-40k")
    assert trial.state.name == "PRUNED" and trial.user_attrs["pruned_at_step"] == 1000
    run = single_run_dir(tmp_path / "trials" / "0" / "seed1" / "tb")
    last_step = max(step for points in read_scalars(run).values() for step, _ in points)
    assert 1000 <= last_step < budget // 2, f"the pruned run went on to step {last_step}"
    assert not processes_under(tmp_path / "trials"), "the pruned run's process is still alive"
    assert read_csv(tmp_path / "trials.csv")[0]["state"] == "PRUNED"
    assert f"written to {tmp_path}: trials.csv; plots: optuna-dashboard" in proc.stdout  # no complete trial: no best command
    assert not (tmp_path / "best_command.txt").exists()


def test_killed_study_resumes(tmp_path):
    command = [*SEARCH, "--trials", 2, "--out", tmp_path, *SCRIPT_ARGS]
    storage, name = f"sqlite:///{tmp_path / 'study.db'}", "ppo_discrete-CartPole-v1-2048"
    log = tmp_path / "first.txt"
    first = start_tune(*command, log=log)
    try:  # kill it while trial 1 runs, after trial 0 has finished
        wait_for(lambda: "trial 1: start" in log.read_text(), 240, "trial 1 to start")
        time.sleep(1)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert first.returncode == 130 and "interrupted" in log.read_text(), log.read_text()
    assert states(study_trials(storage, name)) == ["COMPLETE", "FAIL"]
    assert not processes_under(tmp_path / "trials"), "the interrupted trial's run is still alive"
    value0 = study_trials(storage, name)[0].value

    proc = tune(*command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 of 2 trials finished (complete or pruned), 1 to go" in proc.stdout
    trials = sorted(study_trials(storage, name), key=lambda t: t.number)
    assert states(trials) == ["COMPLETE", "FAIL", "COMPLETE"] and trials[0].value == value0
    assert [r["state"] for r in read_csv(tmp_path / "trials.csv")] == ["COMPLETE", "FAIL", "COMPLETE"]

    proc = tune(*command)  # done: nothing runs, the outputs are written again
    assert proc.returncode == 0 and "2 of 2 trials finished (complete or pruned), 0 to go" in proc.stdout
    assert len(study_trials(storage, name)) == 3

    other = [*command[:-1], "1"]  # --eval-episodes 1: another config under the same (default) study name
    proc = tune(*other)
    assert proc.returncode == 1 and "was started with another config" in proc.stderr and "Traceback" not in proc.stderr
    assert "use another --study" in proc.stderr and len(study_trials(storage, name)) == 3


def test_crashed_run_fails_its_trial_and_the_study_goes_on(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="crash", direction="maximize")
    study.enqueue_trial({"num_steps": 512})  # 16 envs x 512 steps: one batch is more than the budget, exit 1
    study.enqueue_trial({"num_steps": 16})
    proc = tune(
        "--algo",
        "ppo_discrete",
        "--env",
        "CartPole-v1",
        "--budget",
        BUDGET,
        "--evals",
        2,
        "--params",
        "num_steps",
        "--trials",
        1,
        "--storage",
        storage,
        "--study",
        "crash",
        "--out",
        tmp_path,
        *SCRIPT_ARGS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed, complete = sorted(study_trials(storage, "crash"), key=lambda t: t.number)
    assert (failed.state.name, failed.params) == ("FAIL", {"num_steps": 512})
    assert (
        "exited with code 1" in failed.user_attrs["error"]
        and "--total-timesteps must be at least one batch" in failed.user_attrs["error"]
    )
    assert (complete.state.name, complete.params) == ("COMPLETE", {"num_steps": 16}) and complete.value > 0
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"trial 0: failed: {failed.user_attrs['error']}" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo", "ppo_nothing", "--env", "CartPole-v1"], "--algo 'ppo_nothing': no script at"),
        (["--algo", "ppo_discrete", "--env", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
        (
            ["--algo", "ppo_discrete", "--env", "CartPole-v1", "--params", "learning_rat"],
            "--params learning_rat: not in the search space of ppo_discrete (learning_rate, ",
        ),
        (["--algo", "ppo_discrete", "--env", "CartPole-v1", "--pruner", "median:3"], "--pruner 'median:3': use"),
        (["--algo", "ppo_discrete", "--env", "CartPole-v1", "--storage", "study.db"], "--storage 'study.db': cannot open it"),
        # the Beta trains off the control suite under --policy auto: it has no std to search
        (
            ["--algo", "ppo_continuous", "--env", "Pendulum-v1", "--params", "init_log_std"],
            "--params init_log_std: not in the search space of ppo_continuous",
        ),
        # several tasks
        (
            ["--algo", "ppo_discrete", "--env", "CartPole-v1", "Acrobot-v1"],
            "no reference return for CartPole-v1: give --reference",
        ),
        (
            ["--algo", "ppo_discrete", "--env", "CartPole-v1", "Acrobot-v1", "--reference", "Pendulum-v1=3"],
            "--reference 'Pendulum-v1=3': give ENV=R with ENV one of the study's envs",
        ),
        (
            ["--algo", "ppo_discrete", "--env", "CartPole-v1", "--reference", "CartPole-v1=500"],
            "--reference scores a study over",
        ),
        (
            ["--algo", "ppo_discrete", "--env", "CartPole-v1", "Acrobot-v1", "--budget", "CartPole-v1=2048"],
            "no --budget for ['Acrobot-v1']",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    budget = [] if "--budget" in args else ["--budget", BUDGET]
    proc = tune(*args, *budget, "--trials", 1, "--out", tmp_path / "out")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "out").exists(), "nothing may start before the input is checked"


def test_several_tasks_are_scored_together(tmp_path):
    """One config on two tasks at two budgets: every task x seed runs, the objective is the geometric mean
    of each task's final return (mean over seeds) over its reference, recomputed here from the events."""
    tasks = {"CartPole-v1": 2048, "Probe4Discrete-v0": 1024}
    references = {"CartPole-v1": 100.0, "Probe4Discrete-v0": 2.0}
    proc = tune(
        "--algo",
        "ppo_discrete",
        "--env",
        *tasks,
        "--budget",
        *(f"{env}={steps}" for env, steps in tasks.items()),
        "--reference",
        *(f"{env}={r}" for env, r in references.items()),
        "--seeds",
        1,
        2,
        "--evals",
        2,
        "--params",
        "learning_rate",
        "--trials",
        1,
        "--out",
        tmp_path,
        "--pruner",
        "none",
        *SCRIPT_ARGS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial,) = study_trials(f"sqlite:///{tmp_path / 'study.db'}", "ppo_discrete-CartPole-v1-2048+Probe4Discrete-v0-1024")
    assert trial.state.name == "COMPLETE"
    logs, finals = {}, {}
    for env, budget in tasks.items():
        for seed in (1, 2):
            scalars = read_scalars(single_run_dir(tmp_path / "trials" / "0" / env / f"seed{seed}" / "tb"))
            curve = scalars["eval/return_mean"]
            assert [step for step, _ in curve] == [budget // 2, budget], f"{env}: evaluations at {curve}"
            logs[env, seed], finals[env, seed] = curve, curve[-1][1]
    means = {env: (finals[env, 1] + finals[env, 2]) / 2 for env in tasks}
    scores = [max(means[env] / references[env], 0.01) for env in tasks]
    assert trial.value == pytest.approx((scores[0] * scores[1]) ** 0.5)
    assert trial.user_attrs["task_returns"] == pytest.approx(means)
    # The halfway evaluations of both tasks (steps 1024 and 512) share one slot, on the longest budget's axis.
    halfway = {env: (logs[env, 1][0][1] + logs[env, 2][0][1]) / 2 for env in tasks}
    expected_half = math.sqrt(math.prod(max(halfway[env] / references[env], 0.01) for env in tasks))
    assert trial.intermediate_values == pytest.approx({1024: expected_half, 2048: trial.value})

    commands = (tmp_path / "best_command.txt").read_text()
    assert "--env CartPole-v1 Probe4Discrete-v0 --seeds 1 2 --budget CartPole-v1=2048 Probe4Discrete-v0=1024" in commands


@pytest.mark.parametrize(
    "algo, env_id, policy, gaussian",
    [
        ("ppo_discrete", "CartPole-v1", None, False),
        ("ppo_continuous", "dm_control/walker/walk", "auto", True),
        ("ppo_continuous", "Pendulum-v1", "auto", False),
        ("ppo_continuous", "Pendulum-v1", "gaussian", True),
        ("vmpo_continuous", "dm_control/walker/walk", "beta", False),
        ("vmpo_continuous", "Pendulum-v1", "gaussian", True),
    ],
)
def test_every_draw_of_a_search_space_is_a_command_line_the_script_accepts(algo, env_id, policy, gaussian):
    """Random draws of each script's space, as the flags a trial passes, go through the script's own parser and its
    checks; --init-log-std is drawn only where the Gaussian trains (the scripts refuse it for the Beta)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import common
    import tune
    import tyro

    module = common.load_script(common.resolve_script(algo))
    base = ["--env-id", env_id, *(["--policy", policy] if policy else [])]
    space = tune.search_space(algo, tyro.cli(module.Args, args=base))
    assert ("init_log_std" in space) == gaussian and set(space) <= set(module.Args.__dataclass_fields__)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        args = tyro.cli(module.Args, args=[*base, *tune.sample(trial, space)])
        module.check_args(args, *([None] if algo != "ppo_discrete" else []))  # raises the script's own error
        for name, value in trial.params.items():
            expected = tuple(int(w) for w in value.split("x")) if name.endswith("hidden_sizes") else value
            assert getattr(args, name) == (pytest.approx(value, rel=1e-3) if isinstance(value, float) else expected), name

"""The benchmark tools through their real command lines: the grid runner (rows, resume,
redo of an unfinished run), the report (numbers checked against an independent
computation, PNGs read back) and the throughput tool (both SPS figures and their ratio)."""

from __future__ import annotations

import csv
import hashlib
import json
import pstats
import re
import shutil
import statistics
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, read_scalars, run_cli, single_run_dir

BENCH = ROOT / "benchmarks"
BUDGET = 2048
# 512 steps per update, an evaluation at 1024 and the final one at 2048.
SCRIPT_ARGS = ["--num-envs", "4", "--num-steps", "128", "--eval-interval", "1024", "--eval-episodes", "2"]
TAG = "num-envs 4 num-steps 128 eval-interval 1024 eval-episodes 2"


def bench(tool: str, *args: str, cwd=None):
    return run_cli(tool, [str(a) for a in args], cwd=cwd, script_dir=BENCH, timeout=300)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """ppo_discrete on CartPole-v1, seeds 1 and 2, 2048 steps, 2 parallel jobs."""
    out = tmp_path_factory.mktemp("bench") / "results" / "ppo_discrete.csv"
    command = [
        "--algo",
        "ppo_discrete",
        "--env",
        "CartPole-v1",
        "--seeds",
        "1",
        "2",
        "--budget",
        "2048",
        "--out",
        out,
        "--jobs",
        "2",
        "--",
        *SCRIPT_ARGS,
    ]
    proc = bench("run.py", *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {
        seed: out.parent
        / "ppo_discrete_runs"
        / "ppo_discrete"
        / TAG.replace(" ", "-")
        / "CartPole-v1"
        / f"seed{seed}-{BUDGET}"
        for seed in (1, 2)
    }
    return out, command, runs


def test_runner_writes_one_row_per_evaluation(grid):
    out, _, runs = grid
    rows = read_csv(out)
    fields = ["algo", "tag", "env", "seed", "budget", "step", "wall_time", "eval_return", "eval_std", "train_return"]
    assert list(rows[0]) == [*fields, "backend", "cpu", "commit", "script", "args_hash", "versions"]
    assert {r["backend"] for r in rows} == {"gymnasium"}  # ppo_discrete.py has no --env-backend: gymnasium's envs
    cpus = {r["cpu"] for r in rows}
    assert len(cpus) == 1 and cpus.pop(), cpus
    if (cpuinfo := Path("/proc/cpuinfo")).exists():
        assert re.search(rf"^model name\s*: {re.escape(rows[0]['cpu'])}$", cpuinfo.read_text(), re.M)
    for seed, run in runs.items():
        mine = [r for r in rows if r["seed"] == str(seed)]
        assert {(r["algo"], r["tag"], r["env"], r["budget"]) for r in mine} == {("ppo_discrete", TAG, "CartPole-v1", "2048")}
        scalars = read_scalars(single_run_dir(run / "tb"))  # independent read-back of the run's events
        assert [int(r["step"]) for r in mine] == [s for s, _ in scalars["eval/return_mean"]] == [1024, 2048]
        for r, (_, mean), (_, std) in zip(mine, scalars["eval/return_mean"], scalars["eval/return_std"], strict=True):
            assert float(r["eval_return"]) == pytest.approx(mean, abs=1e-3)
            assert float(r["eval_std"]) == pytest.approx(std, abs=1e-3)
            ended = [v for step, v in scalars["charts/episodic_return"] if step <= int(r["step"])][-10:]
            assert len(ended) == 10 and float(r["train_return"]) == pytest.approx(sum(ended) / 10, abs=1e-3)
        walls = [float(r["wall_time"]) for r in mine]
        assert 0 < walls[0] < walls[1] < json.loads((run / "done.json").read_text())["seconds"]
    assert len(rows) == 4


def git_out(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


# The args that do not enter the hash (benchmarks/README.md): the row's own columns, and what does not change learning.
UNHASHED = {"seed", "env_id", "total_timesteps", "env_backend", "exp_name", "output_dir", "track", "wandb_project_name"}
UNHASHED |= {"wandb_entity", "capture_video", "eval_interval", "eval_episodes", "checkpoint", "eval_only", "resume"}
UNHASHED |= {"torch_threads", "cuda"}


def expected_args_hash(run_dir: Path) -> str:
    """The hash written out: sha256 of the sorted JSON of every other field of the checkpoint's args, as text."""
    import torch

    args = torch.load(run_dir / "ppo_discrete_last.pt", weights_only=True)["args"]
    text = {k: str(tuple(v) if isinstance(v, list) else v) for k, v in args.items() if k not in UNHASHED}
    return hashlib.sha256(json.dumps(text, sort_keys=True).encode()).hexdigest()[:10]


def package_versions() -> str:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    return " ".join(f"{name}={version(name)}" for name in ("torch", "numpy", "gymnasium", "mujoco", "dm_control", "envpool"))


def test_runner_records_where_each_row_comes_from(grid):
    """Every row names the commit it ran at (with -dirty when tracked files had changes), the script's blob, the hash of
    the args its run recorded in its checkpoint (the same for both seeds: seed, budget and env are columns of their
    own), and the package versions; done.json keeps the same source for a read-back."""
    out, _, runs = grid
    rows = read_csv(out)
    commit = git_out("rev-parse", "HEAD") + (
        "-dirty" if git_out("--no-optional-locks", "status", "--porcelain", "-uno") else ""
    )
    assert {r["commit"] for r in rows} == {commit}
    (script,) = {r["script"] for r in rows}  # the exact blob is checked on a script of the test's own (below), since
    assert re.fullmatch(r"[0-9a-f]{40}", script)  # another engineer may edit ppo_discrete.py while this runs
    assert {r["versions"] for r in rows} == {package_versions()}
    hashes = {}
    for seed, run in runs.items():
        (hashes[seed],) = {r["args_hash"] for r in rows if r["seed"] == str(seed)}
        assert hashes[seed] == expected_args_hash(single_run_dir(run / "tb")), seed
        source = json.loads((run / "done.json").read_text())["source"]
        assert source == {"commit": commit, "script": script, "versions": package_versions()}
    assert hashes[1] == hashes[2]


def test_args_hash_leaves_out_what_does_not_change_learning(common):
    args = {"seed": 1, "env_id": "CartPole-v1", "gamma": 0.99, "hidden_sizes": (64, 64), "output_dir": "a"}
    same = {**args, "seed": 2, "env_id": "Acrobot-v1", "output_dir": "b", "eval_interval": 5, "torch_threads": 3}
    assert common.args_hash(args) == common.args_hash(same) == common.args_hash({**args, "hidden_sizes": [64, 64]})
    assert common.args_hash({**args, "gamma": 0.98}) != common.args_hash(args)
    assert common.args_hash({**args, "max_episode_steps": 100}) != common.args_hash(args)  # it ends episodes


def test_runner_records_the_commit_of_a_script_outside_the_repository(grid, tmp_path):
    """`--algo PATH` to a script in another repository (a patch screened in a worktree): that repository's commit, with
    -dirty since the script has uncommitted changes, and the patched file's blob; its args hash is the grid's (same
    args; the budget is a column of its own)."""
    repo = tmp_path / "patch"
    repo.mkdir()
    shutil.copy(ROOT / "ppo_discrete.py", repo)
    git_out("init", "-q", cwd=repo)
    git_out("add", "ppo_discrete.py", cwd=repo)
    git_out("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base", cwd=repo)
    head = git_out("rev-parse", "HEAD", cwd=repo)
    script = repo / "ppo_discrete.py"
    script.write_text(script.read_text() + "# a patch\n")
    data = script.read_bytes()
    blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    out = tmp_path / "r.csv"
    proc = bench(
        "run.py", "--algo", script, "--env", "CartPole-v1", "--budget", 1024, "--out", out, "--tag", TAG, "--", *SCRIPT_ARGS
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_csv(out)
    assert {(r["commit"], r["script"]) for r in rows} == {(head + "-dirty", blob)}
    assert {r["args_hash"] for r in rows} == {r["args_hash"] for r in read_csv(grid[0])}


@pytest.fixture
def common(monkeypatch):
    """benchmarks/common.py, imported with benchmarks/ on sys.path for this test (so report.py imports too)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    return common


def test_runner_reads_the_runs_hyperparameters_back(grid, common):
    _, _, runs = grid
    for seed, run in runs.items():
        table = common.read_hyperparameters(single_run_dir(run / "tb"))
        assert (table["seed"], table["total_timesteps"], table["env_id"]) == (str(seed), str(BUDGET), "CartPole-v1")
        assert "env_backend" not in table  # what run.py's backend column falls back from


def test_config_tag_names_options_without_dashes_and_keeps_a_numbers_sign(common):
    assert common.config_tag(None, ["--init-log-std", "-0.5", "--no-norm-obs"]) == "init-log-std -0.5 no-norm-obs"
    assert common.config_tag(None, ["--init-log-std", "-0.5"]) != common.config_tag(None, ["--init-log-std", "0.5"])
    assert common.config_tag("mine", ["--rpo-alpha", "0"]) == "mine"
    assert common.config_tag(None, []) == common.DEFAULT_TAG


def test_results_file_of_an_older_version_gains_the_new_columns_empty(tmp_path, common):
    path = tmp_path / "old.csv"
    path.write_text(RESULT_HEADER.strip() + ",train_return\n" + "ppo_continuous,defaults,Ant-v5,1,100,100,5,-3.5,1,-4\n")
    source = ["abc-dirty", "b" * 40, "0123456789", "torch=1"]
    new = dict(
        zip(
            common.RESULT_FIELDS,
            ["vmpo_continuous", "defaults", "Ant-v5", 1, 100, 100, 6, 2.5, 1, 2, "envpool", "X", *source],
            strict=True,
        )
    )
    common.write_rows(path, common.RESULT_FIELDS, [new])
    rows = read_csv(path)
    assert list(rows[0]) == list(common.RESULT_FIELDS)
    assert [(r["algo"], r["eval_return"], r["train_return"], r["backend"], r["cpu"]) for r in rows] == [
        ("ppo_continuous", "-3.5", "-4", "", ""),
        ("vmpo_continuous", "2.5", "2", "envpool", "X"),
    ]
    # the old row's source was never recorded: empty in the file, `unknown` to the tools
    assert [[r[f] for f in common.SOURCE_FIELDS] for r in common.read_results([path])] == [["unknown"] * 4, source]
    path.write_text("algo,return\nppo_continuous,1\n")  # not an older results file: refused, unchanged
    with pytest.raises(common.BenchmarkError, match="has columns"):
        common.write_rows(path, common.RESULT_FIELDS, [new])
    assert path.read_text() == "algo,return\nppo_continuous,1\n"


def test_runner_resumes_and_redoes_an_unfinished_run(grid):
    out, command, runs = grid
    done = {seed: run / "done.json" for seed, run in runs.items()}
    mtimes = {p: p.stat().st_mtime_ns for p in [out, *done.values()]}
    rows_before = read_csv(out)

    proc = bench("run.py", *command)  # everything finished: nothing runs, nothing is rewritten
    assert proc.returncode == 0, proc.stderr
    assert "2 already done, 0 to run" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes

    # Seed 2 as if killed after writing its rows but before being marked done, with a leftover file.
    done[2].unlink()
    (runs[2] / "leftover").write_text("half-finished")
    proc = bench("run.py", *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 already done, 1 to run" in proc.stdout
    assert done[1].stat().st_mtime_ns == mtimes[done[1]] and done[2].exists()
    assert not (runs[2] / "leftover").exists(), "an unfinished run must be redone from scratch"
    rows = read_csv(out)
    assert [r for r in rows if r["seed"] == "1"] == [r for r in rows_before if r["seed"] == "1"]
    assert [r["step"] for r in rows if r["seed"] == "2"] == ["1024", "2048"], "redone run's rows must not duplicate"


def test_runner_evaluates_each_finished_run_again_on_more_episodes(grid):
    out, command, runs = grid
    again = [*command[: command.index("--")], "--final-episodes", "3", *command[command.index("--") :]]
    proc = bench("run.py", *again)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    finals = read_csv(out.with_name("ppo_discrete_final.csv"))
    rows = read_csv(out)
    assert sorted(r["seed"] for r in finals) == ["1", "2"]
    for final in finals:
        returns = [float(x) for x in final["returns"].split()]
        assert len(returns) == int(final["episodes"]) == 3 and final["step"] == "2048"
        assert float(final["return_mean"]) == pytest.approx(statistics.fmean(returns), abs=1e-3)
        source = {k: {r[k] for r in rows if r["seed"] == final["seed"]} for k in ("commit", "script", "args_hash")}
        assert {k: {final[k]} for k in source} == source  # the row names the code of the run it evaluated
        # The script's own --eval-only on the same checkpoint, from the command line, prints the same mean.
        checkpoint = single_run_dir(runs[int(final["seed"])] / "tb") / "ppo_discrete_last.pt"
        flags = ["--eval-only", "--checkpoint", checkpoint, "--eval-episodes", "3", "--output-dir", out.parent / "again"]
        printed = run_cli("ppo_discrete.py", [str(f) for f in flags])
        assert f"return {statistics.fmean(returns):.2f} " in printed.stdout, printed.stdout + printed.stderr
    stamp = out.with_name("ppo_discrete_final.csv").stat().st_mtime_ns
    proc = bench("run.py", *again)  # every run has its row: nothing is evaluated again
    assert proc.returncode == 0 and "final " not in proc.stdout, proc.stdout + proc.stderr
    assert out.with_name("ppo_discrete_final.csv").stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPole-v1", "Acrobot-v1", "--budget", "CartPole-v1=1000"], "no --budget for ['Acrobot-v1']"),
        (["--env", "CartPole-v1", "--budget", "10x"], "'10x' is not a positive whole number"),
        (["--env", "CartPole-v1", "--budget", "1000", "--", "--seed", "3"], "--seed is set by run.py"),
    ],
)
def test_runner_bad_input_is_one_line(tmp_path, args, message):
    proc = bench("run.py", "--algo", "ppo_discrete", "--out", tmp_path / "r.csv", *args)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and line.startswith("error: ") and message in line
    assert not (tmp_path / "r.csv").exists()


def test_runner_suite_names_the_control_grid_and_takes_more_envs(tmp_path):
    proc = bench("run.py", "--algo", "vmpo_continuous", "--suite", "control", "--env", "Hopper-v5", "--budget",
                 "Hopper-v5=300k", "--seeds", "1", "2", "--out", tmp_path / "r.csv", "--dry-run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = re.findall(r"todo  vmpo_continuous \[default\] (\S+) seed (\d) \((\d+) steps\)", proc.stdout)
    budgets = {"cartpole/balance": 200_000, "cartpole/swingup": 500_000, "walker/walk": 1_000_000, "finger/spin": 500_000}
    budgets |= {"ball_in_cup/catch": 500_000, "hopper/stand": 500_000}
    expected = {(f"dm_control/{task}", seed, str(steps)) for task, steps in budgets.items() for seed in "12"}
    assert set(runs) == expected | {("Hopper-v5", seed, "300000") for seed in "12"} and len(runs) == 14
    proc = bench("run.py", "--algo", "vmpo_continuous", "--seeds", "1", "--out", tmp_path / "r.csv")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: give --env ENV [ENV ...] or --suite NAME"


def synthetic_results(path):
    """Two configs x two envs x three seeds, final evaluation not the best one, rows out of order."""
    header = "algo,tag,env,seed,budget,step,wall_time,eval_return,eval_std\n"
    lines = []
    finals = {}
    for a, (algo, tag) in enumerate([("ppo_continuous", "default"), ("vmpo_continuous", "lr 3e-4")]):
        for e, env in enumerate(["dm_control/cartpole/balance", "CartPole-v1"]):
            for seed in (1, 2, 3):
                final = 100.0 * seed + 37.25 * a - 11.5 * e
                finals[(env, algo, tag)] = finals.get((env, algo, tag), []) + [final]
                for step, ret in [(1000, final + 500), (3000, final), (2000, final - 50)]:
                    wall = step / 1000 * (40 + 10 * seed + a)
                    lines.append(f"{algo},{tag},{env},{seed},3000,{step},{wall},{ret},1.5\n")
    path.write_text(header + "".join(lines))
    return finals


def table_rows(md: str) -> dict[tuple, list[str]]:
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]
    assert cells[1][0].startswith("---")
    return {tuple(c[:3]): c for c in cells[2:]}


def test_report_table_and_curves(tmp_path):
    finals = synthetic_results(tmp_path / "a.csv")
    proc = bench("report.py", tmp_path / "a.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    assert md in proc.stdout
    rows = table_rows(md)
    assert set(rows) == set(finals)
    for (env, algo, tag), values in finals.items():
        row = rows[(env, algo, tag)]
        mean, std = statistics.fmean(values), statistics.pstdev(values)
        assert row[3:7] == ["3,000", "1, 2, 3", f"{mean:.1f} ± {std:.1f}", " / ".join(f"{v:.1f}" for v in values)]
        assert row[7] == "3,000"
        a = 0 if algo == "ppo_continuous" else 1
        wall = statistics.fmean(3 * (40 + 10 * s + a) for s in (1, 2, 3))  # 180 + 3a seconds
        assert row[8] == f"{int(round(wall)) // 60}m{int(round(wall)) % 60:02d}s"
        assert row[9] == "-"  # these rows have no train_return column
    assert rows[("CartPole-v1", "ppo_continuous", "default")][5] == "188.5 ± 81.6"  # written out once by hand

    import matplotlib.image

    pngs = sorted((tmp_path / "report" / "curves").glob("*.png"))
    assert [p.name for p in pngs] == ["curves_CartPole-v1.png", "curves_dm_control-cartpole-balance.png"]
    for png in pngs:
        image = matplotlib.image.imread(png)
        assert image.shape[0] >= 300 and image.shape[1] >= 800 and png.stat().st_size > 20_000
        assert image[..., :3].std() > 0.05, f"{png} looks blank"


RESULT_HEADER = "algo,tag,env,seed,budget,step,wall_time,eval_return,eval_std\n"


def final_evaluation_rows(tmp_path: Path, episodes: dict) -> tuple[dict, str]:
    """report.py on walker/walk `_final.csv` rows (tag -> each run's episode returns): the final-evaluation section's
    rows by (env, algo, tag), and the section."""
    synthetic_results(tmp_path / "a.csv")
    env, fields = "dm_control/walker/walk", "algo,tag,env,seed,budget,step,episodes,return_mean,return_std,returns"
    lines = [f"{fields},commit,script,args_hash,versions"]
    for tag, runs in episodes.items():
        for seed, returns in enumerate(runs, start=101):
            cells = ["vmpo_continuous", tag, env, seed, 1000000, 1000000, 10, np.mean(returns), np.std(returns)]
            lines.append(",".join(map(str, [*cells, " ".join(map(str, returns)), "c0ffee", "b10b", f"h-{tag[:3]}", "v"])))
    (tmp_path / "a_final.csv").write_text("\n".join(lines) + "\n")
    proc = bench("report.py", tmp_path / "a.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    section = proc.stdout[proc.stdout.index("Final evaluations") :]
    return table_rows(section[: section.index("Power")]), section


def test_report_compares_final_evaluations_with_the_defaults_and_says_its_power(tmp_path):
    env = "dm_control/walker/walk"
    episodes = {  # tag -> each run's episode returns; a run succeeds from every start when 9 of its 10 reach 700
        "defaults-abc": [[950.0] * 10, [950.0] * 8 + [100.0] * 2, [800.0] * 9 + [50.0], [600.0] * 10],
        "bigger critic": [[990.0] * 10, [980.0] * 10, [700.0] * 9 + [0.0], [940.0] * 9 + [300.0]],
    }
    rows, section = final_evaluation_rows(tmp_path, episodes)
    base, other = (np.array([np.mean(r) for r in episodes[t]]) for t in episodes)
    assert rows[env, "vmpo_continuous", "defaults-abc"][5:10] == [
        "10",
        f"{base.mean():.1f} ± {base.std(ddof=1):.1f}",
        rows[env, "vmpo_continuous", "defaults-abc"][7],
        "2/4",
        "base",
    ]
    cell = rows[env, "vmpo_continuous", "bigger critic"]
    assert cell[8] == "4/4" and cell[10] == "h-big"
    diff, lo, hi = map(float, re.fullmatch(r"([-+][\d.]+) \[([-\d.]+), ([-\d.]+)\]", cell[9]).groups())
    assert diff == pytest.approx(other.mean() - base.mean(), abs=0.05) and lo < diff < hi
    # Power at 4 runs a side: (z_0.975 + z_0.8) sqrt(2/4) of the base's std; the count at its share of 2/4.
    z = statistics.NormalDist().inv_cdf(0.975) + statistics.NormalDist().inv_cdf(0.8)
    assert f"mean of {z * np.sqrt(2 / 4) * base.std(ddof=1):.1f} " in section
    assert f"difference of {z * np.sqrt(2 * 0.5 * 0.5 * 4):.1f} in the runs" in section


def test_final_evaluations_compare_with_todays_defaults_over_an_older_defaults_tag(tmp_path, common):
    """Where the script's `BASE_TAGS` tag ran, it is the base, though an older `defaults*` tag has more runs."""
    from report import BASE_TAGS

    today = BASE_TAGS["vmpo_continuous"]
    episodes = {"defaults-abc": [[500.0] * 10] * 4, today: [[800.0] * 10, [900.0] * 10], "candidate": [[700.0] * 10] * 2}
    rows, _ = final_evaluation_rows(tmp_path, episodes)
    env = "dm_control/walker/walk"
    assert rows[env, "vmpo_continuous", today][9] == "base"
    assert rows[env, "vmpo_continuous", "candidate"][9].startswith("-150.0 [")  # 700 against 850, not against 500
    assert rows[env, "vmpo_continuous", "defaults-abc"][9].startswith("-350.0 [")


def run_lines(algo: str, tag: str, env: str, seed: int, budget: int, final: float) -> list[str]:
    """One run's rows: a better evaluation halfway, then the final one (the aggregate must take the final)."""
    return [
        f"{algo},{tag},{env},{seed},{budget},{budget // 2},10,{final * 3},1\n",
        f"{algo},{tag},{env},{seed},{budget},{budget},20,{final},1\n",
    ]


def trimmed_iqm(scores) -> float:
    """The interquartile mean written out: sort, drop a quarter of the runs at each end, average the rest."""
    x = np.sort(np.asarray(scores, float).ravel())
    cut = len(x) // 4
    return float(x[cut : len(x) - cut].mean())


SHORT = {"cartpole/balance": (200_000, 509.0), "cartpole/swingup": (500_000, 849.0), "walker/walk": (1_000_000, 543.2)}
SHORT |= {"finger/spin": (500_000, 553.3), "ball_in_cup/catch": (500_000, 619.9)}


def test_report_aggregates_normalised_scores_with_an_iqm_and_a_profile(tmp_path):
    """Config A: 4 seeds on every short-suite task; B: 3 seeds on one task, 4 elsewhere (it enters with 3 per task);
    C lacks a task (left out). The IQM is checked against a trimmed mean written out here, and B's interval against a
    report of B's runs alone: a row's interval does not move with the rows beside it."""
    lines, b_lines, expected = [], [], {"A": [], "B": []}
    for t, (task, (budget, bar)) in enumerate(SHORT.items()):
        for tag in ("A", "B", "C"):
            if tag == "C" and task == "walker/walk":
                continue
            seeds = (1, 2, 3) if tag == "B" and task == "finger/spin" else (1, 2, 3, 4)
            for seed in seeds:
                final = bar * (0.5 + 0.11 * seed**3 + 0.09 * t + (0.3 if tag == "A" else 0.0))  # skewed: IQM < mean
                run = run_lines("vmpo_continuous", tag, f"dm_control/{task}", seed, budget, final)
                lines += run
                b_lines += run if tag == "B" else []
                if tag == "A" or (tag == "B" and seed <= 3):
                    expected[tag].append(final / bar)
    (tmp_path / "s.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "s.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    assert "table22: no algo/tag has runs at 1M on all 22 tasks" in md  # none ran the 22-task table
    rows = [line for line in md.splitlines() if line.startswith("| short |")]
    assert [r.split(" | ")[2] for r in rows] == ["A", "B"]  # C ran four of the five tasks
    for row, tag in zip(rows, ("A", "B"), strict=True):
        cells = row.strip("| ").split(" | ")
        scores = sorted(expected[tag])
        iqm = trimmed_iqm(scores)
        assert cells[3:5] == (["4", "20"] if tag == "A" else ["3", "15"])
        point, lo, hi = (float(x) for x in re.findall(r"[\d.]+", cells[5]))
        assert abs(iqm - sum(scores) / len(scores)) > 0.1  # so the check below tells the IQM from the mean
        assert point == pytest.approx(iqm, abs=1e-3) and lo <= point <= hi and hi - lo > 0.01
        assert float(cells[6]) == pytest.approx(sum(scores) / len(scores), abs=1e-3)
    (tmp_path / "b.csv").write_text(RESULT_HEADER + "".join(b_lines))
    proc = bench("report.py", tmp_path / "b.csv", "--out", tmp_path / "report_b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alone = [line for line in (tmp_path / "report_b" / "results.md").read_text().splitlines() if line.startswith("| short |")]
    assert alone == rows[1:]
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "report" / "profile_short.png")
    assert image.shape[1] >= 700 and image[..., :3].std() > 0.05


def test_report_table22_over_the_published_8m_figures(tmp_path):
    """table22: A (4 seeds) and B (3 seeds, 2 on one task: it enters with 2) ran all 22 tasks at 1M; C ran
    one task at 500k only (left out). Scores are finals over RPO's 8M figure; the count compares seed means with PPO's."""
    # The (PPO 8M, RPO 8M) means as reference.md prints them, so the report's figures are checked against that page.
    section = (BENCH / "results" / "reference.md").read_text().split("## CleanRL's published 8M figures")[1]
    published = {
        task: (float(ppo), float(rpo))
        for task, ppo, rpo in re.findall(r"^\| dm_control/(\S+) \| ([\d.]+) ± [\d.]+ \| ([\d.]+) ± [\d.]+ \|$", section, re.M)
    }
    assert len(published) == 22
    lines, finals = [], {"A": [], "B": []}  # finals[tag]: per task, the finals of the seeds that enter
    for t, (task, (_, rpo)) in enumerate(published.items()):
        for tag, seeds in [("A", (1, 2, 3, 4)), ("B", (1, 2) if task == "walker/run" else (1, 2, 3)), ("C", (1, 2))]:
            budget = 500_000 if tag == "C" and task == "fish/swim" else 1_000_000
            # Skewed over seeds and tasks (IQM < mean), some tasks above PPO's figure and some below for A and B.
            values = [rpo * (0.1 + 0.01 * s**3 + 2 * (t / 21) ** 3 + (0.2 if tag == "A" else 0.0)) for s in seeds]
            for seed, final in zip(seeds, values, strict=True):
                lines += run_lines("ppo_continuous", tag, f"dm_control/{task}", seed, budget, final)
            if tag != "C":
                finals[tag].append(values[: 4 if tag == "A" else 2])
    (tmp_path / "t.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "t.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| table22 |")]
    assert [r.split(" | ")[2] for r in rows] == ["A", "B"]  # C has fish/swim at 500k, not 1M
    ppo, rpo = np.array(list(published.values())).T
    for row, tag in zip(rows, ("A", "B"), strict=True):
        cells = row.strip("| ").split(" | ")
        x = np.array(finals[tag]).T  # (seeds, tasks)
        scores = x / rpo
        assert cells[3:5] == (["4", "88"] if tag == "A" else ["2", "44"])
        point, lo, hi = (float(v) for v in re.findall(r"[\d.]+", cells[5]))
        assert abs(trimmed_iqm(scores) - scores.mean()) > 0.1  # so the check below tells the IQM from the mean
        assert point == pytest.approx(trimmed_iqm(scores), abs=1e-3) and lo <= point <= hi and hi - lo > 0.01
        assert float(cells[6]) == pytest.approx(scores.mean(), abs=1e-3)
        at_or_above = sum(m >= p for m, p in zip(x.mean(axis=0), ppo, strict=True))
        assert 0 < at_or_above < 22 and cells[7] == f"{at_or_above}/22"
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "report" / "profile_table22.png")
    assert image.shape[1] >= 700 and image[..., :3].std() > 0.05


def table30_runs(tag: str, control_level: float | None, mujoco_values, common) -> tuple[list[str], list[list[float]]]:
    """A config's result rows on the 30 tasks (no control rows when `control_level` is None; no rows for a MuJoCo task
    whose `mujoco_values(t, env)` is None) and its (task, seed) scores in the report's task order."""
    random, lines, scores = common.random_returns(), [], []
    if control_level is not None:
        for t, (env, (_, rpo)) in enumerate(common.PUBLISHED_8M.items()):
            values = [control_level + 0.3 * s**2 * (t % 5 - 2) / 22 for s in (1, 2)]  # spread over tasks and seeds
            for seed, v in zip((1, 2), values, strict=True):
                lines += run_lines("vmpo_continuous", tag, env, seed, 1_000_000, v * rpo)
            scores.append(values)
    for t, ((env, budget), bar) in enumerate(common.MUJOCO_BARS.items()):
        values = mujoco_values(t, env)
        if values is None:
            continue
        for seed, v in zip((1, 2), values, strict=True):
            lines += run_lines("vmpo_continuous", tag, env, seed, budget, random[env] + v * (bar - random[env]))
        scores.append(list(values))
    return lines, scores


def test_report_applies_the_30_task_rule(tmp_path, common):
    """The 30-task rule: A qualifies; B's 22-task IQM is under 0.75; C has a MuJoCo task whose mean score is under 0.2
    (one seed above it); D lacks Swimmer (left out). Scores, IQMs and the verdicts are computed here independently."""
    lines, scores = [], {}
    for tag, level in (("A", 0.9), ("B", 0.6), ("C", 0.9), ("D", 0.9)):

        def mujoco(t, env, tag=tag):
            if tag == "D" and env == "Swimmer-v5":
                return None
            return (0.1, 0.25) if tag == "C" and env == "Hopper-v5" else (0.5 + 0.1 * t, 0.3 + 0.1 * t)

        tag_lines, scores[tag] = table30_runs(tag, level, mujoco, common)
        lines += tag_lines
    (tmp_path / "r.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "r.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| table30 |")]
    assert [r.split(" | ")[2] for r in rows] == ["A", "B", "C"]
    for row, tag in zip(rows, ("A", "B", "C"), strict=True):
        cells = row.strip("| ").split(" | ")
        x = np.array(scores[tag])  # (30 tasks, 2 seeds)
        assert cells[3:5] == ["2", "60"]
        point, lo, hi = (float(v) for v in re.findall(r"[\d.]+", cells[5]))
        assert point == pytest.approx(trimmed_iqm(x), abs=1e-3) and lo <= point <= hi
        assert float(cells[6]) == pytest.approx(x.mean(), abs=1e-3)
        control_iqm = trimmed_iqm(x[:22])
        assert float(cells[7]) == pytest.approx(control_iqm, abs=1e-3)
        task_means = x[22:].mean(axis=1)
        lowest = int(task_means.argmin())
        assert cells[8] == f"{list(common.MUJOCO_BARS)[lowest][0]} {task_means[lowest]:.2f}"
        assert cells[9] == ("yes" if control_iqm >= 0.75 and task_means[lowest] >= 0.2 else "no")
    assert [r.strip("| ").split(" | ")[9] for r in rows] == ["yes", "no", "no"]  # the fixture covers each verdict


def test_report_pairs_each_config_with_todays_defaults_by_task_and_seed(tmp_path, common):
    """The paired section: A and B against the base tag on the 30 tasks. A leads by a constant 0.05 on every control score
    (its mean difference's interval is that constant) and passes the guard; B falls to 0.5 on Hopper-v5 (under 0.8) and
    fails it, naming the task. The IQM difference is checked against a trimmed mean written out here, and the interval
    against a bootstrap written out here (each task's seeds resampled alike for both arms)."""
    from report import BASE_TAGS

    base_tag = BASE_TAGS["vmpo_continuous"]

    lines, scores = [], {}
    for tag, shift, hopper in ((base_tag, 0.0, None), ("A", 0.05, None), ("B", 0.0, (0.5, 0.5))):

        def mujoco(t, env, hopper=hopper):
            return hopper if hopper and env == "Hopper-v5" else (0.9 + 0.1 * t, 1.0 + 0.05 * t)

        tag_lines, scores[tag] = table30_runs(tag, 0.9 + shift, mujoco, common)
        lines += tag_lines
    (tmp_path / "r.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "r.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    rows = {tuple(r.strip("| ").split(" | ")[:2]): r.strip("| ").split(" | ") for r in md.splitlines() if "| vmpo" in r}
    rows = {k: v for k, v in rows.items() if k[0] in ("table22", "mujoco", "table30") and len(v) == 9}
    assert sorted(rows) == sorted((s, f"vmpo_continuous [{t}]") for s in ("table22", "mujoco", "table30") for t in "AB")
    base = np.array(scores[base_tag]).T  # (seeds, tasks)
    rng = np.random.default_rng(0)
    for (suite, name), cells in rows.items():
        x = np.array(scores[name[-2]]).T
        columns = {"table22": slice(0, 22), "mujoco": slice(22, 30), "table30": slice(0, 30)}[suite]
        x, y = x[:, columns], base[:, columns]
        assert cells[2] == f"vmpo_continuous [{base_tag}]" and cells[3] == "2"
        assert cells[4] == f"{trimmed_iqm(x):.3f} / {trimmed_iqm(y):.3f}"
        point, lo, hi = (float(v) for v in re.findall(r"[-+][\d.]+", cells[5]))
        assert point == pytest.approx(trimmed_iqm(x) - trimmed_iqm(y), abs=1e-3)
        picks = rng.integers(0, 2, size=(4000, 2, x.shape[1]))
        draws = [trimmed_iqm(np.take_along_axis(x, d, 0)) - trimmed_iqm(np.take_along_axis(y, d, 0)) for d in picks]
        assert lo == pytest.approx(np.percentile(draws, 2.5), abs=0.02) and hi == pytest.approx(
            np.percentile(draws, 97.5), abs=0.02
        )
        if name.endswith("[A]") and suite == "table22":
            assert cells[6] == "+0.050 [+0.050, +0.050]" and cells[7] == "22 / 0"
    assert rows[("table30", "vmpo_continuous [A]")][8] == "passes"
    assert rows[("table30", "vmpo_continuous [B]")][8] == "fails (Hopper-v5 0.50)"
    assert rows[("table22", "vmpo_continuous [B]")][8] == "-"


def test_report_sets_the_anchors_beside_todays_defaults(tmp_path, common):
    """CleanRL's anchors in a CSV of their own: RPO on the 22 control tasks, PPO on the 8 MuJoCo tasks, two scripts whose
    learning codes differ. table22 lists RPO, table30 lists PPO with RPO's control runs (not refused as mixed code), the
    paired section sets today's defaults against each on its suite, and the wall-time section gives ours over theirs.
    An anchor's runs of an older tag (a schedule since corrected) are listed and compared with nothing."""
    from report import ANCHOR_TAG, BASE_TAGS

    base_tag = BASE_TAGS["vmpo_continuous"]
    ours, scores = table30_runs(base_tag, 0.9, lambda t, env: (1.0 + 0.1 * t, 1.2), common)
    (tmp_path / "ours.csv").write_text(RESULT_HEADER + "".join(ours))
    random, lines = common.random_returns(), []
    header = RESULT_HEADER.rstrip("\n") + ",commit,script,args_hash,versions\n"
    tasks = [("cleanrl_rpo", env, 0.8 * rpo) for env, (_, rpo) in common.PUBLISHED_8M.items()]
    tasks += [("cleanrl_ppo", env, random[env] + 0.7 * (bar - random[env])) for (env, _), bar in common.MUJOCO_BARS.items()]
    for algo, env, final in tasks:
        for seed in (1, 2):
            source = f"{'f' * 40},{'1' if algo == 'cleanrl_rpo' else '2'}{'0' * 39},{algo[-3:]}edits,torch=1\n"
            lines.append(f"{algo},{ANCHOR_TAG},{env},{seed},1000000,999424,40,{final},1,{source}")
            lines.append(f"{algo},cleanrl-old,{env},{seed},1000000,999424,10,{0.5 * final},1,{source}")
    (tmp_path / "anchors.csv").write_text(header + "".join(lines))
    proc = bench("report.py", tmp_path / "ours.csv", tmp_path / "anchors.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    cells = [line.strip("| ").split(" | ") for line in md.splitlines() if line.startswith("| table")]
    for tag in (ANCHOR_TAG, "cleanrl-old"):
        assert ["table22", "cleanrl_rpo", tag, "2", "44"] in [c[:5] for c in cells]
        assert ["table30", "cleanrl_ppo", tag, "2", "60"] in [c[:5] for c in cells]
    paired = {(c[0], c[2]): c for c in (line.strip("| ").split(" | ") for line in md.splitlines()) if len(c) == 9}
    x = np.array(scores).T  # (seeds, tasks): ours
    anchor = np.array([0.8] * 22 + [0.7] * 8)
    for suite, against, columns in (("table22", "rpo", slice(0, 22)), ("mujoco", "ppo", slice(22, 30))):
        row = paired[(suite, f"cleanrl_{against} [{ANCHOR_TAG}]")]
        assert row[1] == f"vmpo_continuous [{base_tag}]"
        assert row[6].startswith(f"{(x[:, columns] - anchor[columns]).mean():+.3f} [")
    assert paired[("table30", f"cleanrl_ppo [{ANCHOR_TAG}]")][6].startswith(f"{(x - anchor).mean():+.3f} [")
    assert not [key for key in paired if "cleanrl-old" in key[1]]
    walltime = [line for line in md.splitlines() if line.startswith("| Hopper-v5 | 1M | cleanrl_ppo")]
    assert walltime == [f"| Hopper-v5 | 1M | cleanrl_ppo [{ANCHOR_TAG}] | unknown |  | 0.50 |"]  # 20 s against 40 s


def test_wall_time_ratios_set_runs_of_one_cpu_model_side_by_side():
    """An anchor's runs on two machines: each is divided by ours on its own CPU model, or by nothing."""
    from report import ANCHOR_TAG, BASE_TAGS, walltime_table

    def runs(*seconds_cpu):
        return {seed: [{"wall_time": s, "cpu": cpu}] for seed, (s, cpu) in enumerate(seconds_cpu, 1)}

    env, budget = "dm_control/walker/walk", 1_000_000
    groups = {
        (env, "vmpo_continuous", BASE_TAGS["vmpo_continuous"], budget): runs((300, "Xeon"), (500, "Xeon"), (90, "EPYC")),
        (env, "cleanrl_rpo", ANCHOR_TAG, budget): runs((800, "Xeon"), (1000, "EPYC"), (1200, "EPYC")),
        (env, "cleanrl_rpo", "cleanrl-old", budget): runs((10, "Xeon")),
    }
    rows = [line for line in walltime_table(groups).splitlines() if line.startswith(f"| {env}")]
    assert rows == [
        f"| {env} | 1M | cleanrl_rpo [{ANCHOR_TAG}] | EPYC |  | 0.08 |",  # 90 s over the mean of 1000 s and 1200 s
        f"| {env} | 1M | cleanrl_rpo [{ANCHOR_TAG}] | Xeon |  | 0.50 |",  # the mean of 300 s and 500 s over 800 s
    ]


def test_report_scores_the_gaussian_everywhere_on_the_defaults_control_runs(tmp_path, common):
    """`policy gaussian` ran MuJoCo only: table30 scores it on the defaults' 22 control runs (what `--policy auto`
    trains there) and its own MuJoCo runs; `policy beta`, with MuJoCo runs only and no such source, is left out."""
    defaults_lines, defaults_scores = table30_runs("defaults", 0.9, lambda t, env: (1.0, 1.1), common)
    gaussian_lines, gaussian_scores = table30_runs("policy gaussian", None, lambda t, env: (0.05 * t, 0.1), common)
    beta_lines, _ = table30_runs("policy beta", None, lambda t, env: (0.9, 0.9), common)
    (tmp_path / "r.csv").write_text(RESULT_HEADER + "".join(defaults_lines + gaussian_lines + beta_lines))
    proc = bench("report.py", tmp_path / "r.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    rows = {r.split(" | ")[2]: r.strip("| ").split(" | ") for r in md.splitlines() if r.startswith("| table30 |")}
    assert sorted(rows) == ["defaults", "policy gaussian"]
    x = np.array(defaults_scores[:22] + gaussian_scores)  # (30 tasks, 2 seeds)
    cells = rows["policy gaussian"]
    assert float(re.findall(r"[\d.]+", cells[5])[0]) == pytest.approx(trimmed_iqm(x), abs=1e-3)
    assert cells[7] == rows["defaults"][7]  # the same 22 control runs
    assert cells[8:] == ["Ant-v5 0.05", "no"]  # Ant (first MuJoCo task) scores (0 + 0.1) / 2 and falls


def test_report_draws_the_flagship_defaults_beside_rpo(tmp_path, common):
    """flagship.png shows the walker/walk runs of each script's defaults (its tag in `BASE_TAGS`) at each budget and
    the anchors' runs there (`ANCHOR_TAG`), and nothing else: on the fresh seeds where a script has them at that budget.
    The table shows the fresh seeds in a row of their own."""
    import report  # on the path with common

    walker, lines, base = "dm_control/walker/walk", [], report.BASE_TAGS["vmpo_continuous"]
    drawn = {("ppo_continuous", 1_000_000), ("vmpo_continuous", 1_000_000), ("vmpo_continuous", 3_000_000)}
    for algo, budget in drawn:
        for seed in (1, 2):
            lines += run_lines(algo, report.BASE_TAGS[algo], walker, seed, budget, 300.0 * seed)
    fresh = (common.FRESH_SEEDS_FROM, common.FRESH_SEEDS_FROM + 3)
    for seed in fresh:
        lines += run_lines("vmpo_continuous", base, walker, seed, 1_000_000, 10.0 * seed)
    lines += run_lines("vmpo_continuous", "lr 3e-4", walker, 1, 1_000_000, 100.0)  # another tag
    lines += run_lines("vmpo_continuous", report.BASE_TAGS["ppo_continuous"], walker, 1, 2_000_000, 100.0)  # PPO's tag
    lines += run_lines("ppo_continuous", base, "dm_control/finger/spin", 1, 500_000, 100.0)  # another task
    for seed in (1, 2):
        lines += run_lines("cleanrl_rpo", report.ANCHOR_TAG, walker, seed, 1_000_000, 500.0)[-1:]  # a row a run
    (tmp_path / "f.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "f.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    groups = report.flagship_groups(report.group_runs(common.read_results([tmp_path / "f.csv"])))
    assert {(algo, budget) for _, algo, _, budget in groups} == drawn | {("cleanrl_rpo", 1_000_000)}
    assert list(groups[(walker, "vmpo_continuous", f"{base} (fresh seeds)", 1_000_000)]) == list(fresh)
    assert list(groups[(walker, "vmpo_continuous", base, 3_000_000)]) == [1, 2]
    assert list(groups[(walker, "cleanrl_rpo", report.ANCHOR_TAG, 1_000_000)]) == [1, 2]
    rows = table_rows((tmp_path / "report" / "results.md").read_text())
    values = [10.0 * s for s in fresh]
    assert rows[(walker, "vmpo_continuous", f"{base} (fresh seeds)")][4:6] == [
        ", ".join(map(str, fresh)),
        f"{statistics.fmean(values):.1f} ± {statistics.pstdev(values):.1f}",
    ]
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "report" / "flagship.png")
    assert image.shape[1] >= 700 and image[..., :3].std() > 0.05


def test_the_flagship_plot_draws_the_readme_cells_seeds(tmp_path, common):
    """Where V-MPO's walker has fresh-seed runs under its defaults' tag and `FLAGSHIP_TAG`, and `FLAGSHIP_TAG`'s on seeds
    besides `FLAGSHIP_SEEDS` (a study's, that chose it), flagship.png draws `FLAGSHIP_SEEDS` alone: the seeds the
    README's cell reads. Written first in the CSV, so file order alone would not pick them."""
    import report  # on the path with common

    walker, lines = "dm_control/walker/walk", []
    for seed in report.FLAGSHIP_SEEDS[:2]:
        lines += run_lines("vmpo_continuous", report.FLAGSHIP_TAG, walker, seed, 1_000_000, 10.0 * seed)
    for seed in (common.FRESH_SEEDS_FROM, common.FRESH_SEEDS_FROM + 1):
        lines += run_lines("vmpo_continuous", report.BASE_TAGS["vmpo_continuous"], walker, seed, 1_000_000, 10.0 * seed)
        lines += run_lines("vmpo_continuous", report.FLAGSHIP_TAG, walker, seed + 2, 1_000_000, 10.0 * seed)
    (tmp_path / "f.csv").write_text(RESULT_HEADER + "".join(lines))
    groups = report.flagship_groups(report.group_runs(common.read_results([tmp_path / "f.csv"])))
    assert list(groups) == [(walker, "vmpo_continuous", report.FLAGSHIP_TAG + report.FRESH, 1_000_000)]
    assert list(groups[(walker, "vmpo_continuous", report.FLAGSHIP_TAG + report.FRESH, 1_000_000)]) == list(
        report.FLAGSHIP_SEEDS[:2]
    )


SOURCED_HEADER = RESULT_HEADER.strip() + ",commit,script,args_hash,versions\n"


def sourced_lines(tag: str, env: str, seed: int, budget: int, commit: str, args: str, script: str = "unknown") -> list[str]:
    """One vmpo_continuous run's rows with their source columns."""
    lines = run_lines("vmpo_continuous", tag, env, seed, budget, 100.0 * seed)
    return [line.rstrip("\n") + f",{commit},{script},{args},torch=1\n" for line in lines]


def test_report_refuses_a_tag_whose_runs_differ_in_args_hash(tmp_path):
    """A row whose seeds ran two args hashes, one whose seeds are partly unknown, and a config whose short-suite tasks
    each agree but differ from one another: refused with one line naming the first (tag, task, seeds, hashes) and the
    count of the others, nothing written; --allow-mixed reports them, each named under its table. A tag whose runs are
    all unknown, or that share one hash, is not mixed."""
    walker, commit = "dm_control/walker/walk", "c" * 40
    lines = []
    for seed, args in ((1, "aaaaaaaaaa"), (2, "aaaaaaaaaa"), (3, "bbbbbbbbbb")):
        lines += sourced_lines("defaults", walker, seed, 1_000_000, commit, args)
    lines += sourced_lines("half", walker, 1, 1_000_000, commit, "aaaaaaaaaa")
    lines += sourced_lines("half", walker, 2, 1_000_000, "unknown", "unknown")
    for task, (budget, _) in SHORT.items():
        for seed in (1, 2):
            args = "cccccccccc" if task == "cartpole/balance" else "aaaaaaaaaa"
            lines += sourced_lines("across", f"dm_control/{task}", seed, budget, commit, args)
    for seed in (1, 2):
        lines += sourced_lines("old", walker, seed, 1_000_000, "unknown", "unknown")
        lines += sourced_lines("same", walker, seed, 1_000_000, commit, "aaaaaaaaaa")
    (tmp_path / "m.csv").write_text(SOURCED_HEADER + "".join(lines))

    proc = bench("report.py", tmp_path / "m.csv", "--out", tmp_path / "report")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and not (tmp_path / "report" / "results.md").exists()
    assert line.startswith(
        "error: results table: vmpo_continuous [defaults] dm_control/walker/walk 1M: args hashes differ: "
        "args aaaaaaaaaa on seeds 1, 2; args bbbbbbbbbb on seed 3 (and 3 more)."
    ), line
    assert "--allow-mixed" in line

    proc = bench("report.py", tmp_path / "m.csv", "--out", tmp_path / "report", "--allow-mixed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    mixed = [
        m for line in md.splitlines() if line.startswith("**Mixed sources") for m in line.split(":** ", 1)[1].split(" | ")
    ]
    assert mixed == [
        "vmpo_continuous [defaults] dm_control/walker/walk 1M: args hashes differ: args aaaaaaaaaa on seeds 1, 2; "
        "args bbbbbbbbbb on seed 3",
        "vmpo_continuous [half] dm_control/walker/walk 1M: args hashes differ: args aaaaaaaaaa on seed 1; args unknown on "
        "seed 2 (unknown: written before run.py recorded sources, and not recovered since)",
        "vmpo_continuous [half] dm_control/walker/walk 1M: learning code differs: commit cccccccccc on seed 1; commit "
        "unknown on seed 2 (unknown: written before run.py recorded sources, and not recovered since)",
        "short, vmpo_continuous [across]: args hashes differ: args cccccccccc on dm_control/cartpole/balance 200k seeds "
        "1, 2; args aaaaaaaaaa on dm_control/cartpole/swingup 500k seeds 1, 2, dm_control/walker/walk 1M seeds 1, 2, "
        "dm_control/finger/spin 500k seeds 1, 2, dm_control/ball_in_cup/catch 500k seeds 1, 2",
    ]
    sources = [line for line in md.splitlines() if line.startswith("Sources of its")]
    assert sources[0] == (
        "Sources of its 19 runs: commit cccccccccc (16), unknown (3); args hash aaaaaaaaaa (13), unknown (3), "
        "cccccccccc (2), bbbbbbbbbb (1) (unknown: written before run.py recorded sources, and not recovered since)."
    )


def test_report_refuses_commits_whose_learning_code_differs(tmp_path):
    """Commits count as the same code when the script's syntax tree without docstrings is the same: across a commit
    that touches only docs and benchmarks (e36f78f, 7cdbdc9), or only the script's docstrings (368e364, a088d15); not
    across the commit that changed V-MPO's default likelihood (d945bf6, d41f54b). Two dirty trees with different script
    blobs differ; with the same blob they agree."""
    try:
        commits = {
            c: git_out("rev-parse", f"{c}^{{commit}}") for c in "e36f78f 7cdbdc9 368e364 a088d15 d945bf6 d41f54b".split()
        }
    except subprocess.CalledProcessError:
        pytest.skip("this checkout lacks the history these commits come from (a shallow clone)")
    walker, lines = "dm_control/walker/walk", []
    for tag, (first, second) in {
        "docs-only": ("e36f78f", "7cdbdc9"),
        "docstrings": ("368e364", "a088d15"),
        "new-default": ("d945bf6", "d41f54b"),
    }.items():
        lines += sourced_lines(tag, walker, 1, 1_000_000, commits[first], "aaaaaaaaaa")
        lines += sourced_lines(tag, walker, 2, 1_000_000, commits[second], "aaaaaaaaaa")
    for tag, blobs in {"dirty": ("1" * 40, "2" * 40), "dirty-same": ("1" * 40, "1" * 40)}.items():
        for seed, blob in enumerate(blobs, 1):
            lines += sourced_lines(tag, walker, seed, 1_000_000, commits["7cdbdc9"] + "-dirty", "aaaaaaaaaa", blob)
    (tmp_path / "c.csv").write_text(SOURCED_HEADER + "".join(lines))

    proc = bench("report.py", tmp_path / "c.csv", "--out", tmp_path / "report")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and line.startswith(
        "error: results table: vmpo_continuous [dirty] dm_control/walker/walk 1M: learning code differs: commit "
        "7cdbdc998b-dirty (script 1111111111) on seed 1; commit 7cdbdc998b-dirty (script 2222222222) on seed 2 (and 1 "
        "more)."  # one commit, two scripts: their blobs tell them apart
    ), line
    proc = bench("report.py", tmp_path / "c.csv", "--out", tmp_path / "report", "--allow-mixed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    (mixed,) = [line for line in md.splitlines() if line.startswith("**Mixed sources")]
    assert [m.split(":")[0] for m in mixed.split(":** ", 1)[1].split(" | ")] == [
        "vmpo_continuous [dirty] dm_control/walker/walk 1M",
        "vmpo_continuous [new-default] dm_control/walker/walk 1M",
    ]
    assert "learning code differs: commit d945bf6c89 on seed 1; commit d41f54b852 on seed 2" in mixed


def test_report_checks_a_composite_table_suite_by_suite_for_args_and_whole_for_code(tmp_path, common):
    """`--policy auto` resolves to one family on the control suite and another on MuJoCo, so one config has two args
    hashes there: short+mujoco takes them suite by suite. Its learning code must be one across both suites: the same
    hashes with MuJoCo runs from before V-MPO's default changed (d945bf6 against d41f54b) are refused."""
    try:
        old, new = (git_out("rev-parse", f"{c}^{{commit}}") for c in ("d945bf6", "d41f54b"))
    except subprocess.CalledProcessError:
        pytest.skip("this checkout lacks the history these commits come from (a shallow clone)")
    lines = []
    for tag, mujoco_commit in (("auto", new), ("auto-old", old)):
        for seed in (1, 2):
            for task, (budget, _) in SHORT.items():
                lines += sourced_lines(tag, f"dm_control/{task}", seed, budget, new, "aaaaaaaaaa")
            for env, budget in common.MUJOCO_BARS:
                lines += sourced_lines(tag, env, seed, budget, mujoco_commit, "bbbbbbbbbb")
    (tmp_path / "a.csv").write_text(SOURCED_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "a.csv", "--out", tmp_path / "report")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and line.startswith(
        "error: aggregate: short+mujoco, vmpo_continuous [auto-old]: learning code differs: commit d41f54b852 on "
        "dm_control/cartpole/balance 200k seeds 1, 2, "
    ), line
    assert "commit d945bf6c89 on Ant-v5 1M seeds 1, 2, " in line and "(and" not in line  # nothing else is mixed


def test_report_on_runner_results(grid, tmp_path):
    out, _, _ = grid
    proc = bench("report.py", out, "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    finals = [float(r["eval_return"]) for r in read_csv(out) if r["step"] == str(BUDGET)]
    results_table = (tmp_path / "results.md").read_text().split("Final evaluations")[0]  # not the re-evaluations
    row = table_rows(results_table)[("CartPole-v1", "ppo_discrete", TAG)]
    assert row[5] == f"{statistics.fmean(finals):.1f} ± {statistics.pstdev(finals):.1f}"
    trains = [float(r["train_return"]) for r in read_csv(out) if r["step"] == str(BUDGET)]
    assert row[9] == f"{statistics.fmean(trains):.1f}"
    assert (tmp_path / "curves" / "curves_CartPole-v1.png").stat().st_size > 20_000


def test_throughput_reports_both_sps_and_their_ratio(tmp_path):
    proc = bench(
        "throughput.py",
        "--algo",
        "ppo_discrete",
        "--steps",
        "2048",
        "--csv",
        tmp_path / "t.csv",
        "--md",
        tmp_path / "t.md",
        "--profile",
        tmp_path / "profile.txt",
        "--",
        "--num-envs",
        "4",
        "--num-steps",
        "128",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    train = float(re.search(r"training SPS: +([\d.]+) +\((\d+) steps", proc.stdout).group(1))
    rand, before, after = map(
        float, re.search(r"random-action SPS: +([\d.]+) +\(before ([\d.]+), after ([\d.]+)", proc.stdout).groups()
    )
    ratio = float(re.search(r"ratio training/random: +([\d.]+)", proc.stdout).group(1))
    assert train > 0 and before > 0 and after > 0
    assert rand == pytest.approx((before + after) / 2, abs=0.1)
    assert ratio == pytest.approx(train / rand, rel=1e-3, abs=1e-4)

    (row,) = read_csv(tmp_path / "t.csv")
    assert (row["algo"], row["env"], row["num_envs"], row["steps"]) == ("ppo_discrete", "CartPole-v1", "4", "2048")
    for key, printed in [("train_sps", train), ("random_sps", rand), ("ratio", ratio)]:
        assert float(row[key]) == pytest.approx(printed, rel=1e-3, abs=1e-4)
    md = (tmp_path / "t.md").read_text().splitlines()
    # The table rounds the full-precision ratio. The CSV keeps 4 decimals and the printout 4 digits, and rounding
    # either again can differ in the last digit: the expected cell comes from the CSV's two SPS figures instead.
    ratio_cell = f"| {float(row['train_sps']) / float(row['random_sps']):.3f} |"
    assert md[0].startswith("| algo |") and ratio_cell in md[2] and len(md) == 3

    assert "ppo_discrete.py" in (tmp_path / "profile.txt").read_text()
    stats = pstats.Stats(str(tmp_path / "profile.prof"))
    assert any(name == "train" and file.endswith("ppo_discrete.py") for file, _, name in stats.stats)


def test_throughput_bad_input_is_one_line(tmp_path):
    proc = bench("throughput.py", "--algo", "no_such_algo", "--steps", "100")
    assert proc.returncode == 1 and "no script at" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = bench("throughput.py", "--algo", "ppo_discrete", "--steps", "100", "--", "--eval-interval", "5")
    assert proc.returncode == 1 and "--eval-interval is set by throughput.py" in proc.stderr


def test_runner_refuses_to_mix_configs_under_one_tag(grid):
    out, _, _ = grid
    proc = bench(
        "run.py",
        "--algo",
        "ppo_discrete",
        "--env",
        "CartPole-v1",
        "--seeds",
        "1",
        "--budget",
        BUDGET,
        "--out",
        out,
        "--tag",
        TAG,
        "--",
        "--num-envs",
        "2",
    )
    assert proc.returncode == 1 and "give this config its own --tag" in proc.stderr


def test_envpool_ports_compares_each_task_with_the_official_one():
    """`envpool_ports.py`: one table row per task, both backends' reward figures for two halves, the
    between / within observation figure; a task EnvPool does not port says so; no task is one line."""
    proc = bench("envpool_ports.py", "dm_control/finger/spin", "Pendulum-v1", "--num-envs", "2", "--steps", "50")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| dm_control/") or line.startswith("| Pendulum")]
    finger, pendulum = rows
    cells = [c.strip() for c in finger.strip("|").split("|")]
    assert cells[:2] == ["dm_control/finger-spin-v0", "FingerSpin-v1"]
    for paid in cells[2:4]:  # "x% (mean) / y% (mean)" for the two halves
        assert re.fullmatch(r"\d+\.\d\d% \(-?\d+\.\d{4}\) / \d+\.\d\d% \(-?\d+\.\d{4}\)", paid), paid
    assert re.fullmatch(r"\d+\.\d{3} \(dim \d+\) / \d+\.\d{3}", cells[4]), cells[4]
    assert "no EnvPool port" in pendulum
    proc = bench("envpool_ports.py")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: give dm_control env ids or --all"


def test_random_returns_is_the_mean_return_of_uniform_actions(tmp_path):
    """Probe 4 pays 1 - (a - 0.5)^2: under a ~ U(-1, 1) its expected return is 1 - (1/3 + 1/4). A second measurement of
    the same env replaces its row."""
    out = tmp_path / "random.csv"
    for episodes in ("10", "4000"):
        proc = bench("random_returns.py", "--env", "Probe4Continuous-v0", "--episodes", episodes, "--out", out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = read_csv(out)
    assert row["env"] == "Probe4Continuous-v0" and row["episodes"] == "4000"
    assert float(row["return_mean"]) == pytest.approx(1 - (1 / 3 + 1 / 4), abs=0.04)  # 4 standard errors
    proc = bench("random_returns.py", "--episodes", "3", "--out", out)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: give --env ENV [ENV ...] or --suite NAME"


def test_report_scores_the_mujoco_suite_from_the_random_return_to_the_bar(tmp_path, common):
    """Each MuJoCo run scores (return - random) / (bar - random), the random returns the committed ones; the joint
    suite takes the short suite's return / bar beside them."""
    random = common.random_returns()
    lines, mujoco, short = [], [], []
    for t, ((env, budget), bar) in enumerate(common.MUJOCO_BARS.items()):
        for seed in (1, 2):
            final = random[env] + (bar - random[env]) * (0.3 + 0.2 * seed + 0.05 * t)
            lines += run_lines("vmpo_continuous", "A", env, seed, budget, final)
            mujoco.append((final - random[env]) / (bar - random[env]))
    for task, (budget, bar) in SHORT.items():
        for seed in (1, 2):
            lines += run_lines("vmpo_continuous", "A", f"dm_control/{task}", seed, budget, bar * (0.6 + 0.3 * seed))
            short.append(0.6 + 0.3 * seed)
    (tmp_path / "m.csv").write_text(RESULT_HEADER + "".join(lines))
    proc = bench("report.py", tmp_path / "m.csv", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "report" / "results.md").read_text()
    for suite, scores in (("mujoco", mujoco), ("short+mujoco", mujoco + short)):
        (row,) = [line for line in md.splitlines() if line.startswith(f"| {suite} |")]
        cells = row.strip("| ").split(" | ")
        assert cells[3:5] == ["2", str(len(scores))] and float(cells[6]) == pytest.approx(np.mean(scores), abs=1e-3)


RESULTS = [BENCH / "results" / f"{name}.csv" for name in ("ppo_discrete", "ppo_continuous", "vmpo_continuous", "anchors")]
TABLE_COMMAND = (
    "python benchmarks/report.py benchmarks/results/{ppo_discrete,ppo_continuous,vmpo_continuous,anchors}.csv --readme-table"
)


def readme_results_table() -> str:
    """The table under README.md's "## Results": its header line and every table line after it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| task | budget |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end]) + "\n"


def test_the_readmes_results_table_is_report_pys(common):
    """README.md's table is what `report.py --readme-table` prints from the committed CSVs, and each cell of a
    `README_ROWS` column holds the mean ± population std of the final evaluations of its runs (computed here from the raw
    rows: the last step of each run) where any ran, and is empty where none did; a cell no column names is empty."""
    proc = bench("report.py", *RESULTS, "--readme-table")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert readme_results_table() == proc.stdout, f"README.md's results table differs from `{TABLE_COMMAND}`: paste its output"
    import report  # on the path with common

    finals = {}  # (algo, tag, env, budget, seed) -> (step, eval return) of the run's last row
    for path in RESULTS:
        for r in read_csv(path):
            key = (r["algo"], r["tag"], r["env"], int(r["budget"]), int(r["seed"]))
            finals[key] = max(finals.get(key, (-1, 0.0)), (int(r["step"]), float(r["eval_return"])))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()[2:]]
    assert len(rows) == len(report.README_ROWS)
    for cells, (env, budget, columns) in zip(rows, report.README_ROWS, strict=True):
        assert cells[0].startswith(env) and cells[1] == report.fmt_budget(budget)
        named = {report.README_COLUMN_OF[algo]: (algo, tag, seeds) for algo, (tag, seeds) in columns.items()}
        decimals = len(re.search(r"\.(\d+)", next(c for c in cells[2:] if c)).group(1))  # the row's precision
        for i, cell in enumerate(cells[2:]):
            algo, tag, seeds = named.get(i, (None, None, ()))
            values = [finals[(algo, tag, env, budget, s)][1] for s in seeds if (algo, tag, env, budget, s) in finals]
            if not values:
                assert cell == "", (env, budget, i)
                continue
            spread = f" ± {statistics.pstdev(values):,.{decimals}f}" if len(values) > 1 else ""
            expected = f"{statistics.fmean(values):,.{decimals}f}{spread} ({len(values)})"
            assert cell.replace("**", "") == expected, (env, budget, algo)


def test_the_reproduce_block_selects_the_runs_the_readme_table_reads(common):
    """benchmarks/README.md's "Reproduce the README" commands, each with `--dry-run`, plan exactly the runs (script, tag,
    env, seed, budget) of `report.README_ROWS`, and its last command is the table's."""
    import report  # on the path with common

    text = (BENCH / "README.md").read_text().split("## Reproduce the README\n", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [line.split() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == TABLE_COMMAND.split()
    planned = set()
    for command in commands[:-1]:
        assert command[:2] == ["python", "benchmarks/run.py"], command
        proc = bench("run.py", *command[2:], "--dry-run", cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        runs = re.findall(r"^(?:todo|done)  (\S+) \[(.*)\] (\S+) seed (\d+) \((\d+) steps\)", proc.stdout, re.M)
        assert runs and not planned & set(runs), command  # every command plans runs, and no run twice
        planned |= set(runs)
    expected = {
        (algo, tag, env, str(seed), str(budget))
        for env, budget, columns in report.README_ROWS
        for algo, (tag, seeds) in columns.items()
        if not algo.startswith("cleanrl_")  # the anchors run outside the project
        for seed in seeds
    }
    assert planned == expected


def test_throughput_appends_its_row_to_the_pages_last_table(tmp_path, common):
    """`--md` adds a row to the file's last table; a new file, or one that ends in prose, gets the header first.
    benchmarks/results/throughput.md keeps its table last, so the tool's rows land in it."""
    import throughput  # on the path with common

    row = {"algo": "ppo_discrete", "tag": "t", "env": "CartPole-v1", "num_envs": 4, "steps": 2048, "train_sps": 10.0}
    row |= {"random_sps": 20.0, "random_sps_before": 19.0, "random_sps_after": 21.0, "ratio": 0.5}
    row |= {"device": "cpu", "date": "2026-01-01 00:00"}
    line = "| ppo_discrete | t | CartPole-v1 | 4 | 2,048 | 10 | 20 (19 / 21) | 0.500 | cpu | 2026-01-01 00:00 |\n"
    new, table_last, prose_last = tmp_path / "new.md", tmp_path / "table.md", tmp_path / "prose.md"
    table_last.write_text("# Throughput\n\nFigures.\n\n" + throughput.MD_HEADER + line)
    prose_last.write_text("# Throughput\n\n" + throughput.MD_HEADER + line + "\n## Notes\n\nProse, no newline")
    for path in (new, table_last, prose_last):
        throughput.append_markdown(path, row)
    assert new.read_text() == throughput.MD_HEADER + line
    assert table_last.read_text() == "# Throughput\n\nFigures.\n\n" + throughput.MD_HEADER + line + line
    assert prose_last.read_text().endswith("Prose, no newline\n\n" + throughput.MD_HEADER + line)
    assert (BENCH / "results" / "throughput.md").read_text().splitlines()[-1].startswith("| ")

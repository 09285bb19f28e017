"""Turn results CSVs (from `run.py`) into a Markdown table and PNG learning curves.

    python benchmarks/report.py benchmarks/results/{ppo_discrete,ppo_continuous,vmpo_continuous}.csv --out benchmarks/results/
    python benchmarks/report.py benchmarks/results/{ppo_discrete,ppo_continuous,vmpo_continuous}.csv --readme-table

Writes `<out>/results.md` (also printed) with one row per algo/tag x env (runs on the seeds that chose nothing,
`common.FRESH_SEEDS_FROM` and above, in a row of their own, "<tag> (fresh seeds)"): the final
evaluation return as mean ± std over seeds (population std, ddof=0), each seed's value,
the steps, the mean wall time and the mean training return of the last 10 episodes before the
final evaluation; and `<out>/curves/curves_<env>.png` per env: eval return against
env steps and against wall time, one line per algo/tag (mean over seeds, min-max band).

Then the aggregate, per suite (`common.AGGREGATE_SUITES`) and per algo/tag that ran every task of it: each run's final
evaluation divided by its task's bar (`common.BAR_RETURNS`, the better of RPO and the widely used PPO; on the MuJoCo
tasks, `common.MUJOCO_BARS`, the score is (return - random) / (bar - random) with the random policy's return from
`benchmarks/results/random_returns.csv`, written by `random_returns.py`), the
interquartile mean over runs with a 95% stratified bootstrap interval (rliable, 2000 resamples), and
`<out>/profile_<suite>.png`, the performance profile (the fraction of runs scoring above tau times the bar). A config
enters with the same number of seeds on every task: the first n seeds of each, n the fewest it has on any task.

Then `table22`, the same aggregate over `common.SUITE_22` at 1M steps with CleanRL's published RPO 8M
return as the bar (`common.PUBLISHED_8M`), `<out>/profile_table22.png`, and per config the count of tasks whose mean
final return over those seeds is at or above the published PPO 8M return (e.g. 13/22).

Then `table30`, the decision rule for a default: table22's 22 scores and the 8 MuJoCo scores together, on
the same seeds, their IQM with its interval, the 22-task IQM on those seeds, the lowest MuJoCo task's mean score, and
whether the config qualifies (`RULE_CONTROL_IQM`, `RULE_MUJOCO_FLOOR`).

Then the paired comparisons (`paired_table`), on table22, the 8 MuJoCo tasks and table30: each config against its
script's defaults (`BASE_TAGS`), and each script's defaults against an anchor (CleanRL's script, algo
`cleanrl_*`), on the seeds both ran of every task; the difference of the IQM and of the mean score with 95% intervals
from a bootstrap that resamples each task's seeds alike for both arms, the tasks each leads on every seed, and on
table30 the guard a candidate passes to become a default (`GUARD_IQM_FLOOR`, `GUARD_MUJOCO_SCORE`). The anchors' rows are
CleanRL's scripts run outside the project (a results CSV of their own, algo `cleanrl_rpo` on the control suite,
`cleanrl_ppo` on MuJoCo; in table30 the PPO row scores the RPO runs of its tag on the control suite); then, per task,
the wall time of each script's defaults over the anchor's at the same budget.

Last, `<out>/flagship.png` when some script has rows of its defaults (`BASE_TAGS`) on the flagship task
(`common.FLAGSHIP_ENV`): those configs' curves alone, one line per script and budget (on its fresh seeds where it has
them), with the anchors' final evaluations there (`ANCHOR_TAG`) as points, for the README. `results.md` links every
PNG it writes.

`--readme-table` prints the README's results table instead and writes nothing: each script's defaults on the seeds
`README_ROWS` names, beside CleanRL's PPO and RPO run on the same tasks, seeds and evaluation (`ANCHOR_TAG`).

Under every table, a line names the commits and args hashes of its runs (`common.SOURCE_FIELDS`; on stderr for
`--readme-table`). Before anything is written, every table is checked for rows of one tag that ran different args
hashes, or different learning code (`code_key`: the script's syntax tree without docstrings); `unknown` is a group of
its own, so unknown rows beside known ones are a mix, and a table of unknown rows alone is not. A mix is refused with
one line naming it, unless `--allow-mixed`, which reports it and names it under its table.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TABLE_HEADER = (
    "| env | algo | tag | budget | seeds | final eval return (mean ± std) | per seed | steps | wall time |"
    " training return, last 10 episodes |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


FRESH = " (fresh seeds)"


def group_runs(rows: list[dict]) -> dict[tuple, dict[int, list[dict]]]:
    """(env, algo, tag, budget) -> {seed: that run's evaluations sorted by step}. Runs on seeds that chose nothing
    (`common.FRESH_SEEDS_FROM` and above) form their own group, tagged "<tag> (fresh seeds)"."""
    groups: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        tag = r["tag"] + FRESH if r["seed"] >= common.FRESH_SEEDS_FROM else r["tag"]
        groups[(r["env"], r["algo"], tag, r["budget"])][r["seed"]].append(r)
    return {k: {s: sorted(v[s], key=lambda r: r["step"]) for s in sorted(v)} for k, v in sorted(groups.items())}


def group_tag(tag: str, seeds: tuple[int, ...]) -> str:
    """The tag `group_runs` files runs of `tag` on `seeds` under: "<tag> (fresh seeds)" on fresh seeds."""
    return tag + FRESH if min(seeds) >= common.FRESH_SEEDS_FROM else tag


def fmt_duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def fmt_range(values: list[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def fmt_train_return(values: list[float]) -> str:
    """Mean over the seeds that recorded one ('-' if none did; older rows have none)."""
    known = [v for v in values if not np.isnan(v)]
    return "-" if not known else f"{np.mean(known):.1f}" + ("" if len(known) == len(values) else f" ({len(known)} seeds)")


def table(groups: dict, note: str = "") -> str:
    lines = [TABLE_HEADER]
    for (env, algo, tag, budget), seeds in groups.items():
        finals = [runs[-1] for runs in seeds.values()]
        returns = np.array([f["eval_return"] for f in finals])
        lines.append(
            " | ".join(
                [
                    f"| {env}",
                    algo,
                    tag,
                    f"{budget:,}",
                    ", ".join(map(str, seeds)),
                    f"{returns.mean():.1f} ± {returns.std():.1f}",
                    " / ".join(f"{v:.1f}" for v in returns),
                    fmt_range([f["step"] for f in finals], lambda v: f"{v:,}"),
                    fmt_duration(float(np.mean([f["wall_time"] for f in finals]))),
                    fmt_train_return([f["train_return"] for f in finals]) + " |",
                ]
            )
        )
    return "\n".join(lines + ([note] if note else [])) + "\n"


AGGREGATE_HEADER = (
    "| suite | algo | tag | seeds per task | runs | IQM of return / bar [95% CI] | mean of return / bar |\n"
    "|---|---|---|---|---|---|---|"
)


def suite_runs(groups: dict, suite: list[tuple[str, int]]) -> dict[str, list[list[tuple[int, dict]]]]:
    """'algo [tag]' -> per task of `suite`, the (seed, final row) of the runs that enter its aggregate: for the configs
    that ran every (env, budget) of `suite`, the first n seeds of each task, n the fewest the config has on any task."""
    configs = {(algo, tag) for (_, algo, tag, _) in groups}
    runs = {}
    for algo, tag in sorted(configs):
        per_task = [groups.get((env, algo, tag, budget)) for env, budget in suite]
        if any(seeds is None for seeds in per_task):
            continue
        n = min(len(seeds) for seeds in per_task)
        runs[f"{algo} [{tag}]"] = [[(seed, rows[-1]) for seed, rows in list(seeds.items())[:n]] for seeds in per_task]
    return runs


def final_returns(groups: dict, suite: list[tuple[str, int]]) -> dict[str, np.ndarray]:
    """'algo [tag]' -> (seeds, tasks) final evaluations of `suite_runs`."""
    return {
        name: np.array([[row["eval_return"] for _, row in task] for task in tasks], float).T
        for name, tasks in suite_runs(groups, suite).items()
    }


def normalized_scores(groups: dict, suite: list[tuple[str, int]], bars: dict | None = None) -> dict[str, np.ndarray]:
    """'algo [tag]' -> (seeds, tasks) normalized final evaluations, for the configs that ran every task of `suite`: over
    the bar (`bars`, by default `common.BAR_RETURNS` and `common.MUJOCO_BARS`) on the control suite, whose random
    returns are near 0; from the random policy's return to the bar on the MuJoCo tasks, whose random returns are not."""
    bars = {**common.BAR_RETURNS, **common.MUJOCO_BARS} if bars is None else bars
    measured = common.random_returns()
    missing = [env for env, budget in suite if (env, budget) in common.MUJOCO_BARS and env not in measured]
    if missing:
        raise common.BenchmarkError(f"no random-policy return for {', '.join(missing)}: run benchmarks/random_returns.py")
    # score = (R - R_random) / (R_bar - R_random), R_random = 0 on the control suite
    zero = np.array([measured[env] if (env, budget) in common.MUJOCO_BARS else 0.0 for env, budget in suite])
    bar = np.array([bars[task] for task in suite])
    return {name: (x - zero) / (bar - zero) for name, x in final_returns(groups, suite).items()}


def aggregate_cells(suite_name: str, scores: dict[str, np.ndarray], reps: int) -> dict[str, list[str]]:
    """'algo [tag]' -> the aggregate row's cells: suite, algo, tag, seeds per task, runs, IQM [95% CI], mean."""
    from rliable import library as rly
    from rliable import metrics

    def iqm(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x)])

    rng_state = np.random.get_state()
    rows = {}
    for name, x in scores.items():
        # rliable resamples with numpy's global generator: seeded again for each row, so that a row's interval is the
        # same on every run and never moves with the rows beside it
        np.random.seed(0)
        point, interval = rly.get_interval_estimates({name: x}, iqm, reps=reps)
        algo, tag = name.split(" [", 1)
        lo, hi = interval[name][:, 0]
        rows[name] = [f"| {suite_name}", algo, tag[:-1], str(x.shape[0]), str(x.size)]
        rows[name] += [f"{point[name][0]:.3f} [{lo:.3f}, {hi:.3f}]", f"{x.mean():.3f}"]
    np.random.set_state(rng_state)
    return rows


def aggregate(groups: dict, out: Path, reps: int = 2000, note: str = "") -> str:
    """The aggregate table (Markdown) and one performance-profile PNG per suite. `note`: the line(s) under the table."""
    lines, profiles = [AGGREGATE_HEADER], []
    for suite_name, suite in common.AGGREGATE_SUITES.items():
        scores = normalized_scores(groups, suite)
        if not scores:
            continue
        lines += [" | ".join(cells) + " |" for cells in aggregate_cells(suite_name, scores, reps).values()]
        plot_profile(scores, out / f"profile_{suite_name}.png", f"{suite_name} suite: {', '.join(e for e, _ in suite)}")
        profiles.append(f"[{suite_name}](profile_{suite_name}.png)")
    lines += [note] if note and len(lines) > 1 else []
    if profiles:
        lines += ["", f"Performance profiles: {', '.join(profiles)}."]
    return "\n".join(lines) + "\n"


TABLE22_BUDGET = 1_000_000
# The rule for a default (study 2026-11-28-policy-auto), fixed before its runs: at least this 22-task IQM on the control suite, and at least
# this score on every MuJoCo task (the mean over seeds).
RULE_CONTROL_IQM, RULE_MUJOCO_FLOOR = 0.75, 0.2
TABLE22_HEADER = (
    "table22: final evaluation at 1M over CleanRL's published RPO 8M return, 22 dm_control tasks; last"
    " column: the tasks whose mean final return is at or above the published PPO 8M return\n\n"
    "| suite | algo | tag | seeds per task | runs | IQM of return / RPO 8M [95% CI] | mean of return / RPO 8M |"
    " tasks at or above PPO 8M |\n"
    "|---|---|---|---|---|---|---|---|"
)


def table22(groups: dict, out: Path, reps: int = 2000, note: str = "") -> str:
    """The table22 section (Markdown) and `<out>/profile_table22.png`; one line when no config ran all 22 tasks. `note`:
    the line(s) under the table (its sources)."""
    suite = [(env, TABLE22_BUDGET) for env in common.SUITE_22]
    rpo_bars = {(env, budget): common.PUBLISHED_8M[env][1] for env, budget in suite}
    scores = normalized_scores(groups, suite, rpo_bars)
    if not scores:
        return f"table22: no algo/tag has runs at 1M on all {len(suite)} tasks of common.SUITE_22\n"
    ppo = np.array([common.PUBLISHED_8M[env][0] for env in common.SUITE_22])
    finals = final_returns(groups, suite)
    lines = [TABLE22_HEADER]
    for name, cells in aggregate_cells("table22", scores, reps).items():
        at_or_above = int((finals[name].mean(axis=0) >= ppo).sum())
        lines.append(" | ".join([*cells, f"{at_or_above}/{len(suite)} |"]))
    plot_profile(scores, out / "profile_table22.png", "table22: 22 dm_control tasks at 1M", "CleanRL's RPO 8M return")
    lines += [note] if note else []
    lines += ["", "Performance profile: [table22](profile_table22.png)."]
    return "\n".join(lines) + "\n"


TABLE30_HEADER = (
    "table30 (the rule for a default): the 22 dm_control tasks of table22 (return / RPO 8M) and the 8 MuJoCo tasks ((return -"
    " random) / (bar - random)), all at 1M, on the same seeds; a config qualifies when its 22-task IQM is at least"
    f" {RULE_CONTROL_IQM} and no MuJoCo task's mean score is under {RULE_MUJOCO_FLOOR} (nothing learns to fall);"
    " `policy gaussian` scores the defaults' control-suite runs, since `--policy auto` trains the Gaussian there, and"
    " `cleanrl_ppo` scores CleanRL's RPO runs of its tag there, the script CleanRL gives for dm_control\n\n"
    "| suite | algo | tag | seeds per task | runs | IQM over 30 tasks [95% CI] | mean over 30 tasks |"
    " 22-task IQM | lowest MuJoCo task (mean score) | qualifies |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


# Tags whose control-suite runs are another tag's: `--policy auto` trains the Gaussian on `dm_control/...` ids, so
# `--policy gaussian` there would repeat the defaults' runs; table30 scores those for it.
CONTROL_RUNS_OF = {"policy gaussian": "defaults"}


TABLE30_CONTROL = [(env, TABLE22_BUDGET) for env in common.SUITE_22]


# The anchors' row: CleanRL's PPO (its MuJoCo script) scores CleanRL's RPO runs of the same tag on the control suite (the
# script its documentation gives for dm_control), so the anchor has a 30-task row; each part is checked as its own code.
ANCHOR_CONTROL_RUNS_OF = {"cleanrl_ppo": "cleanrl_rpo"}


def table30_groups(groups: dict) -> dict:
    """`groups` with the control-suite runs `CONTROL_RUNS_OF` and `ANCHOR_CONTROL_RUNS_OF` lend (a config's own runs win
    over borrowed ones)."""
    borrowed = {
        (env, algo, alias, budget): seeds
        for (env, algo, tag, budget), seeds in groups.items()
        for alias, source in CONTROL_RUNS_OF.items()
        if tag == source and env in common.PUBLISHED_8M
    }
    borrowed |= {
        (env, alias, tag, budget): seeds
        for (env, algo, tag, budget), seeds in groups.items()
        for alias, source in ANCHOR_CONTROL_RUNS_OF.items()
        if algo == source and env in common.PUBLISHED_8M
    }
    return borrowed | groups


def table30(groups: dict, reps: int = 2000, note: str = "") -> str:
    """The table30 section (Markdown): the decision rule for a default over the 22 control tasks and the 8 MuJoCo tasks. The
    default is the qualifying config with the highest 30-task IQM; one line when no config ran all 30 tasks. `note`: the
    line(s) under the table (its sources)."""
    from rliable import metrics

    control = TABLE30_CONTROL
    mujoco = list(common.MUJOCO_BARS)
    bars = {(env, budget): common.PUBLISHED_8M[env][1] for env, budget in control} | common.MUJOCO_BARS
    scores = normalized_scores(table30_groups(groups), control + mujoco, bars)
    if not scores:
        return f"table30: no algo/tag has runs at 1M on all {len(control) + len(mujoco)} tasks\n"
    lines = [TABLE30_HEADER]
    for name, cells in aggregate_cells("table30", scores, reps).items():
        x = scores[name]  # (seeds, tasks): the 22 control tasks, then the MuJoCo ones
        control_iqm = float(metrics.aggregate_iqm(x[:, : len(control)]))
        per_task = x[:, len(control) :].mean(axis=0)
        lowest = int(per_task.argmin())
        qualifies = control_iqm >= RULE_CONTROL_IQM and per_task[lowest] >= RULE_MUJOCO_FLOOR
        cells += [f"{control_iqm:.3f}", f"{mujoco[lowest][0]} {per_task[lowest]:.2f}", "yes |" if qualifies else "no |"]
        lines.append(" | ".join(cells))
    return "\n".join(lines + ([note] if note else [])) + "\n"


# --- Paired comparisons -------------------------------------------------------------------------------------------------
# A candidate against today's defaults, and each script's defaults against its anchor (CleanRL's script, algo
# `cleanrl_*`), on the seeds both ran of every task: the difference of the IQM and of the mean score, with a 95% interval
# from a bootstrap that resamples each task's seeds, the same seeds for both arms (a pair stays a pair). The guard a
# candidate must pass to become a default (study 2026-12-01-walker-twenty-seeds, fixed before its runs): the interval of
# its paired 30-task IQM difference ends above GUARD_IQM_FLOOR, and no MuJoCo task's mean score over its seeds is under
# GUARD_MUJOCO_SCORE.
# Each continuous script's defaults: the tag of the runs its script today learns like (bitwise). V-MPO's is the
# short-training-episodes study's winner (half the training envs at 125 steps), run as a candidate before it became the
# default.
BASE_TAGS = {"ppo_continuous": "defaults-e56b79a", "vmpo_continuous": "half-train-episode-steps-125"}
# CleanRL at commit fe8d8a0, edited only for gymnasium 1.x and our final evaluation; its older tags compare with nothing
ANCHOR_TAG = "cleanrl-fe8d8a0"
ALGO_ANCHORED = ("ppo_continuous", "vmpo_continuous")  # the scripts an anchor's runs are compared with
GUARD_IQM_FLOOR, GUARD_MUJOCO_SCORE = -0.1, 0.8


def fmt_base_tags() -> str:
    return ", ".join(f"`{tag}` for `{algo}.py`" for algo, tag in BASE_TAGS.items())


PAIRED_HEADER = (
    f"Paired comparisons: each config against its script's defaults ({fmt_base_tags()}), and each script's defaults"
    f" against an anchor (`cleanrl_*` [{ANCHOR_TAG}]), by task and seed on the seeds both ran (the first n in common on"
    " every task); 95% intervals resample each task's seeds for both arms alike (2000 times). Guard (table30): the"
    f" IQM difference's interval ends above {GUARD_IQM_FLOOR} and every MuJoCo task's mean score is"
    f" {GUARD_MUJOCO_SCORE} or more\n\n"
    "| suite | config | against | seeds per task | IQM (config / against) | IQM difference [95% CI] |"
    " mean difference [95% CI] | tasks led on every seed (config / against) | guard |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def paired_scores(groups: dict, suite: list, bars: dict, a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray] | None:
    """(seeds, tasks) scores of configs `a` and `b` ((algo, tag)) on the first n seeds both ran of every task of
    `suite`, n the fewest they share on any task; None where they share none on some task."""
    runs = [(groups.get((env, *a, budget)), groups.get((env, *b, budget))) for env, budget in suite]
    if any(x is None or y is None for x, y in runs):
        return None
    common_seeds = [sorted(set(x) & set(y)) for x, y in runs]
    n = min(len(seeds) for seeds in common_seeds)
    if n == 0:
        return None
    pick = {}
    for name, config in (("a", a), ("b", b)):
        one = {(env, *config, budget): groups[(env, *config, budget)] for env, budget in suite}
        chosen = {k: {s: one[k][s] for s in seeds[:n]} for k, seeds in zip(one, common_seeds, strict=True)}
        pick[name] = normalized_scores(chosen, suite, bars)[f"{config[0]} [{config[1]}]"]
    return pick["a"], pick["b"]


def paired_difference(a: np.ndarray, b: np.ndarray, statistic, reps: int) -> tuple[float, float, float]:
    """statistic(a) - statistic(b) of (seeds, tasks) scores paired by seed and task, and its 95% bootstrap interval
    (each task's seeds resampled, the same draw for both arms)."""
    rng = np.random.default_rng(0)
    seeds, tasks = a.shape
    draws = rng.integers(0, seeds, size=(reps, seeds, tasks))
    columns = np.arange(tasks)
    diffs = [statistic(a[d, columns]) - statistic(b[d, columns]) for d in draws]
    return statistic(a) - statistic(b), float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def iqm(x: np.ndarray) -> float:
    """The interquartile mean of every run's score, as the aggregates compute it."""
    from rliable import metrics

    return float(metrics.aggregate_iqm(x))


def paired_table(groups: dict, reps: int = 2000) -> str:
    """The paired comparisons (Markdown) on table22, the MuJoCo tasks and table30; '' when no pair ran a whole suite."""
    control, mujoco = TABLE30_CONTROL, list(common.MUJOCO_BARS)
    bars = {(env, budget): common.PUBLISHED_8M[env][1] for env, budget in control} | common.MUJOCO_BARS
    configs = sorted({(algo, tag) for (_, algo, tag, _) in groups})
    ours = [c for c in configs if not c[0].startswith("cleanrl_")]
    pairs = [(c, (c[0], BASE_TAGS[c[0]])) for c in ours if c[0] in BASE_TAGS and c[1] != BASE_TAGS[c[0]]]
    anchors = [c for c in configs if c[0].startswith("cleanrl_") and c[1] == ANCHOR_TAG]
    pairs += [((algo, BASE_TAGS[algo]), anchor) for anchor in anchors for algo in ALGO_ANCHORED]
    lines = []
    for suite_name, suite in (("table22", control), ("mujoco", mujoco), ("table30", control + mujoco)):
        for a, b in pairs:
            scores = paired_scores(table30_groups(groups) if suite_name == "table30" else groups, suite, bars, a, b)
            if scores is None:
                continue
            x, y = scores
            _, lo, hi = iqm_diff = paired_difference(x, y, iqm, reps)
            mean_diff = paired_difference(x, y, np.mean, reps)
            led = f"{int((x > y).all(axis=0).sum())} / {int((y > x).all(axis=0).sum())}"
            guard = "-"
            if suite_name == "table30":
                per_task = x[:, len(control) :].mean(axis=0)
                low = [f"{env} {v:.2f}" for (env, _), v in zip(mujoco, per_task, strict=True) if v < GUARD_MUJOCO_SCORE]
                guard = "passes" if lo > GUARD_IQM_FLOOR and not low else "fails" + (f" ({', '.join(low)})" if low else "")
            cells = [suite_name, f"{a[0]} [{a[1]}]", f"{b[0]} [{b[1]}]", str(x.shape[0]), f"{iqm(x):.3f} / {iqm(y):.3f}"]
            cells += [f"{d:+.3f} [{lo_:+.3f}, {hi_:+.3f}]" for d, lo_, hi_ in (iqm_diff, mean_diff)]
            lines.append("| " + " | ".join([*cells, led, guard]) + " |")
    return PAIRED_HEADER + "\n" + "\n".join(lines) + "\n" if lines else ""


WALLTIME_HEADER = (
    "Wall time at the same budget: the mean over seeds of each script's defaults' runs"
    f" ({fmt_base_tags()}; their evaluations every 100k included) over the anchor's (its final evaluation included),"
    " per task, on runs of one CPU model (the rows' `cpu`: a ratio across machines would read the machines)\n\n"
    "| env | budget | anchor | cpu | " + " | ".join(f"`{algo}.py` / anchor" for algo in ALGO_ANCHORED) + " |\n"
    "|---|---|---|---|---|---|"
)


def walltime_table(groups: dict) -> str:
    """The wall-time ratios of each script's defaults to an anchor's runs on the same task, budget and CPU model; ''
    when none."""
    seconds: dict[tuple, list[float]] = {}
    for key, seeds in groups.items():
        for runs in seeds.values():
            seconds.setdefault((*key, runs[-1].get("cpu") or common.UNKNOWN), []).append(runs[-1]["wall_time"])
    lines = []
    for (env, algo, tag, budget, cpu), anchor in sorted(seconds.items()):
        if algo.startswith("cleanrl_") and tag == ANCHOR_TAG:
            ours = [seconds.get((env, a, BASE_TAGS[a], budget, cpu)) for a in ALGO_ANCHORED]
            ratios = ["" if x is None else f"{np.mean(x) / np.mean(anchor):.2f}" for x in ours]
            lines.append(f"| {env} | {fmt_budget(budget)} | {algo} [{tag}] | {cpu} | " + " | ".join(ratios) + " |")
    return WALLTIME_HEADER + "\n" + "\n".join(lines) + "\n" if lines else ""


# --- Where each number comes from -------------------------------------------------------------------------------------
# Every table is checked, before anything is written, for rows of one tag that ran different args or different learning
# code, and names the commits and args hashes behind it in a line under it. A "part" is a set of runs that must share
# one args hash: a row of the results table (its seeds), a config's runs in an aggregate (all its tasks), each suite of
# a composite table on its own (`--policy auto` resolves to another family, so another args hash, on the MuJoCo tasks
# than on the control suite), a cell of the README's table. All the parts of a table row share one learning code.
COMPOSITE_PARTS = {"short+mujoco": len(common.AGGREGATE_SUITES["short"]), "table30": len(TABLE30_CONTROL)}
UNKNOWN_NOTE = "written before run.py recorded sources, and not recovered since"
_code_keys: dict[tuple[str, str, str], str] = {}


def learning_code(text: str) -> str:
    """10 hex digits of sha256 over a script's syntax tree without its docstrings (every statement that is a bare
    constant, a docstring or `...`): comments, docstrings and layout leave it unchanged; any other change changes it."""
    import ast
    import hashlib

    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] or [
                ast.Pass()
            ]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:10]


def code_key(row: dict) -> str:
    """What two runs must share to count as the same learning code: the script's syntax tree without docstrings
    (`learning_code`) where its text can be read from git (the `script` blob a run recorded, or `<algo>.py` at a clean
    commit), else the recorded blob itself (a dirty tree's script), else the commit (`unknown`: one group of its own)."""
    commit, blob, algo = row["commit"], row["script"], row["algo"]
    if (commit, blob, algo) not in _code_keys:
        found = blob
        if found == common.UNKNOWN and commit != common.UNKNOWN and not commit.endswith("-dirty"):
            found = common.git("rev-parse", "--verify", "--quiet", f"{commit}:{algo}.py") or common.UNKNOWN
        key = commit
        if found != common.UNKNOWN:
            text = common.git("cat-file", "blob", found)
            try:
                key = f"code {learning_code(text)}" if text is not None else f"script {found[:10]}"
            except SyntaxError:
                key = f"script {found[:10]}"
        _code_keys[(commit, blob, algo)] = key
    return _code_keys[(commit, blob, algo)]


# The final evaluations on more episodes (`run.py --final-episodes`). On dm_control, whose tasks return at most 1000, an
# episode succeeds at 700 or more (walker/walk: it walks), and a run succeeds from every start when 90% of its episodes
# do (45 of 50). A comparison of n runs a side detects, in 80% of draws at a two-sided 5% level, a difference of
# (z_0.975 + z_0.8) sqrt(2 / n) of one run's standard deviation: about 0.89 of it at 20 runs a side.
SUCCESS_RETURN, SUCCESS_SHARE, Z_POWER = 700.0, 0.9, 1.959964 + 0.841621
FINAL_HEADER = (
    "Final evaluations on more episodes (`run.py --final-episodes`): each run's last checkpoint evaluated again. A"
    f" dm_control run succeeds from every start when {SUCCESS_SHARE:.0%} of its episodes return {SUCCESS_RETURN:.0f}"
    " or more. Each config against its script's defaults on the same task and budget (its `BASE_TAGS` tag where it"
    " ran there, else its most-run `defaults*` tag): the difference of the"
    " means over runs with its 95% bootstrap interval (runs resampled within each arm, 2000 times).\n\n"
    "| env | algo | tag | budget | runs (seeds) | episodes | mean ± std over runs | 95% CI of the mean |"
    " runs succeeding from every start | difference from defaults [95% CI] | args hash |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def final_table(csvs: list[Path], reps: int = 2000) -> str:
    """The final-evaluation section (Markdown) from the `_final.csv` beside each results CSV; '' when there is none."""
    groups = defaultdict(list)  # (env, budget, algo, tag) -> [(seed, episode returns, row)]
    for path in csvs:
        for r in common.read_csv(common.final_csv(path))[1]:
            returns = np.array([float(x) for x in r["returns"].split()])
            groups[r["env"], int(r["budget"]), r["algo"], r["tag"]].append((int(r["seed"]), returns, r))
    if not groups:
        return ""

    def interval(stat, *arms: np.ndarray) -> str:
        rng = np.random.default_rng(0)  # each interval its own draws: a row's interval never moves with its neighbours
        draws = [stat(*(rng.choice(a, a.size) for a in arms)) for _ in range(reps)]
        return f"[{np.percentile(draws, 2.5):.1f}, {np.percentile(draws, 97.5):.1f}]"

    lines, powers = [FINAL_HEADER], []
    for (env, budget, algo, tag), runs in sorted(groups.items()):
        means = np.array([returns.mean() for _, returns, _ in runs])
        succeeding = [(returns >= SUCCESS_RETURN).mean() >= SUCCESS_SHARE for _, returns, _ in runs]
        base = (env, budget, algo, BASE_TAGS.get(algo))  # today's defaults; else the algo's most-run `defaults*` tag
        if base not in groups:
            bases = [k for k in groups if k[:3] == (env, budget, algo) and k[3].startswith("defaults")]
            base = max(bases, key=lambda k: len(groups[k]), default=None)
        versus = "base" if base and base[3] == tag else "-"
        if base and base[3] != tag:
            base_means = np.array([returns.mean() for _, returns, _ in groups[base]])
            diff = means.mean() - base_means.mean()
            versus = f"{diff:+.1f} {interval(lambda a, b: a.mean() - b.mean(), means, base_means)}"
        elif base:
            share = min(max(np.mean(succeeding), 1 / len(runs)), 1 - 1 / len(runs))
            mde, count = Z_POWER * np.sqrt(2 / len(runs)), Z_POWER * np.sqrt(2 * share * (1 - share) * len(runs))
            powers.append(
                f"{env} {fmt_budget(budget)}, {tag} ({len(runs)} runs): {len(runs)} runs a side detect a difference"
                f" in mean of {mde * means.std(ddof=1):.1f} (std over runs {means.std(ddof=1):.1f}) and a difference of"
                f" {count:.1f} in the runs succeeding from every start (80% of draws, two-sided 5%)"
            )
        seeds = sorted(seed for seed, _, _ in runs)
        cells = [env, algo, tag, fmt_budget(budget), f"{len(runs)} ({seeds[0]}-{seeds[-1]})"]
        cells += [str(len(runs[0][1])), f"{means.mean():.1f} ± {means.std(ddof=1) if len(runs) > 1 else 0:.1f}"]
        cells += [interval(np.mean, means), f"{sum(succeeding)}/{len(runs)}" if env.startswith("dm_control/") else "-"]
        cells += [versus, ", ".join(sorted({r["args_hash"] for *_, r in runs}))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Power, from each base's spread: " + "; ".join(powers) + "."] if powers else []
    return "\n".join(lines) + "\n"


def short_commit(commit: str) -> str:
    return commit if commit == common.UNKNOWN else commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")


def fmt_runs(runs: list[tuple[str, int, dict]]) -> str:
    """`dm_control/walker/walk 1M seeds 1, 2, Ant-v5 1M seed 3` (a run's task label may be empty: `seeds 1, 2`)."""
    by_task = defaultdict(list)
    for task, seed, _ in runs:
        by_task[task].append(seed)
    return ", ".join(
        f"{task + ' ' if task else ''}seed{'s' * (len(seeds) > 1)} {', '.join(map(str, sorted(seeds)))}"
        for task, seeds in by_task.items()
    )


def code_name(runs: list[tuple[str, int, dict]]) -> str:
    """`commit 7cdbdc998b`, or `commit 7cdbdc998b-dirty (script 1a2b3c4d5e)` where only the blob tells the code apart."""
    key = code_key(runs[0][2])
    script = f" (script {key.split()[1]})" if key.startswith("script ") else ""
    return "commit " + ", ".join(sorted({short_commit(r["commit"]) for *_, r in runs})) + script


def mixed_sources(parts: list[list[tuple[str, int, dict]]]) -> list[str]:
    """A description for each part whose runs have more than one args hash, and one if the runs of all the parts
    together have more than one learning code (`code_key`: the code does not depend on the task, the resolved args can).
    `unknown` is a group of its own, so runs all unknown are not mixed, and unknown runs beside known ones are."""
    checks = [
        (part, "args hashes differ", lambda r: r["args_hash"], lambda runs: f"args {runs[0][2]['args_hash']}")
        for part in parts
    ]
    runs = [run for part in parts for run in part]
    wholes = [runs] if len({r["algo"] for *_, r in runs}) <= 1 else parts  # two scripts (an anchor's row): code per part
    checks += [(whole, "learning code differs", code_key, code_name) for whole in wholes]
    found = []
    for runs, what, key, name in checks:
        groups = defaultdict(list)
        for run in runs:
            groups[key(run[2])].append(run)
        if len(groups) > 1:
            named = [f"{name(group)} on {fmt_runs(group)}" for group in groups.values()]
            unknown = " (unknown: " + UNKNOWN_NOTE + ")" if common.UNKNOWN in groups else ""
            found.append(f"{what}: " + "; ".join(named) + unknown)
    return found


def table_parts(groups: dict) -> dict[str, list[tuple[str, list[list[tuple[str, int, dict]]]]]]:
    """table -> [(row label, parts)] for the tables results.md holds: each part a list of (task, seed, final row)."""
    tables = {"results table": []}
    for (env, algo, tag, budget), seeds in groups.items():
        part = [("", seed, runs[-1]) for seed, runs in seeds.items()]
        tables["results table"].append((f"{algo} [{tag}] {env} {fmt_budget(budget)}", [part]))

    def config_parts(table: str, suite: list[tuple[str, int]], source: dict, split: int | None) -> list:
        rows = []
        for name, tasks in suite_runs(source, suite).items():
            runs = [
                [(f"{env} {fmt_budget(budget)}", seed, row) for seed, row in task]
                for (env, budget), task in zip(suite, tasks, strict=True)
            ]
            flat = [[run for task in part for run in task] for part in ((runs[:split], runs[split:]) if split else (runs,))]
            rows.append((f"{table}, {name}", flat))
        return rows

    tables["aggregate"] = [
        row
        for suite_name, suite in common.AGGREGATE_SUITES.items()
        for row in config_parts(suite_name, suite, groups, COMPOSITE_PARTS.get(suite_name))
    ]
    suite22 = [(env, TABLE22_BUDGET) for env in common.SUITE_22]
    tables["table22"] = config_parts("table22", suite22, groups, None)
    mujoco = list(common.MUJOCO_BARS)
    tables["table30"] = config_parts("table30", TABLE30_CONTROL + mujoco, table30_groups(groups), COMPOSITE_PARTS["table30"])
    return tables


def readme_parts(groups: dict) -> list[tuple[str, list[list[tuple[str, int, dict]]]]]:
    """[(cell label, [part])] for the README's table: a script's runs on the seeds of its `README_ROWS` cell."""
    cells = []
    for env, budget, columns in README_ROWS:
        for algo, (tag, seeds) in columns.items():
            runs = groups.get((env, algo, group_tag(tag, seeds), budget), {})
            part = [("", s, runs[s][-1]) for s in seeds if s in runs]
            cells.append((f"README table, {algo} [{tag}] {env} {fmt_budget(budget)}", [part]))
    return cells


def check_sources(tables: dict[str, list], allow_mixed: bool) -> dict[str, list[str]]:
    """table -> its mixed rows ('label: what differs'); a BenchmarkError of one line naming them unless `allow_mixed`."""
    mixed = {name: [f"{label}: {m}" for label, parts in rows for m in mixed_sources(parts)] for name, rows in tables.items()}
    every = [f"{name}: {m}" for name, found in mixed.items() for m in found]
    if every and not allow_mixed:
        more = f" (and {len(every) - 1} more)" if len(every) > 1 else ""
        raise common.BenchmarkError(
            f"{every[0]}{more}. Rows of one tag must come from one args hash and one learning code: rerun the odd runs or "
            "give them their own tag, or pass --allow-mixed to report them anyway, each mix named under its table"
        )
    return mixed


def fmt_counts(values: list[str]) -> str:
    counts = defaultdict(int)
    for v in values:
        counts[v] += 1
    return ", ".join(f"{v} ({n:,})" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def sources_note(rows: list[tuple[str, list]], mixed: list[str]) -> str:
    """The line under a table: the commits and args hashes of the runs behind it, with how many runs each; then, under
    --allow-mixed, each of its rows whose runs differ."""
    runs = {}
    for _, parts in rows:
        for part in parts:
            for _, _, row in part:
                runs[(row["algo"], row["tag"], row["env"], row["budget"], row["seed"])] = row
    if not runs:
        return ""
    line = (
        f"\nSources of its {len(runs):,} runs: commit {fmt_counts([short_commit(r['commit']) for r in runs.values()])};"
        f" args hash {fmt_counts([r['args_hash'] for r in runs.values()])}"
        + (
            f" (unknown: {UNKNOWN_NOTE})."
            if any(common.UNKNOWN in (r["commit"], r["args_hash"]) for r in runs.values())
            else "."
        )
    )
    return line + ("\n\n**Mixed sources (--allow-mixed):** " + " | ".join(mixed) if mixed else "")


# The README's results table (`--readme-table`): one row per task and budget, each cell from one code.
# Our scripts' cells are today's defaults (`BASE_TAGS`) on seeds 1-2, the seeds that chose the defaults (the flagship's
# cell: `FLAGSHIP_TAG` on its 20 fresh seeds); the anchors' cells are CleanRL's scripts run outside the project on the
# same tasks, budget, evaluation and seeds (`ANCHOR_TAG`): RPO beside the control suite, PPO beside MuJoCo.
# ppo_discrete.py's runs carry run.py's default tag, in the first column. A cell is the mean ± std (population) of its
# seeds' final evaluations.
README_COLUMNS = ("ppo_continuous", "vmpo_continuous", "cleanrl_ppo", "cleanrl_rpo")
README_COLUMN_OF = {algo: i for i, algo in enumerate(README_COLUMNS)} | {"ppo_discrete": 0}
SEEDS_1_2 = (1, 2)
# The flagship's cell: its defaults on 20 fresh seeds that chose nothing (seeds 121-140 chose the default against the
# previous one), run at the commit of the default's other rows.
FLAGSHIP_TAG, FLAGSHIP_SEEDS = "half-train-episode-steps-125", tuple(range(161, 181))


def readme_columns(env: str, anchor: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A row's cells: each continuous script's defaults and `anchor` on seeds 1-2; the flagship's on its 20 seeds."""
    columns = {algo: (BASE_TAGS[algo], SEEDS_1_2) for algo in README_COLUMNS[:2]} | {anchor: (ANCHOR_TAG, SEEDS_1_2)}
    if env == common.FLAGSHIP_ENV:
        columns["vmpo_continuous"] = (FLAGSHIP_TAG, FLAGSHIP_SEEDS)
    return columns


# (task, budget, {algo: (tag, seeds)}), each algo in its column of `README_COLUMN_OF`.
README_ROWS = [
    *((env, 1_000_000, readme_columns(env, "cleanrl_rpo")) for env in common.SUITES["control"]),
    *((env, budget, readme_columns(env, "cleanrl_ppo")) for env, budget in common.MUJOCO_BARS),
    ("CartPole-v1", 100_000, {"ppo_discrete": (common.DEFAULT_TAG, (1, 2, 3))}),
]
README_HEADER = (
    "| task | budget | `ppo_continuous.py` | `vmpo_continuous.py` | CleanRL PPO | CleanRL RPO |\n" + "|---" * 6 + "|"
)


def fmt_budget(steps: int) -> str:
    return f"{steps // 1_000_000}M" if steps % 1_000_000 == 0 else f"{steps // 1000}k"


def fmt_figure(value: float, decimals: int, best: float) -> str:
    """`1,869.7`, in bold when it is the row's best."""
    text = f"{value:,.{decimals}f}"
    return f"**{text}**" if value == best else text


def readme_table(groups: dict) -> str:
    """The README's results table (Markdown) from the runs of `README_ROWS`: per cell, the mean ± std of its seeds'
    final evaluations and their count; empty where none ran. Bold: the row's highest mean. Two decimals in a row whose
    figures are all under 10 in size, else one."""
    lines = [README_HEADER]
    for env, budget, columns in README_ROWS:
        cells = [None] * len(README_COLUMNS)  # per column: the final evaluations of the seeds that ran, or None
        for algo, (tag, seeds) in columns.items():
            runs = groups.get((env, algo, group_tag(tag, seeds), budget), {})
            finals = [runs[s][-1]["eval_return"] for s in seeds if s in runs]
            cells[README_COLUMN_OF[algo]] = np.array(finals) if finals else None
        figures = [x.mean() for x in cells if x is not None]
        best = max(figures, default=None)
        decimals = 2 if all(abs(f) < 10 for f in figures) else 1
        text = [env if "ppo_discrete" not in columns else f"{env} (`ppo_discrete.py`)", fmt_budget(budget)]
        for x in cells:
            spread = f" ± {x.std():,.{decimals}f}" if x is not None and x.size > 1 else ""
            text.append("" if x is None else f"{fmt_figure(x.mean(), decimals, best)}{spread} ({x.size})")
        lines.append("|" + "|".join(f" {c} " if c else " " for c in text) + "|")
    return "\n".join(lines) + "\n"


def plot_profile(scores: dict[str, np.ndarray], path: Path, title: str, bar: str = "bar") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly

    taus = np.linspace(0.0, 2.0, 81)
    profiles, _ = rly.create_performance_profile(scores, taus)  # per config: the fraction of runs above each tau
    fig, ax = plt.subplots(figsize=(8, 4.5 + 0.2 * len(scores)), constrained_layout=True)
    for name, x in scores.items():
        ax.plot(taus, profiles[name], label=f"{name} ({x.size} runs)")
    ax.axvline(1.0, color="gray", linestyle=":")
    ax.set_xlabel(f"tau (final eval return / {bar})")
    ax.set_ylabel("fraction of runs above tau")
    ax.set_title(title, fontsize="small")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize="x-small")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seed_band(seeds: dict[int, list[dict]], x_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x grid, mean, min and max over seeds of the eval return; each seed interpolated
    linearly onto the union of their x values, up to where the shortest seed ends."""
    curves = [
        (np.array([r[x_key] for r in runs], float), np.array([r["eval_return"] for r in runs], float))
        for runs in seeds.values()
    ]
    end = min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x[x <= end] for x, _ in curves]))
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot_env(env: str, groups: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The legend goes below the plots, two columns, and the figure grows with it: walker has dozens of configs.
    legend_rows = (len(groups) + 1) // 2
    fig, axes = plt.subplots(1, 2, figsize=(11, 4 + 0.22 * legend_rows), constrained_layout=True)
    budgets_per_config = defaultdict(set)
    for _, algo, tag, budget in groups:
        budgets_per_config[(algo, tag)].add(budget)
    longest = max(r["wall_time"] for seeds in groups.values() for runs in seeds.values() for r in runs)
    unit, per_unit = next((u, d) for u, d in (("hours", 3600), ("minutes", 60), ("seconds", 1)) if longest >= 2 * d or d == 1)
    for (_, algo, tag, budget), seeds in groups.items():
        label = algo if tag == common.DEFAULT_TAG else f"{algo} [{tag}]"
        if len(budgets_per_config[(algo, tag)]) > 1:
            label += f" @{budget:,}"
        label += f" ({len(seeds)} seed{'s' * (len(seeds) > 1)})"
        for ax, x_key, scale in ((axes[0], "step", 1.0), (axes[1], "wall_time", 1 / per_unit)):
            x, mean, lo, hi = seed_band(seeds, x_key)
            (line,) = ax.plot(x * scale, mean, label=label)
            ax.fill_between(x * scale, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel(f"wall time ({unit})")
    for ax in axes:
        ax.set_ylabel("eval return (mean, min–max over seeds)")
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(env)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def flagship_groups(groups: dict) -> dict:
    """The flagship task's runs under each script's defaults (`BASE_TAGS`, and V-MPO's `FLAGSHIP_TAG`), every budget: on
    the fresh seeds where a script has them at that budget (`FLAGSHIP_TAG`'s before any other, on `FLAGSHIP_SEEDS`
    alone where it has them), else on the seeds that chose the defaults; and the anchors' runs (`ANCHOR_TAG`)."""
    tags = set(BASE_TAGS.items()) | {("vmpo_continuous", FLAGSHIP_TAG)}
    defaults = {(algo, tag + fresh) for algo, tag in tags for fresh in ("", FRESH)}
    flagship = sorted(
        (k for k in groups if k[0] == common.FLAGSHIP_ENV), key=lambda k: (k[2].endswith(FRESH), k[2] == FLAGSHIP_TAG + FRESH)
    )
    chosen = {k[:2] + k[3:]: k for k in flagship if k[1:3] in defaults or k[2] == ANCHOR_TAG}  # the one kept comes last
    if all(k[2] == ANCHOR_TAG for k in chosen.values()):
        return {}  # no curve of ours to draw

    def drawn_seeds(k: tuple) -> dict:  # FLAGSHIP_TAG's fresh runs may hold the seeds of the study that chose it
        readme_cell = {s: runs for s, runs in groups[k].items() if s in FLAGSHIP_SEEDS}
        return readme_cell if k[1:3] == ("vmpo_continuous", FLAGSHIP_TAG + FRESH) and readme_cell else groups[k]

    return {k: drawn_seeds(k) for k in sorted(chosen.values())}


def plot_flagship(groups: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6), constrained_layout=True)
    ours = {k: seeds for k, seeds in groups.items() if k[2] != ANCHOR_TAG}
    colors = {algo: f"C{i}" for i, algo in enumerate(sorted({k[1] for k in ours}))}  # one color per script
    longest = max(k[3] for k in ours)
    for (_, algo, tag, budget), seeds in ours.items():
        x, mean, lo, hi = seed_band(seeds, "step")
        style = "-" if budget == longest else "--"
        which = "fresh seeds" if tag.endswith(FRESH) else "seeds that chose the defaults"
        label = f"{algo} defaults, {budget:,} steps ({len(seeds)} {which})"
        ax.plot(x, mean, style, color=colors[algo], label=label)
        ax.fill_between(x, lo, hi, color=colors[algo], alpha=0.15, linewidth=0)
    anchors = [(k, seeds) for k, seeds in groups.items() if k[2] == ANCHOR_TAG]  # one row a run: its final evaluation
    for i, ((_, algo, _, budget), seeds) in enumerate(anchors):
        finals = [runs[-1]["eval_return"] for runs in seeds.values()]
        label = f"{algo} ({ANCHOR_TAG}), final evaluation of each seed" if i == 0 else None
        ax.plot([budget] * len(finals), finals, "k*", markersize=10, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return (mean, min–max over seeds)")
    ax.set_title(f"{common.FLAGSHIP_ENV}: deterministic evaluation of the defaults")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+", type=Path, help="results CSVs written by run.py")
    p.add_argument("--out", type=Path, help="folder for results.md and the PNGs (default: the first CSV's folder)")
    p.add_argument(
        "--readme-table", action="store_true", help="print the README's results table (README_ROWS) and write nothing"
    )
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="report a table whose rows of one tag differ in args hash or learning code (named under the table) "
        "instead of refusing it",
    )
    args = p.parse_args()
    rows = common.read_results(args.csv)
    if not rows:
        raise common.BenchmarkError(f"no result rows in {[str(c) for c in args.csv]}")
    groups = group_runs(rows)
    if args.readme_table:
        cells = readme_parts(groups)
        mixed = check_sources({"README table": cells}, args.allow_mixed)["README table"]
        print(readme_table(groups), end="")
        print(sources_note(cells, mixed).strip(), file=sys.stderr)  # stdout stays the table README.md holds
        return 0
    tables = table_parts(groups)
    mixed = check_sources(tables, args.allow_mixed)  # before anything is written

    def note(name: str) -> str:
        return sources_note(tables[name], mixed[name])

    out = args.out or args.csv[0].parent
    out.mkdir(parents=True, exist_ok=True)
    envs = sorted({k[0] for k in groups})
    md = table(groups, note("results table"))
    md += "\nLearning curves: " + ", ".join(f"[{env}](curves/curves_{common.slug(env)}.png)" for env in envs) + ".\n"
    summary = aggregate(groups, out, note=note("aggregate"))
    if summary.count("\n") > 2:
        md += "\n" + summary
    md += "\n" + table22(groups, out, note=note("table22"))
    md += "\n" + table30(groups, note=note("table30"))
    paired = paired_table(groups)
    md += "\n" + paired if paired else ""
    walltime = walltime_table(groups)
    md += "\n" + walltime if walltime else ""
    finals = final_table(args.csv)
    md += "\n" + finals if finals else ""
    flagship = flagship_groups(groups)
    if flagship:
        md += "\nThe README's picture, walker/walk under each script's defaults beside RPO: [flagship](flagship.png).\n"
    (out / "results.md").write_text(md)
    print(md, end="")
    (out / "curves").mkdir(exist_ok=True)
    for env in envs:
        path = out / "curves" / f"curves_{common.slug(env)}.png"
        plot_env(env, {k: v for k, v in groups.items() if k[0] == env}, path)
        print(f"wrote {path}")
    if flagship:
        plot_flagship(flagship, out / "flagship.png")
        print(f"wrote {out / 'flagship.png'}")
    print(f"wrote {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

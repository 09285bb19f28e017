r"""Hyperparameter search with Optuna over an algorithm script's real command line.

    python benchmarks/tune.py --algo vmpo_continuous --env dm_control/cartpole/balance \
        --budget 200k --trials 40 [--seeds 1 2] [--storage URL] [--study NAME] [-- fixed script args]
    python benchmarks/tune.py --algo vmpo_continuous --suite control --trials 20 --seeds 1 2


Each trial samples flags from the script's search space (`sample_<algo>` below, one
function per script) and runs `<script> --env-id ENV --seed S --total-timesteps BUDGET
--output-dir <trial>/seed<S>/tb [--eval-interval BUDGET/EVALS] <sampled flags> <fixed args>`
in its own process, one per seed, the seeds in parallel. While they run, their
`eval/return_mean` points are read back from the TensorBoard events; the mean over seeds of
each evaluation is reported to Optuna (at its slot k * eval_interval, see `Objective`), whose
pruner (median by default) may stop the trial: its processes are then terminated (killed if
they do not stop) and waited for. The objective is
the final deterministic evaluation, averaged over the seeds. A run that exits non-zero (bad
sampled values, a NaN stop) fails its trial; the study goes on.

Several tasks (`--env A B ...` with `--budget ENV=N` each, or `--suite NAME`): each trial runs every
task with every seed, all in parallel, and one configuration is scored on all of them, so that no
single task decides it. A task's score is its return (mean over seeds) relative to a reference return:
the widely used PPO's figure where `common.REFERENCE_RETURNS` has one (`--reference ENV=R` sets or
overrides it), else 1000 on dm_control tasks (their most an episode can earn). The objective is the
geometric mean of the scores, each at least SCORE_FLOOR: a relative gain counts the same on every
task, a task's scale does not change the ranking, and a task that fails pulls the whole score down
however well the others do. Evaluations are reported to the pruner at the same fraction of every
task's budget (k / --evals), on the step axis of the longest budget.

Storage: a SQLite file `<out>/study.db` by default, so the same command again resumes the
study (`--trials` counts the finished trials, complete or pruned, already stored).
`--storage` takes any Optuna storage URL (postgresql://, mysql://, sqlite:///) or a journal
file (`journal:PATH`, or a path ending in `.log`): N machines running the same command with
the same `--storage` join one study. Watch it live with `optuna-dashboard <storage>`.

On a cluster, `--slurm N` submits N such workers as one Slurm array job, each task this command without the Slurm
options, all on the same `--storage` (checked, and the study created, before anything is submitted). A storage the
nodes cannot share safely is refused in one line: a relative path (each worker would find its own file), an
in-memory database, SQLite on a network filesystem (its locks do not hold there). What works: PostgreSQL, MySQL, or
a journal file on a shared filesystem. `--dry-run` prints the job script; `--wait` waits for the workers and reports.

Written to `--out` (default `benchmarks/results/tune/<study>/`) when the tool stops, also
after Ctrl-C: `trials.csv`, `best.md` (best 10), `best_command.txt`, `history.png`,
`intermediate.png` and `importances.png`. Trial runs (logs, TensorBoard events,
checkpoints) live in `<out>/trials/<number>/seed<S>/` (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import slurm  # noqa: E402

MANAGED = ("--env-id", "--seed", "--total-timesteps", "--output-dir")
POLL_SECONDS = 1.0  # how often a running trial's TensorBoard events are read
STOP_SECONDS = 10.0  # grace between terminate and kill of a pruned trial's process
LOG_TAIL_LINES = 8
DRY_SAMPLES = 16  # random draws of the search space at start-up: parameter names, flags the script accepts
BEST_ROWS = 10
HEARTBEAT_SECONDS, GRACE_SECONDS = 60, 180  # RDB storages: a trial whose worker died is failed after the grace
COUNTED = ("COMPLETE", "PRUNED")  # the finished trials that --trials counts (a failed one is retried)
FAILURES_IN_A_ROW = 10  # a worker gives up after this many failed trials in a row (a broken setup, not bad luck)
SCORE_FLOOR = 0.01  # several tasks: a task's score (return / reference) counts as at least this in the geometric mean
DM_CONTROL_MAX_RETURN = 1000.0  # 1000 steps of a reward in [0, 1]: the reference of a dm_control task without a figure


# ---------------------------------------------------------------------------------------
# Search spaces: one function per script, `sample_<algo>(trial, args) -> list of CLI flags`.
# Parameter names are the scripts' `Args` field names. `args` is the script's Args with its
# defaults and the fixed args after `--`, so a space can follow what the script offers.
# ---------------------------------------------------------------------------------------
def sample_ppo_discrete(trial: SearchTrial, args: Any) -> list[str]:
    return flags(
        learning_rate=trial.suggest_float("learning_rate", 3e-5, 3e-3, log=True),
        num_envs=trial.suggest_categorical("num_envs", [4, 8, 16, 32]),
        num_steps=trial.suggest_categorical("num_steps", [8, 16, 32, 64, 128, 256, 512]),
        num_minibatches=trial.suggest_categorical("num_minibatches", [1, 2, 4, 8, 16]),
        update_epochs=trial.suggest_int("update_epochs", 1, 20),
        clip_coef=trial.suggest_categorical("clip_coef", [0.1, 0.2, 0.3, 0.4]),
        gamma=trial.suggest_categorical("gamma", [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]),
        gae_lambda=trial.suggest_categorical("gae_lambda", [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0]),
        ent_coef=trial.suggest_float("ent_coef", 1e-8, 0.1, log=True),
        vf_coef=trial.suggest_float("vf_coef", 0.1, 1.0),
        max_grad_norm=trial.suggest_categorical("max_grad_norm", [0.3, 0.5, 1.0, 2.0, 5.0]),
        policy_hidden_sizes=layers(
            trial.suggest_categorical("policy_hidden_sizes", ["64x64", "128x128", "256x256", "64x64x64"])
        ),
        value_hidden_sizes=layers(
            trial.suggest_categorical("value_hidden_sizes", ["64x64", "128x128", "256x256", "64x64x64"])
        ),
        anneal_lr=trial.suggest_categorical("anneal_lr", [True, False]),
    )


def sample_ppo_continuous(trial: SearchTrial, args: Any) -> list[str]:
    return flags(
        learning_rate=trial.suggest_float("learning_rate", 3e-5, 3e-3, log=True),
        num_envs=trial.suggest_categorical("num_envs", [1, 2, 4, 8, 16]),
        num_steps=trial.suggest_categorical("num_steps", [64, 128, 256, 512, 1024, 2048]),
        num_minibatches=trial.suggest_categorical("num_minibatches", [1, 2, 4, 8, 16, 32]),
        update_epochs=trial.suggest_int("update_epochs", 1, 20),
        clip_coef=trial.suggest_categorical("clip_coef", [0.1, 0.2, 0.3, 0.4]),
        gamma=trial.suggest_categorical("gamma", [0.95, 0.98, 0.99, 0.995, 0.999]),
        gae_lambda=trial.suggest_categorical("gae_lambda", [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0]),
        ent_coef=trial.suggest_float("ent_coef", 1e-8, 1e-2, log=True),
        vf_coef=trial.suggest_float("vf_coef", 0.1, 1.0),
        max_grad_norm=trial.suggest_categorical("max_grad_norm", [0.3, 0.5, 1.0, 2.0, 5.0]),
        policy_hidden_sizes=layers(trial.suggest_categorical("policy_hidden_sizes", ["64x64", "128x128", "256x256"])),
        value_hidden_sizes=layers(trial.suggest_categorical("value_hidden_sizes", ["64x64", "128x128", "256x256", "512x512"])),
        init_log_std=trial.suggest_float("init_log_std", -2.0, 0.5) if trains_gaussian(args) else None,
        anneal_lr=trial.suggest_categorical("anneal_lr", [True, False]),
        reward_scaling=trial.suggest_categorical("reward_scaling", [True, False]),
    )


def sample_vmpo_continuous(trial: SearchTrial, args: Any) -> list[str]:
    sampled = flags(
        policy_lr=trial.suggest_float("policy_lr", 3e-5, 3e-3, log=True),
        value_lr=trial.suggest_float("value_lr", 3e-5, 3e-3, log=True),
        num_envs=trial.suggest_categorical("num_envs", [4, 8, 16]),
        num_steps=trial.suggest_categorical("num_steps", [32, 64, 128, 256, 512]),
        m_steps=trial.suggest_categorical("m_steps", [1, 4, 10, 20, 40, 80, 120]),
        num_minibatches=trial.suggest_categorical("num_minibatches", [1, 2, 4, 8, 16]),  # all divide every rollout here
        topk_fraction=trial.suggest_float("topk_fraction", 0.2, 1.0),
        epsilon_eta=trial.suggest_float("epsilon_eta", 0.01, 1.0, log=True),
        epsilon_mu=trial.suggest_float("epsilon_mu", 1e-3, 0.5, log=True),
        epsilon_sigma=trial.suggest_float("epsilon_sigma", 1e-5, 1e-2, log=True),
        temperature_lr=trial.suggest_float("temperature_lr", 1e-3, 0.1, log=True),
        alpha_lr=trial.suggest_float("alpha_lr", 1e-3, 0.1, log=True),
        gamma=trial.suggest_categorical("gamma", [0.95, 0.98, 0.99, 0.995]),
        gae_lambda=trial.suggest_categorical("gae_lambda", [0.8, 0.9, 0.95, 0.98, 1.0]),
        policy_hidden_sizes=layers(
            trial.suggest_categorical("policy_hidden_sizes", ["64x64", "128x128", "256x256", "512x512"])
        ),
        value_hidden_sizes=layers(trial.suggest_categorical("value_hidden_sizes", ["64x64", "128x128", "256x256", "512x512"])),
        ppo_like_backbone=trial.suggest_categorical("ppo_like_backbone", [False, True]),
        anneal_lr=trial.suggest_categorical("anneal_lr", [False, True]),
    )
    # Departures from the paper (the V-MPO issue), searched where the script has them.
    if hasattr(args, "m_step"):
        sampled += flags(m_step=trial.suggest_categorical("m_step", literal_choices(args, "m_step")))
    if hasattr(args, "m_step_clip"):
        sampled += flags(m_step_clip=trial.suggest_categorical("m_step_clip", [0.1, 0.2, 0.3]))
    if hasattr(args, "init_log_std") and trains_gaussian(args):
        sampled += flags(init_log_std=trial.suggest_float("init_log_std", -2.0, 0.5))
    return sampled


SAMPLERS: dict[str, Callable[[SearchTrial, Any], list[str]]] = {
    "ppo_discrete": sample_ppo_discrete,
    "ppo_continuous": sample_ppo_continuous,
    "vmpo_continuous": sample_vmpo_continuous,
}


# ---------------------------------------------------------------------------------------
# What the samplers use
# ---------------------------------------------------------------------------------------
class SearchTrial:
    """The Optuna trial as a sampler sees it. A parameter outside the search (fixed after `--`,
    or left out by `--params`) is not suggested: `suggest_*` returns None, and `flags()` leaves
    it out, so the script's own default or the fixed value applies."""

    def __init__(self, trial, searched: Callable[[str], bool]):
        self.trial, self.searched = trial, searched

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float | None:
        return self.trial.suggest_float(name, low, high, log=log) if self.searched(name) else None

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int | None:
        return self.trial.suggest_int(name, low, high, log=log) if self.searched(name) else None

    def suggest_categorical(self, name: str, choices: Sequence) -> Any:
        return self.trial.suggest_categorical(name, list(choices)) if self.searched(name) else None


def flags(**values) -> list[str]:
    """`flags(num_envs=8, anneal_lr=False, hidden_sizes=[64, 64])` -> `--num-envs 8 --no-anneal-lr
    --hidden-sizes 64 64`; None values are left out, floats keep 4 significant digits."""
    out = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, f"{value:.4g}" if isinstance(value, float) else str(value)]
    return out


def layers(choice: str | None) -> list[int] | None:
    """A hidden-sizes choice such as '256x256' -> [256, 256]."""
    return None if choice is None else [int(w) for w in choice.split("x")]


def trains_gaussian(args: Any) -> bool:
    """Whether the script's --policy (auto: the Gaussian on the control suite) trains the Gaussian, whose
    --init-log-std the search may set: the Beta has no std, and the script refuses the flag for it."""
    policy = getattr(args, "policy", "gaussian")
    return policy == "gaussian" or (policy == "auto" and args.env_id.startswith("dm_control/"))


def literal_choices(args: Any, name: str) -> list:
    """The values a `Literal[...]` field of the script's Args accepts."""
    return list(typing.get_args(typing.get_type_hints(type(args))[name]))


# ---------------------------------------------------------------------------------------
# Command line and start-up checks (all before the first trial)
# ---------------------------------------------------------------------------------------
@dataclass
class Task:
    """One env of the study at its budget."""

    env: str
    budget: int
    tool_args: list[str]  # script args the tool adds (the evaluation interval)
    base_args: Any  # the script's Args: its defaults, the env, the budget and the fixed args
    reference: float | None  # several tasks: the return that scores 1


@dataclass
class Setup:
    script: Path
    tasks: list[Task]
    seeds: list[int]
    trials: int
    fixed: list[str]  # script args after `--`
    study: str
    out: Path
    storage: str  # as the user gives it to optuna-dashboard
    searched: Callable[[str], bool]
    space_names: list[str]
    pruner: str
    warmup: int
    startup_trials: int
    sampler_seed: int | None
    submit: argparse.Namespace | None = None  # --slurm N and the options of its job; None: this process is a worker
    worker_argv: list[str] = field(default_factory=list)  # a Slurm task's command: this one without --slurm

    @property
    def algo(self) -> str:
        return self.script.stem

    @property
    def single(self) -> bool:
        return len(self.tasks) == 1

    @property
    def longest(self) -> int:
        return max(t.budget for t in self.tasks)

    @property
    def config(self) -> dict:
        """What defines the study: a second worker or a rerun must match it."""
        if self.single:
            (task,) = self.tasks
            where = {"env": task.env, "budget": task.budget}
            tool_args: Any = task.tool_args
        else:
            where = {"tasks": {t.env: t.budget for t in self.tasks}, "references": {t.env: t.reference for t in self.tasks}}
            tool_args = {t.env: t.tool_args for t in self.tasks}
        return {
            "algo": self.algo,
            **where,
            "seeds": self.seeds,
            "fixed_args": self.fixed,
            "tool_args": tool_args,
            "searched": sorted(filter(self.searched, self.space_names)),
        }

    def describe(self) -> str:
        """'walker/walk, 200,000 steps' or '3 tasks (balance 200k, ...)'."""
        if self.single:
            return f"{self.tasks[0].env}, {self.tasks[0].budget:,} steps"
        return f"{len(self.tasks)} tasks (" + ", ".join(f"{t.env} {steps_text(t.budget)}" for t in self.tasks) + ")"

    def score(self, returns: dict[str, float]) -> float:
        """The objective from each task's return (mean over seeds): that return for one task; for several,
        the geometric mean over tasks of return / reference, each at least SCORE_FLOOR."""
        if self.single:
            return returns[self.tasks[0].env]
        # LaTeX: J = \Big(\prod_{k=1}^{K} \max\big(R_k / R_k^{\mathrm{ref}},\ 0.01\big)\Big)^{1/K}
        logs = [math.log(max(returns[t.env] / t.reference, SCORE_FLOOR)) for t in self.tasks]
        return math.exp(sum(logs) / len(logs))


def steps_text(n: int) -> str:
    """200000 -> '200k', 1000000 -> '1M', 2048 -> '2048'."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def parse_cli(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    own, fixed = common.split_passthrough(argv)
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --algo ALGO (--env ENV [ENV ...] --budget N|ENV=N [...] | --suite NAME) --trials N "
        "[options] [-- script args]",
    )
    p.add_argument("--algo", required=True, help=f"one of {', '.join(SAMPLERS)}")
    p.add_argument(
        "--env",
        nargs="+",
        help="env id(s), e.g. dm_control/cartpole/balance or CartPole-v1; several: one config scored on all",
    )
    p.add_argument(
        "--suite", choices=sorted(common.SUITES), help="the tasks and budgets of a named suite (--env / --budget add to it)"
    )
    p.add_argument(
        "--budget", nargs="+", default=[], help="env steps per trial run: N for every env and/or ENV=N per env (200k, 1M)"
    )
    p.add_argument(
        "--reference",
        nargs="+",
        default=[],
        metavar="ENV=R",
        help="several tasks: the return that scores 1 on ENV (default: the widely used PPO's figure, or 1000 on dm_control)",
    )
    p.add_argument(
        "--trials",
        type=int,
        required=True,
        help="finished trials (complete or pruned) the study should have; reruns count the stored ones",
    )
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[1],
        help="seeds of each trial, run in parallel; the objective is the mean of their final evaluations (default: 1)",
    )
    p.add_argument(
        "--storage",
        help="Optuna storage URL (postgresql://, mysql://, sqlite:///) or a journal file "
        "(journal:PATH or PATH.log); default: sqlite:///<out>/study.db",
    )
    p.add_argument("--study", help="study name (default: <algo>-<env>-<budget>)")
    p.add_argument("--out", type=Path, help="outputs and trial runs (default: benchmarks/results/tune/<study>/)")
    p.add_argument(
        "--params",
        nargs="+",
        metavar="NAME",
        help="search only these parameters of the space; the others keep the script's defaults (default: the whole space)",
    )
    p.add_argument(
        "--evals",
        type=int,
        default=5,
        help="evaluations per run: sets --eval-interval BUDGET/EVALS "
        "unless the script args give one; 0 keeps the script's own (default: 5)",
    )
    p.add_argument(
        "--pruner", default="median", help="median (default), none, or threshold:X (prune a trial whose evaluation is below X)"
    )
    p.add_argument("--warmup", help="env steps before a trial can be pruned (default: a third of the budget)")
    p.add_argument(
        "--startup-trials", type=int, default=5, help="median pruner: trials that complete before pruning starts (default: 5)"
    )
    p.add_argument("--sampler-seed", type=int, help="seed of the TPE sampler (reproducible with one worker)")
    p.add_argument(
        "--slurm",
        type=int,
        metavar="N",
        help="submit N workers as one Slurm array job, all joining the study on --storage (a storage the nodes share)",
    )
    p.add_argument("--dry-run", action="store_true", help="with --slurm: print the job script, submit nothing")
    slurm.add_options(p, cpus_default="the runs of a trial, tasks x seeds")
    return p.parse_args(own), fixed


def load_args(module, argv: list[str], script: Path, what: str):
    """The script's Args from ``argv`` through its own parser (tyro); a parse error becomes one line
    naming ``what`` was rejected."""
    import tyro

    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            return tyro.cli(module.Args, args=argv, prog=script.name)
    except SystemExit:
        lines = [ln.strip() for ln in text.getvalue().splitlines()]
        detail = next((ln for ln in lines[1:] if ln and set(ln) != {"-"}), "rejected")
        raise common.BenchmarkError(f"{script.name} rejects {what}: {detail}") from None


def check_script_args(module, args) -> None:
    """The script's own argument and env checks (its `check_args`), as one line on failure.

    The continuous scripts choose MuJoCo's GL backend first (`choose_gl_backend` sets MUJOCO_GL for
    this process); the trials' own processes must choose theirs, so the variable is put back after.
    `ppo_discrete.py` renders no MuJoCo and has no backend to choose.
    """
    saved = os.environ.get("MUJOCO_GL")
    try:
        if hasattr(module, "choose_gl_backend"):
            module.check_args(args, module.choose_gl_backend(args.capture_video))
        else:
            module.check_args(args)
    except Exception as e:
        if type(e).__name__ == "ConfigError":  # the script's own message
            raise common.BenchmarkError(str(e)) from None
        first = (str(e).splitlines() or [""])[0]
        raise common.BenchmarkError(
            f"{module.__name__}.py failed to check its args and env {args.env_id!r}: {type(e).__name__}: {first}"
        ) from None
    finally:
        os.environ.pop("MUJOCO_GL", None)
        if saved is not None:
            os.environ["MUJOCO_GL"] = saved


def fixed_names(fixed: list[str], arg_names: set[str]) -> set[str]:
    """Args field names the script args after `--` set (`--num-envs 4`, `--no-anneal-lr`, `--x=1`)."""
    names = set()
    for token in fixed:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name[3:] if name.startswith("no_") and name not in arg_names else name)
    return names & arg_names


def dry_samples(sampler, args, searched: Callable[[str], bool]) -> tuple[list[str], list[list[str]]]:
    """Draw the space a few times in memory: the parameter names it has and example flag lists."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    names: dict[str, None] = {}
    samples = []
    for _ in range(DRY_SAMPLES):
        trial = study.ask()
        samples.append(sampler(SearchTrial(trial, searched), args))
        names.update(dict.fromkeys(trial.params))
    optuna.logging.set_verbosity(optuna.logging.INFO)
    return list(names), samples


def make_pruner(spec: str, warmup: int, startup_trials: int):
    import optuna

    if spec == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup)
    if spec == "none":
        return optuna.pruners.NopPruner()
    if spec.startswith("threshold:"):
        try:
            lower = float(spec.split(":", 1)[1])
        except ValueError:
            lower = math.nan
        if math.isfinite(lower):
            return optuna.pruners.ThresholdPruner(lower=lower, n_warmup_steps=warmup)
    raise common.BenchmarkError(f"--pruner {spec!r}: use median, none or threshold:X (X a number)")


def setup(argv: Sequence[str]) -> Setup:
    """Parse and check everything that can be checked without running a trial."""
    opts, fixed = parse_cli(argv)
    slurm.validate(opts, opts.slurm is not None)
    if opts.slurm is not None and opts.slurm < 1:
        raise common.BenchmarkError(f"--slurm N: N is the number of workers, at least 1; got {opts.slurm}")
    if opts.dry_run and opts.slurm is None:
        raise common.BenchmarkError("--dry-run prints the Slurm job script: give --slurm N")
    if opts.sampler_seed is not None and (opts.slurm or 1) > 1:
        raise common.BenchmarkError(f"--sampler-seed with --slurm {opts.slurm}: every worker would draw the same points")
    script = common.resolve_script(opts.algo)
    if script.stem not in SAMPLERS:
        raise common.BenchmarkError(
            f"--algo {opts.algo!r}: no search space for {script.stem} (tune.py has one for {', '.join(SAMPLERS)})"
        )
    common.reject_managed(fixed, MANAGED, "tune.py")
    if not opts.env and not opts.suite:
        raise common.BenchmarkError("give --env ENV [ENV ...] with --budget, or --suite NAME")
    envs, budget_items = list(opts.env or []), list(opts.budget)
    if opts.suite:  # the suite's envs and budgets first; the command line's own --env / --budget ENV=N after them
        envs = list(common.SUITES[opts.suite]) + envs
        budget_items = [f"{env}={steps}" for env, steps in common.SUITES[opts.suite].items()] + budget_items
    envs = list(dict.fromkeys(envs))
    budgets = common.parse_budgets(budget_items, envs)
    references = task_references(opts.reference, envs)
    if opts.trials < 1 or opts.evals < 0 or opts.startup_trials < 0:
        raise common.BenchmarkError("--trials must be >= 1, --evals and --startup-trials >= 0")
    longest = max(budgets.values())
    warmup = longest // 3 if opts.warmup is None else 0 if opts.warmup == "0" else common.parse_steps(opts.warmup)
    make_pruner(opts.pruner, warmup, opts.startup_trials)  # a bad --pruner fails here
    module = common.load_script(script)
    arg_names = {f.name for f in fields(module.Args)}
    fixed_set = fixed_names(fixed, arg_names)
    gives_interval = "eval_interval" in fixed_set
    tasks = []
    for env, budget in budgets.items():
        tool_args = [] if gives_interval or opts.evals == 0 else ["--eval-interval", str(max(1, budget // opts.evals))]
        base_argv = ["--env-id", env, "--total-timesteps", str(budget), *tool_args, *fixed]
        base = load_args(module, base_argv, script, f"the script args after -- ({shlex.join(fixed)})")
        check_script_args(module, base)  # the env id and the fixed args, with the script's own messages
        tasks.append(Task(env, budget, tool_args, base, references.get(env)))
    base = tasks[0].base_args  # the search space follows the script's Args, not the env

    sampler = SAMPLERS[script.stem]
    space, _ = dry_samples(sampler, base, lambda name: True)
    unknown = sorted(set(opts.params or []) - set(space))
    if unknown:
        raise common.BenchmarkError(
            f"--params {' '.join(unknown)}: not in the search space of {script.stem} ({', '.join(space)})"
        )
    only = set(opts.params or space)
    searched = lambda name: name in only and name not in fixed_set  # noqa: E731
    if not any(map(searched, space)):
        raise common.BenchmarkError("nothing to search: every parameter is fixed by the script args after --")
    base_argv = ["--env-id", tasks[0].env, "--total-timesteps", str(tasks[0].budget), *tasks[0].tool_args, *fixed]
    for sample in dry_samples(sampler, base, searched)[1][:2]:  # the space's flags are the script's flags
        load_args(module, [*base_argv, *sample], script, f"flags of its search space ({shlex.join(sample)})")

    if opts.study:
        study = opts.study
    elif len(tasks) == 1:
        study = f"{script.stem}-{common.slug(tasks[0].env.replace('/', '-'))}-{steps_text(tasks[0].budget)}"
    elif opts.suite and envs == list(common.SUITES[opts.suite]):
        study = f"{script.stem}-suite-{opts.suite}"
    else:
        study = f"{script.stem}-" + "+".join(common.slug(t.env.split("/", 1)[-1].replace("/", "-")) for t in tasks)
    out = (opts.out or common.ROOT / "benchmarks" / "results" / "tune" / common.slug(study)).resolve()
    storage = opts.storage or f"sqlite:///{out / 'study.db'}"
    if opts.slurm is not None:
        problem = shared_storage_problem(storage)
        if problem:
            raise common.BenchmarkError(problem)
    s = Setup(
        script,
        tasks,
        list(dict.fromkeys(opts.seeds)),
        opts.trials,
        fixed,
        study,
        out,
        storage,
        searched,
        space,
        opts.pruner,
        warmup,
        opts.startup_trials,
        opts.sampler_seed,
    )
    if opts.slurm is not None:
        own, _ = common.split_passthrough(argv)
        s.submit = opts
        s.worker_argv = [*slurm.strip_options(own, slurm_takes_value=True), *(["--", *fixed] if fixed else [])]
    return s


def task_references(items: list[str], envs: list[str]) -> dict[str, float]:
    """{env: the return that scores 1} for a study over several tasks: `--reference ENV=R`, else the
    widely used PPO's figure, else dm_control's most; {} for one task (its objective is its return)."""
    given = {}
    for item in items:
        env, _, value = item.rpartition("=")
        try:
            given[env] = float(value)
        except ValueError:
            given[env] = math.nan
        if env not in envs or not (math.isfinite(given[env]) and given[env] > 0):
            raise common.BenchmarkError(
                f"--reference {item!r}: give ENV=R with ENV one of the study's envs and R a positive return"
            )
    if len(envs) == 1:
        if given:
            raise common.BenchmarkError(
                "--reference scores a study over several tasks; with one env the objective is its return"
            )
        return {}
    references = {}
    for env in envs:
        reference = given.get(env, common.REFERENCE_RETURNS.get(env))
        if reference is None and env.startswith("dm_control/"):
            reference = DM_CONTROL_MAX_RETURN
        if reference is None:
            raise common.BenchmarkError(f"no reference return for {env}: give --reference {env}=R (the return that scores 1)")
        references[env] = reference
    return references


# ---------------------------------------------------------------------------------------
# Storage and study
# ---------------------------------------------------------------------------------------
def journal_path(storage: str) -> str | None:
    if storage.startswith("journal:"):
        return storage[len("journal:") :]
    if "://" not in storage and storage.endswith(".log"):
        return storage
    return None


# Filesystems whose file locks SQLite cannot trust (SQLite's own advice: no database on a network filesystem).
NETWORK_FILESYSTEMS = {
    *("nfs", "nfs4", "cifs", "smb3", "smbfs", "afs", "9p", "lustre", "gpfs", "beegfs", "ceph", "glusterfs"),
    *("panfs", "pvfs2", "orangefs", "wekafs", "ocfs2", "gfs2", "fuse.glusterfs", "fuse.sshfs", "fuse.ceph"),
    *("fuse.cephfs", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone"),
}
SHARED_STORAGES = (
    "PostgreSQL (postgresql://USER:PASSWORD@HOST/DB), MySQL (mysql+pymysql://USER:PASSWORD@HOST/DB), "
    "or a journal file on a filesystem every node mounts (journal:/ABSOLUTE/PATH.log)"
)


def filesystem_type(path: str | Path, mountinfo: str | Path = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem `path` is on (`ext4`, `nfs4`, ...), from the mount table; None where there is none."""
    path = os.path.realpath(path)
    best, kind = "", None
    with contextlib.suppress(OSError):
        for line in Path(mountinfo).read_text().splitlines():
            cells = line.split()
            if "-" not in cells[6:]:
                continue
            mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), cells[4])  # \040 is a space
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, kind = mount, cells[cells.index("-", 6) + 1]
    return kind


def shared_storage_problem(storage: str) -> str | None:
    """Why N workers on several nodes cannot share `storage` (--slurm), or None. A relative path names another file in
    each worker's folder; SQLite's locks do not hold on a network filesystem (a corrupt or split study)."""
    path = journal_path(storage)
    why = None
    if path is not None:
        if not os.path.isabs(path):
            why = "a relative path, which a worker resolves in its own folder"
    elif storage.startswith("sqlite:"):
        file = storage.split(":///", 1)[1].split("?", 1)[0] if ":///" in storage else ""
        if file in ("", ":memory:"):
            why = "an in-memory SQLite database lives in one process"
        elif not os.path.isabs(file):
            why = "a relative path (sqlite:///PATH; sqlite:////PATH is absolute), which a worker resolves in its own folder"
        elif (kind := filesystem_type(Path(file).parent)) in NETWORK_FILESYSTEMS:
            why = f"SQLite on a network filesystem ({kind}), where its file locks do not hold"
    if why is None:
        return None
    return f"--storage {storage!r} cannot be shared by workers on several nodes: {why}; use {SHARED_STORAGES}"


def dashboard_target(storage: str) -> str:
    """What to give `optuna-dashboard` for this storage."""
    path = journal_path(storage)
    return shlex.quote(str(Path(path).resolve())) if path else shlex.quote(storage)


def open_storage(storage: str):
    """A journal file (with its file lock) or an RDB URL (with heartbeats, so a dead worker's trial is failed)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = journal_path(storage)
    if path is None and "://" not in storage:
        raise common.BenchmarkError(
            f"--storage {storage!r}: give an Optuna storage URL (sqlite:///PATH, "
            "postgresql://..., mysql://...) or a journal file (journal:PATH or PATH.log)"
        )
    try:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(str(Path(path).resolve())))
        if storage.startswith("sqlite:///"):
            Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(storage, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS)
    except Exception as e:
        raise common.BenchmarkError(f"--storage {storage!r}: cannot open it ({str(e).splitlines()[0]})") from None


def open_study(s: Setup):
    """Create or load the study; refuse to join one that was started with another config."""
    import optuna

    study = optuna.create_study(
        storage=open_storage(s.storage),
        study_name=s.study,
        direction="maximize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=s.sampler_seed, constant_liar=True),
        pruner=make_pruner(s.pruner, s.warmup, s.startup_trials),
    )
    stored = study.user_attrs.get("config")
    if stored is None:
        study.set_user_attr("config", s.config)
    elif stored != s.config:
        diff = {k: (stored.get(k), v) for k, v in s.config.items() if stored.get(k) != v}
        raise common.BenchmarkError(
            f"study {s.study!r} in {s.storage} was started with another config "
            f"(stored, now): {diff}; give this search its own --study"
        )
    return study


def count_finished(study) -> int:
    return sum(t.state.name in COUNTED for t in study.get_trials(deepcopy=False))


# ---------------------------------------------------------------------------------------
# One trial: the seeds' runs in parallel, their evaluations reported as they appear
# ---------------------------------------------------------------------------------------
class TrialFailed(Exception):
    """A run of the trial exited non-zero or logged no evaluation: the trial is marked FAILED."""


class ShortFailure(logging.Filter):
    """Optuna logs a failed trial with its traceback; a failed run or a Ctrl-C says all in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], (TrialFailed, KeyboardInterrupt)):
            record.exc_info = None
        return True


class SeedRun:
    """One task and seed of one trial: the script's process, its log, its evaluations read back as they appear."""

    def __init__(self, s: Setup, task: Task, trial_dir: Path, seed: int, sampled: list[str], env: dict):
        self.task, self.seed = task, seed
        self.dir = trial_dir / ("" if s.single else common.slug(task.env)) / f"seed{seed}"
        self.dir.mkdir(parents=True)
        self.command = [
            sys.executable,
            str(s.script),
            "--env-id",
            task.env,
            "--seed",
            str(seed),
            "--total-timesteps",
            str(task.budget),
            "--output-dir",
            str(self.dir / "tb"),
            *task.tool_args,
            *sampled,
            *s.fixed,
        ]
        self.log = open(self.dir / "log.txt", "w")
        self.proc = subprocess.Popen(self.command, cwd=self.dir, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.reader: common.EvalReader | None = None

    def evals(self) -> dict[int, float]:
        """{step: eval/return_mean} logged so far (the run directory appears once the script opens its writer)."""
        if self.reader is None:
            run_dirs = [d for d in (self.dir / "tb").glob("*") if d.is_dir()]
            if not run_dirs:
                return {}
            self.reader = common.EvalReader(run_dirs[0])
        return {p["step"]: p["eval_return"] for p in self.reader.read()}

    def failure(self) -> str:
        tail = (self.dir / "log.txt").read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
        return (
            f"{self.task.env} seed {self.seed} exited with code {self.proc.returncode} ({self.dir / 'log.txt'}): "
            + " | ".join(line.strip() for line in tail)
        )

    def stop(self) -> None:
        """End the process (terminate, then kill) and wait for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Objective:
    """Run one trial: its runs (tasks x seeds) in parallel, their evaluations reported to Optuna as they appear.

    An evaluation is reported at its slot ``k * eval_interval`` (the multiple of the interval it
    follows), not at its exact step: the scripts evaluate at the first update past each multiple,
    so trials with different batch sizes evaluate at different steps, and the median pruner only
    compares values reported at the same step. The final evaluation is reported at the budget.
    With several tasks a slot is put on the longest budget's step axis (slot / budget * longest),
    and a value is reported once every run has evaluated there: the score of the tasks' means.
    """

    def __init__(self, s: Setup):
        self.s = s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # The runs share the cores, unless the user chose otherwise.
        # The scripts' update and EnvPool (--torch-threads 0) follow it.
        runs = len(s.tasks) * len(s.seeds)
        self.env.setdefault("OMP_NUM_THREADS", str(max(1, common.cores() // runs)))

    def slots(self, task: Task, curve: dict[int, float]) -> dict[int, float]:
        """{step: eval} -> {slot on the reporting axis: eval}. The first evaluation in a slot wins: a second
        one there can only be the final evaluation (a budget that is not a multiple of the batch), reported
        at the budget."""
        interval = task.base_args.eval_interval  # the same for every trial: no sampler sets it
        slotted: dict[int, float] = {}
        for step in sorted(curve) if interval else []:
            slot = min(task.budget, step // interval * interval)
            slotted.setdefault(slot * self.s.longest // task.budget, curve[step])
        return slotted

    def task_means(self, runs: list[SeedRun], values: list[float]) -> dict[str, float]:
        """{env: mean over its seeds} from one value per run."""
        by_task: dict[str, list[float]] = {}
        for run, value in zip(runs, values, strict=True):
            by_task.setdefault(run.task.env, []).append(value)
        return {env: sum(v) / len(v) for env, v in by_task.items()}

    def __call__(self, trial) -> float:
        s = self.s
        sampled = SAMPLERS[s.algo](SearchTrial(trial, s.searched), s.tasks[0].base_args)
        trial.set_user_attr("flags", sampled)
        trial_dir = s.out / "trials" / str(trial.number)
        if trial_dir.exists():
            shutil.rmtree(trial_dir)  # left by an older study of the same name
        print(f"trial {trial.number}: start: {shlex.join(sampled)}", flush=True)
        runs: list[SeedRun] = []
        try:
            runs = [SeedRun(s, task, trial_dir, seed, sampled, self.env) for task in s.tasks for seed in s.seeds]
            reported: set[int] = set()
            while True:
                done = all(r.proc.poll() is not None for r in runs)  # before reading: no eval is missed
                for r in runs:
                    if r.proc.poll() not in (None, 0):
                        self.fail(trial, r.failure())
                curves = [r.evals() for r in runs]
                slotted = [self.slots(r.task, c) for r, c in zip(runs, curves, strict=True)]
                for slot in sorted(set.intersection(*map(set, slotted)) - reported):
                    self.report(trial, slot, s.score(self.task_means(runs, [c[slot] for c in slotted])), reported)
                if done:
                    value = self.final_value(trial, runs, curves)
                    if s.longest not in reported:
                        self.report(trial, s.longest, value, reported)
                    return value
                time.sleep(POLL_SECONDS)
        finally:
            for r in runs:
                r.stop()

    def report(self, trial, step: int, value: float, reported: set[int]) -> None:
        """Report the objective at ``step``; raise TrialPruned if the pruner says so."""
        import optuna

        trial.report(value, step)
        reported.add(step)
        print(f"trial {trial.number}: step {step}: {'eval' if self.s.single else 'score'} {value:.2f}", flush=True)
        if step < self.s.longest and trial.should_prune():
            trial.set_user_attr("pruned_at_step", step)
            raise optuna.TrialPruned(f"{'eval' if self.s.single else 'score'} {value:.2f} at step {step}")

    def final_value(self, trial, runs: list[SeedRun], curves: list[dict[int, float]]) -> float:
        """The objective: each run's last evaluation (the final one), averaged over seeds, scored over tasks."""
        for run, curve in zip(runs, curves, strict=True):
            if not curve:
                self.fail(trial, f"{run.task.env} seed {run.seed}: no eval/return_mean in {run.dir / 'tb'}")
        finals = [curve[max(curve)] for curve in curves]
        means = self.task_means(runs, finals)
        if self.s.single:
            trial.set_user_attr("final_returns", {str(r.seed): v for r, v in zip(runs, finals, strict=True)})
        else:
            trial.set_user_attr("final_returns", {f"{r.task.env} {r.seed}": v for r, v in zip(runs, finals, strict=True)})
            trial.set_user_attr("task_returns", means)
        value = self.s.score(means)
        if not math.isfinite(value):
            self.fail(trial, f"final evaluation is {value}")
        return value

    @staticmethod
    def fail(trial, error: str) -> typing.NoReturn:
        trial.set_user_attr("error", error)
        raise TrialFailed(error)


# ---------------------------------------------------------------------------------------
# Outputs: trials table, best 10, best command, plots
# ---------------------------------------------------------------------------------------
def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary file and os.replace, so concurrent workers never leave a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def trial_rows(study) -> tuple[list[str], list[dict]]:
    trials = study.get_trials(deepcopy=False)
    params = list(dict.fromkeys(name for t in trials for name in t.params))
    rows = [
        {
            "number": t.number,
            "state": t.state.name,
            "value": "" if t.value is None else round(t.value, 4),
            "duration_s": "" if t.duration is None else round(t.duration.total_seconds(), 1),
            "last_reported_step": max(t.intermediate_values, default=""),
            "pruned_at_step": t.user_attrs.get("pruned_at_step", ""),
            "error": t.user_attrs.get("error", ""),
            "task_returns": task_returns_text(t.user_attrs.get("task_returns", {})),
            "flags": shlex.join(t.user_attrs.get("flags", [])),
            **{p: t.params.get(p, "") for p in params},
        }
        for t in trials
    ]
    header = [
        "number",
        "state",
        "value",
        "duration_s",
        "last_reported_step",
        "pruned_at_step",
        "error",
        "task_returns",
        "flags",
    ]
    return [*header, *params], rows


def task_returns_text(returns: dict[str, float]) -> str:
    """{'dm_control/walker/walk': 412.3, ...} -> 'walker/walk 412.3 · ...' (several tasks; '' for one)."""
    return " · ".join(f"{env.removeprefix('dm_control/')} {value:.1f}" for env, value in returns.items())


def write_table(path: Path, header: list[str], rows: list[dict]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


def best_markdown(s: Setup, rows: list[dict], counts: dict[str, int]) -> str:
    complete = sorted((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: -r["value"])[:BEST_ROWS]
    objective = "final deterministic evaluation (mean over seeds)"
    if not s.single:
        refs = ", ".join(f"{t.env.removeprefix('dm_control/')} {t.reference:g}" for t in s.tasks)
        objective = (
            f"geometric mean over tasks of the {objective} / reference, each at least {SCORE_FLOOR} (references: {refs})"
        )
    lines = [
        f"# Study `{s.study}`: {s.algo} on {s.describe()}, seeds {' '.join(map(str, s.seeds))}",
        "",
        "Trials: " + ", ".join(f"{n} {state.lower()}" for state, n in counts.items() if n),
        "",
        f"Objective: {objective}. Best {len(complete)}:",
        "",
        "| rank | trial | value | seconds | flags |" if s.single else "| rank | trial | score | seconds | returns | flags |",
        "|---|---|---|---|---|" if s.single else "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(complete, 1):
        returns = "" if s.single else f" {r['task_returns']} |"
        lines.append(f"| {i} | {r['number']} | {r['value']:.2f} | {r['duration_s']} |{returns} `{r['flags']}` |")
    return "\n".join(lines) + "\n"


def best_commands(s: Setup, trial) -> str:
    """The best trial as ready-to-paste command lines: one run of the script, and run.py over seeds."""
    sampled = trial.user_attrs.get("flags", [])
    script = os.path.relpath(s.script, common.ROOT)
    first = s.tasks[0]
    one = shlex.join(["python", script, "--env-id", first.env, "--total-timesteps", str(first.budget), *sampled, *s.fixed])
    budgets = [steps_text(first.budget)] if s.single else [f"{t.env}={steps_text(t.budget)}" for t in s.tasks]
    grid = shlex.join(
        [
            "python",
            "benchmarks/run.py",
            "--algo",
            s.algo,
            "--env",
            *(t.env for t in s.tasks),
            "--seeds",
            "1",
            "2",
            "--budget",
            *budgets,
            "--tag",
            f"{s.study}-trial{trial.number}",
            "--",
            *sampled,
            *s.fixed,
        ]
    )
    what = "the same config over 2 seeds" if s.single else "the same config on every task, 2 seeds"
    return (
        f"# best trial {trial.number} of study {s.study}: value {trial.value:.2f}\n{one}\n"
        f"# {what} with the benchmark runner\n{grid}\n"
    )


def save_plot(path: Path, plot: Callable[[], Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plot()
    fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
    fig.set_size_inches(10, 6)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)


def write_plots(s: Setup, study, n_complete: int) -> list[str]:
    """The optimization history, the intermediate values (learning curves) and, with >= 2 complete
    trials, the parameter importances. Returns one note per plot that could not be drawn."""
    from optuna.visualization import matplotlib as vis

    warnings.simplefilter("ignore")  # "experimental" and empty-legend warnings of the plots
    notes = []
    if n_complete:
        save_plot(s.out / "history.png", lambda: vis.plot_optimization_history(study))
    else:
        notes.append("history.png: needs 1 complete trial, the study has none")
    if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        save_plot(s.out / "intermediate.png", lambda: vis.plot_intermediate_values(study))
    else:
        notes.append("intermediate.png: no trial has reported an evaluation yet")
    if n_complete < 2:
        notes.append(f"importances.png: needs 2 complete trials, the study has {n_complete}")
    else:
        try:
            save_plot(s.out / "importances.png", lambda: vis.plot_param_importances(study))
        except Exception as e:  # e.g. no parameter varies between the complete trials
            notes.append(f"importances.png: not drawn ({str(e).splitlines()[0]})")
    return notes


def write_outputs(s: Setup, study) -> None:
    header, rows = trial_rows(study)
    counts = {state: sum(r["state"] == state for r in rows) for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    s.out.mkdir(parents=True, exist_ok=True)
    write_table(s.out / "trials.csv", header, rows)
    atomic_write(s.out / "best.md", lambda tmp: tmp.write_text(best_markdown(s, rows, counts)))
    print(f"\nstudy {s.study}: {len(rows)} trials (" + ", ".join(f"{n} {k.lower()}" for k, n in counts.items()) + ")")
    if counts["COMPLETE"]:
        best = study.best_trial
        commands = best_commands(s, best)
        atomic_write(s.out / "best_command.txt", lambda tmp: tmp.write_text(commands))
        print(commands, end="")
    notes = write_plots(s, study, counts["COMPLETE"])
    written = ["trials.csv", "best.md", "best_command.txt", "history.png", "intermediate.png", "importances.png"]
    print(f"written to {s.out}: " + ", ".join(f for f in written if (s.out / f).exists()))
    for note in notes:
        print(f"  not written: {note}")
    print(f"live view: optuna-dashboard {dashboard_target(s.storage)}")


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------
class FailureLimit:
    """Optuna callback: stop this worker after FAILURES_IN_A_ROW failed trials in a row. Failed trials
    do not count toward --trials, so a setup in which every run fails would otherwise never end."""

    def __init__(self):
        self.in_a_row, self.gave_up, self.last_error = 0, False, ""

    def __call__(self, study, trial) -> None:
        failed = trial.state.name == "FAIL"
        self.in_a_row = self.in_a_row + 1 if failed else 0
        self.last_error = trial.user_attrs.get("error", "") if failed else self.last_error
        if self.in_a_row >= FAILURES_IN_A_ROW:
            self.gave_up = True
            study.stop()


def interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the running trial is failed, its processes stopped


def submit_workers(s: Setup) -> int:
    """--slurm N: N workers as one array job, each this command without --slurm, all on the study in --storage."""
    opts, workers = s.submit, s.submit.slurm
    logs = s.out / "slurm"
    command = [sys.executable, str(Path(__file__).resolve()), *s.worker_argv]
    notes = [
        f"tune.py --slurm {workers}: {workers} workers, each the command below, all joining study {s.study}",
        f"in {s.storage}; each stops when the study has {s.trials} finished trials.",
    ]
    runs = len(s.tasks) * len(s.seeds)
    script = slurm.job_script(f"tune.py-{s.study}", command, [[]] * workers, [], opts, opts.cpus_per_task or runs, logs, notes)
    if opts.dry_run:
        print(script, end="")
        return 0
    study = open_study(s)  # the storage answers, and the study's config is stored or matches, before anything is submitted
    finished = count_finished(study)
    if finished >= s.trials:
        print(f"study {s.study} in {s.storage}: {finished} of {s.trials} trials finished; nothing submitted")
        return 0
    job = slurm.submit(script, logs)
    print(
        f"submitted job {job}: {workers} workers joining study {s.study} in {s.storage} ({finished} of {s.trials} "
        f"trials finished); each worker's console in {logs}/{job}_<task>.out, job script {logs}/{job}.sh"
    )
    print(f"live view: optuna-dashboard {dashboard_target(s.storage)}", flush=True)
    if not opts.wait:
        return 0
    slurm.wait([job])
    failed = [i for i in range(workers) if slurm.exit_code(logs, job, i) != 0]
    for i in failed:
        print(f"FAILED  worker {i}: {slurm.task_failure(logs, job, i)}")
    write_outputs(s, study)
    return 1 if failed else 0


def main() -> int:
    s = setup(sys.argv[1:])
    if s.submit is not None:
        return submit_workers(s)
    import optuna

    study = open_study(s)
    finished = count_finished(study)
    todo = max(0, s.trials - finished)
    print(
        f"study {s.study} in {s.storage}: {finished} of {s.trials} trials finished (complete or pruned), "
        f"{todo} to go (seeds {' '.join(map(str, s.seeds))}; {s.describe()})"
    )
    print(f"live view: optuna-dashboard {dashboard_target(s.storage)}", flush=True)
    signal.signal(signal.SIGTERM, interrupt)
    logging.getLogger("optuna.study._optimize").addFilter(ShortFailure())
    code = 0
    failures = FailureLimit()
    try:
        if todo:
            counted = tuple(optuna.trial.TrialState[name] for name in COUNTED)
            stop_at = optuna.study.MaxTrialsCallback(s.trials, states=counted)  # other workers' trials count too
            study.optimize(Objective(s), catch=(TrialFailed,), callbacks=[stop_at, failures])
    except KeyboardInterrupt:
        print("\ninterrupted: the running trial is marked failed; the same command continues the study", flush=True)
        code = 130
    write_outputs(s, study)
    if failures.gave_up:
        print(f"stopped: {FAILURES_IN_A_ROW} trials failed in a row; the last one: {failures.last_error}")
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

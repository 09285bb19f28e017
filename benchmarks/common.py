"""Pieces shared by the benchmark tools (`run.py`, `report.py`, `throughput.py`, `tune.py`).

- which algorithm script a name means, and importing it by path;
- the command-line shapes they share (`-- <script args>` pass-through, config tags,
  step budgets such as `200k` or `1M`);
- the results CSV: its columns, a locked atomic writer, a typed reader;
- reading the evaluation curve of one run back from its TensorBoard events, also while it runs;
- where a row comes from: the script's commit and blob, the hash of the run's args, the package versions.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("ppo_discrete", "ppo_continuous", "vmpo_continuous")
DEFAULT_TAG = "default"

# One row per evaluation of one run. `wall_time` is seconds since the run's first
# TensorBoard event (the script opening its writer), so it includes the evaluations.
# train_return: the mean return of the last 10 training episodes that ended by the evaluation's step (the measure of
# published training curves), empty when none had ended, in rows written before the column existed, or in rows of runs
# whose logged episodes mixed in those cut short by --train-episode-steps (before the script left them out).
# Which code made a row, the same on every row of a run: `commit`, the script's repository at the run's start
# (`git rev-parse HEAD`, `-dirty` when tracked files had uncommitted changes); `script`, the git blob id of the script
# file that ran (what `git hash-object` prints; names the code exactly even on a dirty tree); `args_hash`, the
# `args_hash()` of the args the run recorded; `versions`, `package_versions()`. Rows from before run.py wrote them, and
# whatever could not be recovered for them, read `unknown`.
SOURCE_FIELDS = ("commit", "script", "args_hash", "versions")
UNKNOWN = "unknown"
RESULT_FIELDS = (
    *("algo", "tag", "env", "seed", "budget", "step", "wall_time", "eval_return", "eval_std", "train_return"),
    *("backend", "cpu"),  # where the run trained: its resolved --env-backend and the machine's CPU model
    *SOURCE_FIELDS,
)
NEWER_RESULT_FIELDS = ("train_return", "backend", "cpu", *SOURCE_FIELDS)  # older results files lack them; read as unknown
TRAIN_EPISODES = 10
RUN_KEY = ("algo", "tag", "env", "seed", "budget")  # the columns naming one run
# A finished run's last checkpoint evaluated again on more episodes (`run.py --final-episodes N`), one row a run in
# `final_csv(<results CSV>)`: every episode's return, so a report can count the starts a policy succeeds from.
FINAL_FIELDS = (*RUN_KEY, "step", "episodes", "return_mean", "return_std", "returns", *SOURCE_FIELDS)


def final_csv(results_csv: Path) -> Path:
    """`results/vmpo_continuous.csv` -> `results/vmpo_continuous_final.csv`."""
    return Path(results_csv).with_name(Path(results_csv).stem + "_final.csv")


class BenchmarkError(Exception):
    """Bad input or a failed step: reported as one line, without a traceback."""


def exit_on_error(main):
    """Run ``main()``; a BenchmarkError becomes ``error: <message>`` on stderr and exit code 1."""
    try:
        return main()
    except BenchmarkError as e:
        sys.exit(f"error: {e}")


def cores() -> int:
    """The cores this process may use: inside a Slurm task its `--cpus-per-task` (its node has more), else the
    machine's. The tools share them out among the runs they start (`OMP_NUM_THREADS`)."""
    value = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else os.cpu_count() or 1


def resolve_script(algo: str) -> Path:
    """`ppo_continuous` -> `<repo>/ppo_continuous.py`; a path to a `.py` file is taken as is."""
    path = Path(algo) if algo.endswith(".py") else ROOT / f"{algo}.py"
    if not path.is_file():
        raise BenchmarkError(f"--algo {algo!r}: no script at {path} (use one of {', '.join(ALGOS)} or a path to a .py file)")
    return path.resolve()


def load_script(path: Path) -> ModuleType:
    """Import an algorithm script as a module by its path (importing it runs nothing)."""
    if str(path.parent) not in sys.path:  # as when run directly: its neighbours (probe_envs) importable
        sys.path.insert(1, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    for name in ("Args", "train", "make_vector_env"):
        if not hasattr(module, name):
            raise BenchmarkError(f"{path} has no `{name}`; the benchmark tools need Args, train and make_vector_env")
    return module


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``[tool args] -- [script args]`` at the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def reject_managed(extra: Sequence[str], managed: Iterable[str], tool: str) -> None:
    """Script args that the tool sets itself must not be passed through (it would be ambiguous which wins)."""
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in managed:
            raise BenchmarkError(f"{flag} is set by {tool}; pass it to {tool} itself, not after `--`")


# Gymnasium MuJoCo at 1M (the MuJoCo bars): the widely used PPO's published figures (1M where it has one, else 8M;
# InvertedDoublePendulum: 7,350; Swimmer: 100), benchmarks/results/reference.md. report.py scores a run on these as
# (return - random) / (bar - random), the random policy's return measured by random_returns.py.
MUJOCO_BARS = {
    ("Ant-v5", 1_000_000): 1824.2,
    ("HalfCheetah-v5", 1_000_000): 1442.6,
    ("Hopper-v5", 1_000_000): 2382.9,
    ("Humanoid-v5", 1_000_000): 716.1,
    ("InvertedDoublePendulum-v5", 1_000_000): 7350.0,
    ("Pusher-v5", 1_000_000): -40.4,
    ("Reacher-v5", 1_000_000): -4.65,
    ("Swimmer-v5", 1_000_000): 100.0,
}

# Named grids of envs and budgets (`run.py --suite`, `tune.py --suite`). `control`: the reference tasks of
# benchmarks/results/reference.md at their budgets, and three tasks the defaults were not tuned on (finger/spin and
# ball_in_cup/catch have reference figures at 500k; hopper/stand has none), so that no single task decides the defaults.
SUITES = {
    "control": {
        "dm_control/cartpole/balance": "200k",
        "dm_control/cartpole/swingup": "500k",
        "dm_control/walker/walk": "1M",
        "dm_control/finger/spin": "500k",
        "dm_control/ball_in_cup/catch": "500k",
        "dm_control/hopper/stand": "500k",
    },
    # Gymnasium's MuJoCo tasks: where most users start, with rewards that charge the action's size and
    # episodes that end when the body falls.
    "mujoco": {env: str(budget) for env, budget in MUJOCO_BARS},
}

# The two implementations a user would otherwise pick, in their first runs here (benchmarks/results/reference.md, "The
# short suite's bars"): CleanRL's ppo_continuous_action.py ("widely used PPO") and rpo_continuous_action.py ("RPO") at
# their defaults, the final deterministic evaluation of each seed, per task and budget; kept fixed as the bars. Whole
# numbers where reference.md gives whole numbers. Their later runs on our whole work: results/anchors.csv.
REFERENCE_FINALS = {
    "widely used PPO": {
        ("dm_control/cartpole/balance", 200_000): (643, 375),
        ("dm_control/cartpole/swingup", 500_000): (842, 856),
        ("dm_control/walker/walk", 1_000_000): (381, 317),
        ("dm_control/finger/spin", 500_000): (553.3,),
        ("dm_control/ball_in_cup/catch", 500_000): (619.9,),
    },
    "RPO": {
        ("dm_control/walker/walk", 1_000_000): (546.5, 539.9),
        ("dm_control/finger/spin", 500_000): (575.9, 248.1),
        ("dm_control/ball_in_cup/catch", 500_000): (886.0, 285.4),
        ("dm_control/walker/walk", 3_000_000): (808.3,),
        ("dm_control/finger/spin", 3_000_000): (896.2,),
    },
}


def reference_mean(finals: Sequence[float]) -> float:
    return sum(finals) / len(finals)


# The widely used PPO at the suite's budgets: its mean final evaluation per env (hopper/stand has no reference figure).
REFERENCE_RETURNS = {env: reference_mean(f) for (env, _), f in REFERENCE_FINALS["widely used PPO"].items()}

# The bars the defaults are judged against (issue "Exploration that lasts"): per task and budget, the better mean final
# evaluation of RPO and the widely used PPO. report.py divides each run's final evaluation by its bar: 1 is on par with
# the better of the two implementations a user would otherwise pick.
BAR_RETURNS = {
    task: max(reference_mean(finals[task]) for finals in REFERENCE_FINALS.values() if task in finals)
    for task in dict.fromkeys(task for finals in REFERENCE_FINALS.values() for task in finals)
}
RANDOM_RETURNS_CSV = ROOT / "benchmarks" / "results" / "random_returns.csv"
RANDOM_FIELDS = ("env", "episodes", "seed", "return_mean", "return_std")


def random_returns(path: Path = RANDOM_RETURNS_CSV) -> dict[str, float]:
    """env -> the mean return of a uniformly random policy (random_returns.py); empty where none was measured."""
    return {row["env"]: float(row["return_mean"]) for row in read_csv(Path(path))[1]}


FLAGSHIP_ENV = "dm_control/walker/walk"
# Seeds 1-10 choose defaults; seeds from this one on chose nothing, so the README's figures come from them (a mean over
# the seeds a default was picked on carries a winner's curse). report.py shows their runs apart: "<tag> (fresh seeds)".
FRESH_SEEDS_FROM = 11
# The suites the aggregate is computed over: the short suite's five tasks with a bar, the long suite's two, the eight
# MuJoCo tasks, and the short and MuJoCo suites together (a default must serve both).
AGGREGATE_SUITES = {
    "short": [k for k in BAR_RETURNS if k[1] <= 1_000_000],
    "long": [k for k in BAR_RETURNS if k[1] == 3_000_000],
    "mujoco": list(MUJOCO_BARS),
}
AGGREGATE_SUITES["short+mujoco"] = AGGREGATE_SUITES["short"] + AGGREGATE_SUITES["mujoco"]  # one default for both suites

# CleanRL's published means at 8M steps, (PPO, RPO), 10 seeds, training-episode returns: benchmarks/results/reference.md.
PUBLISHED_8M = {
    "dm_control/acrobot/swingup": (26.87, 42.97),
    "dm_control/cartpole/balance_sparse": (986.04, 988.56),
    "dm_control/cartpole/swingup_sparse": (240.14, 525.49),
    "dm_control/cheetah/run": (472.14, 565.51),
    "dm_control/finger/turn_easy": (237.76, 450.88),
    "dm_control/finger/turn_hard": (83.76, 259.99),
    "dm_control/fish/swim": (80.42, 140.33),
    "dm_control/hopper/hop": (6.48, 62.60),
    "dm_control/humanoid/stand": (20.76, 140.43),
    "dm_control/point_mass/easy": (534.23, 653.73),
    "dm_control/quadruped/run": (171.50, 367.98),
    "dm_control/reacher/easy": (773.01, 716.89),
    "dm_control/reacher/hard": (637.84, 576.81),
    "dm_control/swimmer/swimmer6": (164.22, 159.60),
    "dm_control/walker/stand": (439.24, 734.74),
    "dm_control/walker/run": (128.18, 391.56),
    "dm_control/cartpole/balance": (790.36, 795.12),
    "dm_control/cartpole/swingup": (590.21, 613.46),
    "dm_control/walker/walk": (305.74, 787.11),
    "dm_control/finger/spin": (630.06, 848.67),
    "dm_control/ball_in_cup/catch": (935.26, 939.75),
    "dm_control/hopper/stand": (3.26, 404.39),
}
# table22: both scripts' defaults at 1M steps on these 22 tasks (the short suite's six last), beside the
# published figures above; report.py's `table22` aggregate.
SUITE_22 = list(PUBLISHED_8M)
SUITES["table22"] = {env: "1M" for env in SUITE_22}  # run.py --suite table22


def parse_budgets(items: Sequence[str], envs: Sequence[str]) -> dict[str, int]:
    """`['200k', 'dm_control/walker/walk=1M']` -> {env: budget} for every env of the grid."""
    default, per_env = None, {}
    for item in items:
        if "=" in item:
            env, steps = item.rsplit("=", 1)
            per_env[env] = parse_steps(steps)
        else:
            default = parse_steps(item)
    unknown = sorted(set(per_env) - set(envs))
    if unknown:
        raise BenchmarkError(f"--budget names envs not in --env: {unknown}")
    missing = [e for e in envs if e not in per_env and default is None]
    if missing:
        raise BenchmarkError(f"no --budget for {missing}: give one number for all envs or ENV=N for each")
    return {e: per_env.get(e, default) for e in envs}


def config_tag(tag: str | None, extra: Sequence[str]) -> str:
    """The label of a config in the results: ``--tag`` if given, else the pass-through args, else 'default'."""
    if tag:
        return tag

    def label(arg: str) -> str:
        try:
            float(arg)
        except ValueError:
            return arg.lstrip("-")  # an option: its dashes dropped
        return arg  # a number: a negative one keeps its sign, so -0.5 and 0.5 name two configs

    return " ".join(label(a) for a in extra) if extra else DEFAULT_TAG


def slug(text: str) -> str:
    """A file-name-safe version of an env id or tag."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text).strip("-") or "_"


def parse_steps(text: str) -> int:
    """'200000', '200_000', '200k', '1M', '1e6' -> int; a clear error otherwise."""
    t = text.strip().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1:].lower(), 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = -1
    if value <= 0 or value != int(value):
        raise BenchmarkError(f"step count {text!r} is not a positive whole number (e.g. 200000, 200k, 1M)")
    return int(value)


@contextlib.contextmanager
def locked(path: Path):
    """Exclusive lock on the folder of ``path`` so several processes can share one results file
    (locking the folder, not a ``.lock`` file beside it, leaves nothing behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows (as strings) of a CSV file; empty when the file does not exist."""
    if not path.exists():
        return [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def write_rows(path: Path, fields: Sequence[str], rows: Sequence[dict], replace: dict | None = None) -> None:
    """Append ``rows`` to the CSV at ``path`` under a lock, atomically (temp file + os.replace).

    With ``replace`` (column -> value), existing rows matching it are dropped first, so
    writing a run's rows twice (a run redone after a crash) never duplicates them.
    """
    path = Path(path)
    with locked(path):
        header, old = read_csv(path)
        if header and [f for f in fields if f in header] != header:
            raise BenchmarkError(f"{path} has columns {header}, expected {list(fields)}; write to a new file")
        # A file written before some of the columns existed gains them, empty (unknown) in its old rows.
        if replace:
            old = [r for r in old if any(r[k] != str(v) for k, v in replace.items())]
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields), restval="")
            writer.writeheader()
            writer.writerows(old)
            writer.writerows({k: row[k] for k in fields} for row in rows)
        os.replace(tmp, path)


def read_results(paths: Iterable[Path]) -> list[dict]:
    """Rows of one or more results CSVs, with numbers as numbers (empty eval_std -> NaN)."""
    rows = []
    for path in paths:
        header, raw = read_csv(Path(path))
        if not header:
            raise BenchmarkError(f"{path}: no such results file (or it is empty)")
        missing = [f for f in RESULT_FIELDS if f not in header and f not in NEWER_RESULT_FIELDS]
        if missing:
            raise BenchmarkError(f"{path}: not a results CSV, missing columns {missing}")
        for r in raw:
            rows.append(
                {
                    **r,
                    **{f: r.get(f) or UNKNOWN for f in SOURCE_FIELDS},  # an older file, or a row it had before them
                    "seed": int(r["seed"]),
                    "budget": int(r["budget"]),
                    "step": int(r["step"]),
                    "wall_time": float(r["wall_time"]),
                    "eval_return": float(r["eval_return"]),
                    "eval_std": float(r["eval_std"] or "nan"),
                    "train_return": float(r.get("train_return") or "nan"),
                }
            )
    return rows


class EvalReader:
    """The evaluations of one run, read back from its TensorBoard events as they are written.

    Each ``read()`` loads only the events added since the last one, so a tool can poll a run
    that is still training (as `tune.py` does) without re-reading its whole event file.
    """

    def __init__(self, run_dir: Path):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        self._acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})

    def read(self) -> list[dict]:
        """[{step, wall_time, eval_return, eval_std, train_return}] by step, for every evaluation logged so far.

        If a step was logged twice (a periodic evaluation falling on the last step and the
        final evaluation), the later event wins.
        """
        acc = self._acc
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if "eval/return_mean" not in tags:
            return []
        start = acc.FirstEventTimestamp()
        stds = {e.step: e.value for e in acc.Scalars("eval/return_std")} if "eval/return_std" in tags else {}
        episodes = acc.Scalars("charts/episodic_return") if "charts/episodic_return" in tags else []

        def train_return(step: int) -> float:
            ended = [e.value for e in episodes if e.step <= step][-TRAIN_EPISODES:]
            return sum(ended) / len(ended) if ended else float("nan")

        by_step = {
            e.step: {
                "step": e.step,
                "wall_time": e.wall_time - start,
                "eval_return": e.value,
                "eval_std": stds.get(e.step, float("nan")),
                "train_return": train_return(e.step),
            }
            for e in sorted(acc.Scalars("eval/return_mean"), key=lambda e: e.wall_time)
        }
        return [by_step[s] for s in sorted(by_step)]


def read_hyperparameters(run_dir: Path) -> dict[str, str]:
    """The `hyperparameters` table every script writes to TensorBoard at its start (values as text), e.g. the resolved
    env_backend; empty when the run wrote none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    if "hyperparameters/text_summary" not in acc.Tags()["tensors"]:
        return {}
    text = acc.Tensors("hyperparameters/text_summary")[-1].tensor_proto.string_val[0].decode()
    cells = (line.strip("|").split("|", 1) for line in text.splitlines() if line.startswith("|"))
    return {key: value for key, value in cells if key not in ("param", "-")}


def cpu_model() -> str:
    """This machine's CPU model as the OS names it (Linux's /proc/cpuinfo, else platform), for the results' `cpu` column."""
    import platform

    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def read_eval_curve(run_dir: Path) -> list[dict]:
    """Evaluations logged by one (finished) run: [{step, wall_time, eval_return, eval_std, train_return}], by step."""
    return EvalReader(run_dir).read()


# --- Where a row comes from -------------------------------------------------------------------------------------------

# Args fields left out of `args_hash`: the row's own columns (seed, env_id, total_timesteps; env_backend resolved is the
# `backend` column), and what does not change what a run learns: names, logging and video, the evaluation (it draws on
# its own generator and envs, training's RNG untouched), checkpoint paths, and where the run computes (threads: the
# same numbers on any thread count; --cuda falls back to the CPU where no GPU is). Close to the scripts' RUN_FIELDS, but
# `max_episode_steps` (in RUN_FIELDS) stays in: it ends the training episodes. A field not named here enters the hash.
UNHASHED_ARGS = frozenset(
    {
        *("seed", "env_id", "total_timesteps", "env_backend"),
        *("exp_name", "output_dir", "track", "wandb_project_name", "wandb_entity", "capture_video"),
        *("eval_interval", "eval_episodes", "checkpoint", "eval_only", "resume", "torch_threads", "cuda"),
    }
)
# The packages whose versions change a run's numbers (the network's kernels, the physics, the env ports, the RNGs).
VERSIONED_PACKAGES = ("torch", "numpy", "gymnasium", "mujoco", "dm_control", "envpool")


def args_hash(args: dict) -> str:
    """10 hex digits of sha256 over the learning args of a run, `{field: str(value)}` for every field not in
    `UNHASHED_ARGS`, as sorted JSON. The values as text (a tuple as `(64, 64)`), as the scripts' `hyperparameters` table
    writes them, so a checkpoint's args and that table give the same hash."""
    text = {k: str(tuple(v) if isinstance(v, list) else v) for k, v in args.items() if k not in UNHASHED_ARGS}
    return hashlib.sha256(json.dumps(text, sort_keys=True).encode()).hexdigest()[:10]


def read_run_args(run_dir: Path) -> dict | None:
    """The resolved args a finished run recorded (after `--policy auto` and the like were resolved): the "args" of its
    `<script>_last.pt` checkpoint, else its TensorBoard `hyperparameters` table; None when it left neither."""
    for checkpoint in sorted(Path(run_dir).glob("*_last.pt")):
        import torch

        with contextlib.suppress(Exception):  # unreadable: the table below holds the same args
            return dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["args"])
    return read_hyperparameters(run_dir) or None


def package_versions() -> str:
    """`torch=2.13.0+cpu numpy=... envpool=none`: this interpreter's versions of `VERSIONED_PACKAGES` (run.py starts the
    scripts with the same interpreter); `none` where one is not installed."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    return " ".join(f"{name}={version(name)}" for name in VERSIONED_PACKAGES)


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes, as `git hash-object FILE` prints it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git(*args: str, cwd: Path = ROOT) -> str | None:
    """`git <args>` in `cwd`, its stdout stripped; None when git fails or is missing."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else None


def script_source(script: Path) -> dict[str, str]:
    """`commit` and `script` for rows of a run of `script` starting now: the commit of the script's own repository (a
    worktree's, for a patch screened there), `-dirty` when its tracked files have uncommitted changes (`unknown` outside
    a git repository), and the script file's blob id."""
    script = Path(script).resolve()
    commit = git("rev-parse", "HEAD", cwd=script.parent)
    if commit is not None and git("--no-optional-locks", "status", "--porcelain", "-uno", cwd=script.parent):
        commit += "-dirty"
    return {"commit": commit or UNKNOWN, "script": blob_id(script.read_bytes())}

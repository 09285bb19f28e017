r"""Training throughput of a script's config against its env stepped with random actions.

    python benchmarks/throughput.py --algo ppo_continuous --steps 20000 \
        -- --env-id dm_control/walker/walk --num-envs 1

In ONE process: imports the script by path, builds its `Args` from the arguments after
`--` (the script's own flags), then measures
  1. random-action SPS: the script's training envs (`make_training_envs(args, seed, threads)`,
     or `make_vector_env(args, args.num_envs, args.seed)` for a script without a choice of
     backend) stepped with `envs.action_space.sample()`: the same envs, wrappers and threads
     training uses;
  2. training SPS: `train(args)` for `--steps` env steps, evaluating only at the end
     (`--eval-interval 0`), its `train_sps` (rollout + update time, evaluation excluded);
  3. random-action SPS again, so drift on a shared machine shows up and averages out;
and prints both figures and their ratio training / random (the mean of 1 and 3).
`--csv` / `--md` append the result (`--md`: a row of the file's last table, with a header first when the file is new
or ends in prose); `--profile FILE` writes the cProfile top entries of `train` (profiling slows training, so its SPS
figure is then lower than normal).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MANAGED = ("--total-timesteps", "--eval-interval", "--eval-episodes", "--output-dir")
FIELDS = (
    "date",
    "algo",
    "tag",
    "env",
    "num_envs",
    "steps",
    "train_sps",
    "random_sps_before",
    "random_sps_after",
    "random_sps",
    "ratio",
    "device",
    "cpus",
)
MD_HEADER = (
    "| algo | tag | env | envs | steps | training SPS | random-action SPS (before / after) | ratio | device | date |\n"
    "|---|---|---|---|---|---|---|---|---|---|\n"
)
PROFILE_TOP = 40
WARMUP_STEPS = 20  # vector steps before the timed ones


def random_action_sps(module, args, steps: int) -> float:
    """Env steps per second of the script's own vector env driven by random actions."""
    if hasattr(module, "choose_gl_backend"):  # as train() does, before the envs import mujoco (ppo_discrete has none)
        module.choose_gl_backend(args.capture_video)
    if hasattr(module, "make_training_envs"):  # EnvPool or gymnasium, with the thread count train() gives it
        import torch

        envs = module.make_training_envs(args, args.seed, getattr(args, "torch_threads", 0) or torch.get_num_threads())
    else:
        envs = module.make_vector_env(args, args.num_envs, args.seed)
    try:
        envs.reset(seed=args.seed)
        envs.action_space.seed(args.seed)
        for _ in range(WARMUP_STEPS):  # first steps pay one-time costs (caches, lazy imports)
            envs.step(envs.action_space.sample())
        iterations = max(1, -(-steps // args.num_envs))
        tick = time.perf_counter()
        for _ in range(iterations):
            envs.step(envs.action_space.sample())
        return iterations * args.num_envs / (time.perf_counter() - tick)
    finally:
        envs.close()


def profiled(fn, path: Path):
    """Call ``fn()`` under cProfile; write the top entries (cumulative and own time) to ``path``
    and the raw stats to ``path.prof`` (for snakeviz / pstats)."""
    profile = cProfile.Profile()
    result = profile.runcall(fn)
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(path.with_suffix(".prof"))
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        text.write(f"==== top {PROFILE_TOP} by {order} ====\n")
        pstats.Stats(profile, stream=text).strip_dirs().sort_stats(order).print_stats(PROFILE_TOP)
    path.write_text(text.getvalue())
    return result


def measure(module, args, steps: int, random_steps: int, profile: Path | None) -> dict:
    before = random_action_sps(module, args, random_steps)
    with tempfile.TemporaryDirectory(prefix="throughput_") as tmp:
        args.output_dir = tmp
        try:
            summary = profiled(lambda: module.train(args), profile) if profile else module.train(args)
        except Exception as e:  # the script's own bad-input error: one line, like the script itself
            if type(e).__name__ == "ConfigError":
                raise common.BenchmarkError(str(e)) from None
            raise
    after = random_action_sps(module, args, random_steps)
    random_sps = (before + after) / 2
    return {
        "steps": summary["global_step"],
        "train_sps": summary["train_sps"],
        "random_sps_before": before,
        "random_sps_after": after,
        "random_sps": random_sps,
        "ratio": summary["train_sps"] / random_sps,
    }


def append_markdown(path: Path, row: dict) -> None:
    """Append the result as a row of the file's last table. A new file, or one whose last line is not a table row (a
    page of prose), gets the table's header first, so a row never lands under text."""
    line = (
        f"| {row['algo']} | {row['tag']} | {row['env']} | {row['num_envs']} | {row['steps']:,} | "
        f"{row['train_sps']:.0f} | {row['random_sps']:.0f} ({row['random_sps_before']:.0f} / "
        f"{row['random_sps_after']:.0f}) | {row['ratio']:.3f} | {row['device']} | {row['date']} |\n"
    )
    with common.locked(path):
        text = path.read_text() if path.exists() else ""
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        newline = "\n" if text and not text.endswith("\n") else ""
        if not text.strip():
            line = MD_HEADER + line
        elif not last.startswith("|"):
            line = newline + "\n" + MD_HEADER + line
        else:
            line = newline + line
        with open(path, "a") as f:
            f.write(line)


def main() -> int:
    own, extra = common.split_passthrough(sys.argv[1:])
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --algo ALGO --steps N [options] [-- script args]",
    )
    p.add_argument("--algo", required=True, help=f"one of {', '.join(common.ALGOS)}, or a path to a script")
    p.add_argument("--steps", required=True, help="training budget in env steps (e.g. 20000, 20k)")
    p.add_argument("--random-steps", help="env steps of each random-action measurement (default: --steps)")
    p.add_argument(
        "--eval-episodes",
        type=int,
        default=1,
        help="episodes of the final evaluation (default: 1; evaluation is not part of the training SPS, it only costs time)",
    )
    p.add_argument("--tag", help="config label (default: the args after --, or 'default')")
    p.add_argument("--csv", type=Path, help="append the result to this CSV")
    p.add_argument("--md", type=Path, help="append the result as a row of this Markdown file's last table")
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help=f"profile train(): top {PROFILE_TOP} entries to FILE, raw stats to FILE with suffix .prof",
    )
    opts = p.parse_args(own)
    common.reject_managed(extra, MANAGED, "throughput.py")
    steps = common.parse_steps(opts.steps)
    random_steps = common.parse_steps(opts.random_steps) if opts.random_steps else steps

    script = common.resolve_script(opts.algo)
    module = common.load_script(script)
    import tyro

    args = tyro.cli(module.Args, args=extra, prog=f"{script.name} (after --)")
    args.total_timesteps, args.eval_interval, args.eval_episodes = steps, 0, opts.eval_episodes
    args.capture_video = False

    result = measure(module, args, steps, random_steps, opts.profile)
    import torch

    row = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "algo": script.stem,
        "tag": common.config_tag(opts.tag, extra),
        "env": args.env_id,
        "num_envs": args.num_envs,
        "device": "cuda" if getattr(args, "cuda", False) and torch.cuda.is_available() else "cpu",
        "cpus": os.cpu_count(),
        **result,
    }
    print(
        f"\nthroughput of {row['algo']} [{row['tag']}] on {row['env']}, {row['num_envs']} envs, {row['device']}"
        + (" (profiled: training SPS includes profiler overhead)" if opts.profile else "")
    )
    print(f"training SPS:          {result['train_sps']:.1f}  ({result['steps']} steps, evaluation excluded)")
    print(
        f"random-action SPS:     {result['random_sps']:.1f}  (before {result['random_sps_before']:.1f}, "
        f"after {result['random_sps_after']:.1f}; {random_steps} steps each)"
    )
    print(f"ratio training/random: {result['ratio']:.4f}")
    if opts.csv:
        common.write_rows(opts.csv, FIELDS, [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}])
        print(f"appended to {opts.csv}")
    if opts.md:
        append_markdown(opts.md, row)
        print(f"appended to {opts.md}")
    if opts.profile:
        print(f"profile: {opts.profile} (raw: {opts.profile.with_suffix('.prof')})")
    return 0


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

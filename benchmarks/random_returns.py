r"""The return of a uniformly random policy on each task: the zero of report.py's normalized score.

    python benchmarks/random_returns.py --suite mujoco --episodes 20

Each task is its official env (the one every evaluation runs on, built by the script's own `make_vector_env`), stepped
with actions drawn uniformly from its action space, one episode at a time from seeds `--seed`, `--seed` + 1, ...; the
mean return and its std over the episodes go to `benchmarks/results/random_returns.csv` (one row per env, replaced when
measured again). report.py scores a run on such a task as (return - random) / (bar - random).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def random_episode_returns(module, env_id: str, episodes: int, seed: int) -> np.ndarray:
    """Returns of `episodes` uniformly random episodes on the official env of `env_id`."""
    args = module.Args(env_id=env_id, cuda=False)
    envs = module.make_vector_env(args, 1, seed)
    returns = []
    for episode in range(episodes):
        envs.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
            total, done = total + float(reward[0]), bool(terminated[0] or truncated[0])
        returns.append(total)
    envs.close()
    return np.array(returns)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", nargs="+", default=[], help="env ids (any the continuous scripts accept)")
    p.add_argument("--suite", choices=sorted(common.SUITES), help="a named grid: its envs")
    p.add_argument("--episodes", type=int, default=20, help="episodes per env (default: 20)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first episode and of the action sampler")
    p.add_argument("--out", type=Path, default=common.RANDOM_RETURNS_CSV, help="the CSV (default: %(default)s)")
    args = p.parse_args()
    envs = list(dict.fromkeys([*common.SUITES.get(args.suite, {}), *args.env]))
    if not envs:
        raise common.BenchmarkError("give --env ENV [ENV ...] or --suite NAME")
    if args.episodes < 1:
        raise common.BenchmarkError(f"--episodes must be at least 1, got {args.episodes}")
    module = common.load_script(common.resolve_script("vmpo_continuous"))
    for env_id in envs:
        returns = random_episode_returns(module, env_id, args.episodes, args.seed)
        row = {"env": env_id, "episodes": args.episodes, "seed": args.seed}
        row |= {"return_mean": round(float(returns.mean()), 4), "return_std": round(float(returns.std()), 4)}
        common.write_rows(args.out, common.RANDOM_FIELDS, [row], replace={"env": env_id})
        print(f"{env_id}: random return {returns.mean():.2f} ± {returns.std():.2f} over {args.episodes} episodes")
    return 0


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

"""Is EnvPool's port of a dm_control task the official task? Both take the same random actions.

    python benchmarks/envpool_ports.py dm_control/finger/spin dm_control/walker/walk [--num-envs 32 --steps 1000]
    python benchmarks/envpool_ports.py --all --num-envs 8      # every task EnvPool ports (minutes)

For each task, EnvPool's envs and the official (gymnasium / shimmy) envs take the same clipped N(0, 1)
actions, as an untrained policy acts, in two independent halves per backend (seeds 1 and 101). Printed
per task: the share of steps that pay a reward and the mean reward of each half, and the worst
observation dimension's |log| ratio of mean |o| between the backends (halves pooled) against the
worst between the two halves of one backend. A port whose between-backend figure stands well above
its within-backend figure, or whose reward rate differs in both halves, is not the same task; the
scripts' `ENVPOOL_DIFFERS` lists the ports measured so.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def rollout(envs, steps: int, num_envs: int, act_dim: int, keys: list[str] | None, seed: int):
    """Rewards (steps x envs) and flat observations of `steps` random-action steps."""
    rng = np.random.default_rng(seed)
    rewards, observations = [], []
    for _ in range(steps):
        obs, reward, *_ = envs.step(np.clip(rng.normal(0.0, 1.0, (num_envs, act_dim)), -1.0, 1.0))
        rewards.append(np.asarray(reward, np.float64))
        flat = [np.asarray(obs[k]).reshape(num_envs, -1) for k in keys] if keys else [np.asarray(obs)]
        observations.append(np.concatenate(flat, axis=1))
    return np.stack(rewards), np.concatenate(observations)


def compare(module, gym_id: str, num_envs: int, steps: int) -> str:
    import envpool
    import gymnasium as gym

    task_id = module.envpool_task_id(gym_id)
    if task_id is None:
        return f"| {gym_id} | no EnvPool port | | | |"
    with gym.make(gym_id) as official:
        space = official.observation_space
        keys = list(space.keys()) if isinstance(space, gym.spaces.Dict) else None
        act_dim = official.action_space.shape[0]
    halves = {"envpool": [], "official": []}
    for seed in (1, 101):
        pool = envpool.make_gymnasium(task_id, num_envs=num_envs, seed=seed, num_threads=1)
        pool.reset()
        halves["envpool"].append(rollout(pool, steps, num_envs, act_dim, keys, seed))
        pool.close()
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(gym_id) for _ in range(num_envs)])
        envs.reset(seed=seed)
        halves["official"].append(rollout(envs, steps, num_envs, act_dim, keys, seed))
        envs.close()
    size = {b: [np.abs(obs).mean(0) + 1e-6 for _, obs in h] for b, h in halves.items()}
    between = np.abs(np.log((size["envpool"][0] + size["envpool"][1]) / (size["official"][0] + size["official"][1])))
    within = max(np.abs(np.log(size[b][0] / size[b][1])).max() for b in size)
    paid = {b: " / ".join(f"{(r > 0).mean():.2%} ({r.mean():.4f})" for r, _ in h) for b, h in halves.items()}
    return f"| {gym_id} | {task_id} | {paid['envpool']} | {paid['official']} | {between.max():.3f} (dim {between.argmax()}) / {within:.3f} |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("envs", nargs="*", help="dm_control ids, e.g. dm_control/finger/spin")
    p.add_argument("--all", action="store_true", help="every dm_control task EnvPool ports")
    p.add_argument("--num-envs", type=int, default=32, help="envs per half and backend (default: 32)")
    p.add_argument("--steps", type=int, default=1000, help="steps per half (default: 1000, one episode)")
    args = p.parse_args()
    if not args.envs and not args.all:
        raise common.BenchmarkError("give dm_control env ids or --all")
    if args.num_envs < 1 or args.steps < 1:
        raise common.BenchmarkError("--num-envs and --steps must be at least 1")
    warnings.simplefilter("ignore")  # dm_control's deprecation warnings, glfw without a display
    import gymnasium as gym
    import shimmy

    gym.register_envs(shimmy)
    module = common.load_script(common.resolve_script("vmpo_continuous"))
    ids = [module.resolve_env_id(e) for e in args.envs]
    if args.all:
        ids += sorted(
            k for k in gym.registry if k.startswith("dm_control/") and k.count("-") == 2 and "compatibility" not in k
        )
    print(
        "| task | EnvPool | steps that pay, EnvPool (mean reward), two halves | official | worst obs |log| ratio, between backends / within one |"
    )
    print("|---|---|---|---|---|")
    for gym_id in dict.fromkeys(ids):
        print(compare(module, gym_id, args.num_envs, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(common.exit_on_error(main))

"""The continuous scripts' training envs: EnvPool where it has the task, gymnasium otherwise.

EnvPool's observations are laid out as the official env's; its episode ends follow NEXT_STEP and no
reset step is trained on; a truncated episode bootstraps from its real final observation; the same
seed gives the same run; evaluation stays on the official env; without EnvPool a copied script
trains on gymnasium and says so; checkpoints keep the backend.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import envpool
import gymnasium as gym
import numpy as np
import pytest
import shimmy
import torch
import tyro

from tests.helpers import ROOT, read_scalars, run_cli, single_run_dir

NAMES = ["ppo_continuous", "vmpo_continuous"]
TINY = {
    "ppo_continuous": ["--num-minibatches", "2", "--update-epochs", "1"],
    "vmpo_continuous": ["--m-steps", "2", "--policy-hidden-sizes", "32", "32", "--value-hidden-sizes", "32", "32"],
}
# Runs the script as `python script.py ...` would, with `import envpool` failing as on a machine without it.
WITHOUT_ENVPOOL = "import runpy, sys; sys.modules['envpool'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def tiny_args(name: str, tmp_path: Path, *extra: str):
    module = importlib.import_module(name)
    cli = ["--num-envs", "2", "--num-steps", "64", "--eval-episodes", "1", "--eval-interval", "0", "--no-cuda", *TINY[name]]
    return module, tyro.cli(module.Args, args=[*cli, "--output-dir", str(tmp_path), *extra])


def without_envpool(name: str, args: list[str], cwd: Path, script_dir: Path = ROOT):
    return run_cli("-c", [WITHOUT_ENVPOOL, str(script_dir / f"{name}.py"), *args], cwd=cwd, script_dir=Path(""))


def dm_control_ids() -> list[str]:
    gym.register_envs(shimmy)
    return sorted(k for k in gym.registry if k.startswith("dm_control/") and k.count("-") == 2 and "compatibility" not in k)


# ---------------------------------------------------------------------------------
# The same observations as the official env
# ---------------------------------------------------------------------------------


def envpool_adapter(module, task_id: str, official: gym.Env, num_envs: int):
    """`module`'s EnvPool adapter over `num_envs` envs at the official time limit, one thread (V-MPO's takes a limit
    per env, for its training envs' two limits; the PPO scripts' one for all)."""
    if "limits" in inspect.signature(module.EnvPoolVectorEnv).parameters:
        return module.EnvPoolVectorEnv(task_id, official, [None] * num_envs, 1)
    return module.EnvPoolVectorEnv(task_id, official, num_envs, 1, None)


@pytest.mark.parametrize("name", NAMES)
def test_every_dm_control_task_of_envpool_is_reached_and_laid_out_as_the_official_env(name):
    """EnvPool keeps dm_control's key order and adds keys to some tasks (finger/spin); shimmy sorts the keys."""
    module = importlib.import_module(name)
    ported = {module.envpool_task_id(gym_id): gym_id for gym_id in dm_control_ids()}
    ported.pop(None, None)
    envpool_dmc = {k for k, v in envpool.registration.registry.specs.items() if v[0] == "envpool.mujoco.dmc"}
    assert set(ported) == envpool_dmc, "an EnvPool dm_control task no official id maps to"
    for task_id, gym_id in sorted(ported.items()):
        with gym.make(gym_id) as official:
            envs = envpool_adapter(module, task_id, official, 2)
            space = official.observation_space
        raw_pool = envpool.make_gymnasium(task_id, num_envs=2, seed=0, num_threads=1)  # the adapter's seed, its own pool
        raw_space = raw_pool.observation_space
        assert set(space) <= set(raw_space), (gym_id, set(space) - set(raw_space))
        assert envs.single_observation_space == gym.spaces.flatten_space(space), gym_id
        flat, _ = envs.reset(seed=0)
        raw, _ = raw_pool.reset()  # the same seed, the same first observations
        raw_pool.close()
        start = 0
        for key in space:  # the official order, segment by segment
            width = int(np.prod(space[key].shape))
            np.testing.assert_array_equal(flat[:, start : start + width], raw[key].reshape(2, -1), err_msg=f"{gym_id} {key}")
            start += width
        assert start == flat.shape[1] == envs.single_observation_space.shape[0], gym_id
        envs.close()


def test_envpool_walker_computes_the_official_observations_and_rewards_from_the_same_state():
    """The official walker is put in EnvPool's first state (joint angles from the body orientations, torso height,
    velocities), then both take the same 100 random actions: the same observations (to 1e-9: the
    state is rebuilt from rounded observations), the same rewards in float32 (EnvPool's reward type)."""
    from dm_control import suite

    pool = envpool.make_gymnasium("WalkerWalk-v1", num_envs=1, seed=3, num_threads=1)
    obs, _ = pool.reset()
    env = suite.load("walker", "walk", task_kwargs={"random": 0})
    env.reset()
    # orientations: (xx, xz) of each body's rotation about y; the hinge joints turn the other way from the root's.
    torso, *legs = np.arctan2(obs["orientations"][0, 1::2], obs["orientations"][0, ::2])
    right, left = np.diff([torso, *legs[:3]]), np.diff([torso, *legs[3:]])
    qpos = np.concatenate([[obs["height"][0] - 1.3, 0.0, torso], -right, -left])
    with env.physics.reset_context():
        env.physics.data.qpos[:] = (qpos + np.pi) % (2 * np.pi) - np.pi
        env.physics.data.qvel[:] = obs["velocity"][0]
    np.testing.assert_allclose(env.task.get_observation(env.physics)["orientations"], obs["orientations"][0], atol=1e-12)
    for action in np.random.default_rng(0).uniform(-1, 1, (100, 6)):
        obs, reward, *_ = pool.step(action[None])
        step = env.step(action)
        assert np.float32(step.reward) == pytest.approx(reward[0], abs=1e-6)
        for key in step.observation:
            np.testing.assert_allclose(step.observation[key], obs[key][0], rtol=0, atol=1e-9, err_msg=key)


def test_envpools_finger_is_not_the_official_finger():
    """Why ENVPOOL_DIFFERS lists the finger tasks: 32 envs of each take the same 1000 random actions (clipped
    N(0, 1), as an untrained policy acts); EnvPool's touch sensors read about twice the official values
    (1.8-2.2x over three seeds) and its hinge spins slower (0.6-0.8x). If this fails, a new EnvPool may have
    fixed its finger: measure it again and take it out of ENVPOOL_DIFFERS."""
    gym.register_envs(shimmy)
    n, steps = 32, 1000
    pool = envpool.make_gymnasium("FingerSpin-v1", num_envs=n, seed=1, num_threads=1)
    pool.reset()
    official = gym.vector.SyncVectorEnv([lambda: gym.make("dm_control/finger-spin-v0") for _ in range(n)])
    official.reset(seed=1)
    actions = np.clip(np.random.default_rng(1).normal(0.0, 1.0, (steps, n, 2)), -1.0, 1.0)
    touch, hinge_speed = {}, {}
    for name, envs in (("envpool", pool), ("official", official)):
        observations = [envs.step(a)[0] for a in actions]
        touch[name] = np.mean([o["touch"] for o in observations])
        hinge_speed[name] = np.mean([np.abs(o["velocity"][:, 2]) for o in observations])
    pool.close()
    official.close()
    assert touch["envpool"] > 1.4 * touch["official"], touch
    assert hinge_speed["envpool"] < 0.9 * hinge_speed["official"], hinge_speed


@pytest.mark.parametrize("name", NAMES)
def test_auto_trains_a_differing_envpool_port_on_gymnasium_and_says_why(name, tmp_path):
    module = importlib.import_module(name)
    assert "FingerSpin-v1" in module.ENVPOOL_DIFFERS
    for backend, chosen, says in [
        ("auto", "gymnasium", "gymnasium's dm_control/finger-spin-v0 (EnvPool's FingerSpin-v1 differs"),
        ("envpool", "envpool", "EnvPool's FingerSpin-v1 (it differs from the official task)"),
    ]:
        args = tiny_args(name, tmp_path, "--env-id", "dm_control/finger/spin", "--env-backend", backend)[1]
        resolved, line = module.choose_env_backend(args)
        assert resolved == chosen and says in line, line
        envs = module.make_training_envs(args, seed=1)
        assert isinstance(envs.unwrapped, module.EnvPoolVectorEnv) == (chosen == "envpool")
        envs.close()
    walker = tiny_args(name, tmp_path, "--env-id", "dm_control/walker/walk")[1]
    assert module.choose_env_backend(walker)[0] == "envpool"  # the ports that match stay on EnvPool


# ---------------------------------------------------------------------------------
# Episode ends: no reset step trained on, truncation bootstrapped from the real final obs
# ---------------------------------------------------------------------------------


def real_observations(task_id: str, seed: int, actions: np.ndarray) -> np.ndarray:
    """EnvPool's own observations for `actions` with no time limit in reach: the real ones after step 5 too."""
    gym.register_envs(shimmy)
    with gym.make("dm_control/walker-walk-v0") as official:
        pool = envpool_adapter(importlib.import_module("vmpo_continuous"), task_id, official, actions.shape[1])
    pool.reset(seed=seed)
    observations = [pool.step(a)[0] for a in actions]
    pool.close()
    return np.stack(observations)


@pytest.mark.parametrize("name", NAMES)
def test_short_episodes_on_envpool_train_no_reset_step_and_bootstrap_from_the_final_observation(name, tmp_path):
    """Episodes of 5 steps: steps 0-4, a reset step, steps 6-10, a reset step, ... in every env."""
    module, args = tiny_args(name, tmp_path, "--env-id", "dm_control/walker/walk", "--max-episode-steps", "5", "--no-norm-obs")
    torch.manual_seed(0)
    np.random.seed(0)
    envs = module.make_training_envs(args, seed=7)
    assert isinstance(envs.unwrapped, module.EnvPoolVectorEnv)
    obs, _ = envs.reset(seed=7)
    if name == "ppo_continuous":
        agent = module.Agent(24, envs.single_action_space, "gaussian", (32, 32), (32, 32))
        policy, rollout = module.RolloutPolicy(agent), module.Rollout.empty(16, envs)
        module.collect_rollout(
            policy,
            envs,
            obs.astype(np.float32),
            module.RunningMeanStd((24,), enabled=False),
            module.RewardScaler(2, 0.99, False),
            rollout,
        )
        reset_rows, observations, actions = rollout.resets, rollout.obs, np.clip(rollout.actions, -1, 1)
        # What the update sees: the loop's mask drops exactly the reset rows.
        trained = torch.as_tensor(rollout.resets).flatten() == 0
        assert int(trained.sum()) == 2 * 16 - 2 * 2
        # Row t+1 bootstraps row t: at a truncation, the value of the real final observation.
        np.testing.assert_allclose(rollout.next_values[4], policy.value(rollout.obs[5]), rtol=1e-6)
    else:
        agent = module.Agent(24, envs.single_action_space, "gaussian", (32, 32), (32, 32))
        rollout = module.Rollout.empty(16, envs, torch.device("cpu"))
        obs_rms = module.RunningMeanStd(envs.single_observation_space.shape, enabled=False)
        no_scaling = module.RewardScaler(2, 0.99, False)
        module.collect_rollout(agent, envs, obs_rms, no_scaling, torch.as_tensor(obs_rms.normalize(obs)), rollout)
        reset_rows, observations, actions = (
            rollout.resets.numpy(),
            rollout.obs.numpy(),
            agent.policy_head.env_action(rollout.u).numpy(),
        )
        # The values, computed in one pass after the rollout, are V of each row's observation, one env step at a time;
        # train() bootstraps row t from row t + 1, so at a truncation from the real final observation (row 5).
        with torch.no_grad():
            torch.testing.assert_close(rollout.values, torch.stack([agent(row)[1] for row in rollout.obs]))
        # The E-step never selects a reset step, whatever its advantage.
        advantages = torch.where(rollout.resets == 0, -1.0, 100.0).flatten()
        selected = module.e_step(advantages, 1.0 - rollout.resets.flatten(), torch.tensor(1.0), 1.0, 0.1)["selected_weights"]
        assert float(selected[rollout.resets.flatten() == 1].sum()) == 0.0
    envs.close()
    expected_resets = np.zeros((16, 2))
    expected_resets[[5, 11]] = 1
    np.testing.assert_array_equal(reset_rows, expected_resets)
    np.testing.assert_array_equal(rollout.truncated[[4, 10]], 1)
    assert rollout.truncated.sum() == 4 and rollout.terminated.sum() == 0
    # Row 5 holds the real observation after step 4 (the final one, not a new episode's first), as a pool with no time
    # limit in reach computes it from the same seed and actions.
    real = real_observations("WalkerWalk-v1", 7, actions[:5].astype(np.float64))
    np.testing.assert_allclose(observations[5], real[4], rtol=1e-6)
    assert not np.allclose(observations[6], real[4])  # row 6: the second episode's first observation


# ---------------------------------------------------------------------------------
# Runs on EnvPool: same seed, same numbers; evaluation on the official env; the backend is kept
# ---------------------------------------------------------------------------------


def first_truncations(envs: gym.vector.VectorEnv, most: int) -> list[int | None]:
    """Per env, the step of its first truncation after a reset, within `most` steps (None: not yet); no env terminates."""
    envs.reset(seed=3)
    actions, first = np.zeros(envs.action_space.shape, dtype=np.float32), [None] * envs.num_envs
    for step in range(1, most + 1):
        _, _, terminated, truncated, _ = envs.step(actions)
        assert not terminated.any()
        first = [step if f is None and t else f for f, t in zip(first, truncated, strict=True)]
    return first


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_half_the_training_envs_end_episodes_at_train_episode_steps_and_evaluation_keeps_the_official_limit(backend, tmp_path):
    """--train-episode-steps truncates the first half of the training envs (walker: 1,000 steps officially; the rest keep
    it), never lengthens an env's own shorter limit (Reacher-v5: 50), yields to a shorter --max-episode-steps (then on
    every env), and leaves the evaluation envs alone; None keeps the env's own everywhere."""
    module = importlib.import_module("vmpo_continuous")
    cases = [  # (env, extra flags, each of 4 envs' first truncation within 60 steps)
        ("dm_control/walker/walk", [], [None] * 4),  # the default, 125, ends no episode in 60 steps
        ("dm_control/walker/walk", ["--train-episode-steps", "7"], [7, 7, None, None]),
        ("Reacher-v5", ["--train-episode-steps", "125"], [50] * 4),
        ("dm_control/walker/walk", ["--train-episode-steps", "7", "--max-episode-steps", "4"], [4] * 4),
        ("dm_control/walker/walk", ["--train-episode-steps", "None", "--max-episode-steps", "9"], [9] * 4),
    ]
    for env_id, extra, expected in cases:
        _, args = tiny_args(
            "vmpo_continuous", tmp_path, "--env-id", env_id, "--env-backend", backend, "--num-envs", "4", *extra
        )
        envs = module.make_training_envs(args, seed=1)
        assert first_truncations(envs, 60) == expected, (env_id, extra)
        envs.close()
    walker = tiny_args("vmpo_continuous", tmp_path, "--env-id", "dm_control/walker/walk", "--train-episode-steps", "7")[1]
    assert module.Args().train_episode_steps == 125
    evaluation = module.make_vector_env(walker, 2, seed=1)  # the evaluation envs: walker's own 1,000 steps
    assert first_truncations(evaluation, 1000) == [1000, 1000]
    evaluation.close()


@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_the_training_return_counts_only_the_episodes_of_the_envs_that_keep_their_own_limit(backend, tmp_path):
    """The capped envs' episodes (7 steps here) stay out of charts/episodic_return and the console's return: the
    logged episodes are the uncapped half's, 20 steps each (--max-episode-steps standing in for the env's own)."""
    module, args = tiny_args(
        "vmpo_continuous", tmp_path, "--env-id", "dm_control/walker/walk", "--env-backend", backend, "--num-envs", "4",
        "--num-steps", "64", "--total-timesteps", "256", "--train-episode-steps", "7", "--max-episode-steps", "20",
    )  # fmt: skip
    scalars = read_scalars(module.train(args)["run_dir"])
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert lengths == [20.0] * 2 * (64 // 20), lengths  # 2 uncapped envs, 3 whole episodes each in 64 steps
    assert len(scalars["charts/episodic_return"]) == len(lengths)


@pytest.mark.parametrize("name", NAMES)
def test_envpool_runs_repeat_bit_for_bit_and_evaluate_on_the_official_env(name, tmp_path, capsys):
    module, _ = tiny_args(name, tmp_path)
    results = []
    for sub in ("a", "b"):
        _, args = tiny_args(
            name,
            tmp_path / sub,
            "--env-id",
            "dm_control/cartpole/balance",
            "--total-timesteps",
            "256",
            "--max-episode-steps",
            "50",
        )
        results.append(module.train(args))
    assert "training envs: EnvPool's CartpoleBalance-v1; evaluation on gymnasium's" in capsys.readouterr().out
    a, b = (torch.load(Path(r["run_dir"]) / f"{name}_last.pt", weights_only=True) for r in results)
    assert a["args"]["env_backend"] == "envpool"
    assert all(torch.equal(a["agent"][k], b["agent"][k]) for k in a["agent"])
    assert torch.equal(a["obs_rms"]["mean"], b["obs_rms"]["mean"])
    scalars = read_scalars(results[0]["run_dir"])
    for tag in ("charts/episodic_return", "losses/value_loss"):
        assert scalars[tag] == read_scalars(results[1]["run_dir"])[tag], tag
    # The final evaluation is the official env's: --eval-only of the checkpoint (gymnasium only) gives the same return.
    checkpoint = Path(results[0]["run_dir"]) / f"{name}_last.pt"
    eval_args = dict(
        eval_only=True,
        checkpoint=str(checkpoint),
        eval_episodes=1,
        max_episode_steps=50,
        cuda=False,
        output_dir=str(tmp_path / "e"),
    )
    eval_only = module.train(module.Args(**eval_args))
    assert eval_only["final_eval_return"] == pytest.approx(results[0]["final_eval_return"], rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_without_envpool_a_copied_script_trains_on_gymnasium_and_says_so(name, tmp_path):
    (tmp_path / f"{name}.py").write_bytes((ROOT / f"{name}.py").read_bytes())
    cli = ["--env-id", "dm_control/cartpole/balance", "--num-envs", "2", "--num-steps", "64", *TINY[name]]
    proc = without_envpool(name, [*cli, "--total-timesteps", "128", "--eval-episodes", "1", "--no-cuda"], tmp_path, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stdout.splitlines() if line.startswith("training envs:")]
    assert notes == [
        "training envs: gymnasium's dm_control/cartpole-balance-v0 (EnvPool is not installed (pip install envpool==1.2.0))"
    ]
    ckpt = torch.load(single_run_dir(tmp_path / "runs") / f"{name}_last.pt", weights_only=True)
    assert ckpt["args"]["env_backend"] == "gymnasium"


@pytest.mark.parametrize("name", NAMES)
def test_asking_for_envpool_where_it_cannot_serve_is_one_line(name, tmp_path):
    line = one_line(run_cli(f"{name}.py", ["--env-backend", "envpool", "--env-id", "Pendulum-v1"], cwd=tmp_path))
    assert (
        line == "error: --env-backend envpool: EnvPool has no port of it for Pendulum-v1; use --env-backend gymnasium or auto"
    )
    line = one_line(without_envpool(name, ["--env-backend", "envpool"], tmp_path))
    assert "EnvPool is not installed (pip install envpool==1.2.0)" in line and "--env-backend gymnasium" in line
    assert not list((tmp_path / "runs").glob("*")), "a run directory was created"


@pytest.mark.parametrize("name", NAMES)
def test_resume_keeps_the_checkpoints_backend_and_eval_only_needs_none(name, tmp_path):
    module, args = tiny_args(name, tmp_path / "first", "--env-id", "dm_control/cartpole/balance", "--total-timesteps", "128")
    checkpoint = Path(module.train(args)["run_dir"]) / f"{name}_last.pt"
    common = ["--total-timesteps", "256", "--output-dir", str(tmp_path / "resumed"), "--no-cuda"]
    line = one_line(without_envpool(name, ["--resume", str(checkpoint), *common], tmp_path))
    assert "--env-backend envpool: EnvPool is not installed" in line
    proc = without_envpool(
        name, ["--eval-only", "--checkpoint", str(checkpoint), "--output-dir", str(tmp_path / "e")], tmp_path
    )
    assert proc.returncode == 0 and "eval of" in proc.stdout, proc.stderr[-3000:]
    _, resumed = tiny_args(name, tmp_path / "resumed", "--resume", str(checkpoint), "--env-backend", "gymnasium", *common[:2])
    summary = module.train(resumed)
    saved = torch.load(Path(summary["run_dir"]) / f"{name}_last.pt", weights_only=True)
    assert saved["global_step"] == 256 and saved["args"]["env_backend"] == "envpool"  # the checkpoint's, not the flag's


def one_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


def test_the_tests_run_with_envpool_installed():
    """These tests need EnvPool (requirements.txt pins it); a machine without it fails here rather than skipping."""
    assert envpool.__version__ == "1.2.0" and sys.modules["envpool"] is envpool


@pytest.mark.parametrize("name", NAMES)
def test_envpools_thread_count_does_not_change_what_the_envs_return(name, tmp_path):
    module, args = tiny_args(name, tmp_path, "--env-id", "dm_control/cartpole/balance", "--max-episode-steps", "20")
    steps = []
    for threads in (1, 2):
        envs = module.make_training_envs(args, seed=1, threads=threads)
        assert isinstance(envs.unwrapped, module.EnvPoolVectorEnv) and envs.unwrapped.num_threads == min(
            threads, envs.num_envs
        )
        out = [envs.reset(seed=1)[0]]
        actions = np.random.default_rng(0).uniform(-1, 1, (30, envs.num_envs, 1))
        out += [np.concatenate([np.ravel(x) for x in envs.step(a)[:4]]) for a in actions]
        envs.close()
        steps.append(out)
    assert all(np.array_equal(a, b) for a, b in zip(*steps, strict=True))

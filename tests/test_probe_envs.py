"""The probe environments behave as their docstring table says (rewards, steps, ids)."""

import gymnasium as gym
import numpy as np
import pytest

import probe_envs


def rollout(env_id, policy, seed=0):
    """One episode: list of (obs, reward, terminated, truncated)."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    steps, done = [], False
    while not done:
        next_obs, reward, terminated, truncated, _ = env.step(policy(obs))
        steps.append((obs.copy(), reward, terminated, truncated))
        obs, done = next_obs, terminated or truncated
    return steps


@pytest.mark.parametrize("env_id", probe_envs.probe_ids(False) + probe_envs.probe_ids(True))
def test_registered_and_terminating(env_id):
    env = gym.make(env_id)
    assert env.observation_space.shape == (1,)
    assert isinstance(env.action_space, gym.spaces.Box if "Continuous" in env_id else gym.spaces.Discrete)
    steps = rollout(env_id, lambda o: env.action_space.sample())
    assert steps[-1][2] is True and not any(s[3] for s in steps), "probes end by termination only"
    assert len(steps) == (2 if env_id.startswith("Probe3") else 1)


@pytest.mark.parametrize("continuous", [False, True])
def test_value_probes_rewards(continuous):
    kind = "Continuous" if continuous else "Discrete"
    zero = np.zeros(1, np.float32) if continuous else 0
    assert [s[1] for s in rollout(f"Probe1{kind}-v0", lambda o: zero)] == [1.0]
    for seed in range(6):
        ((obs, reward, _, _),) = rollout(f"Probe2{kind}-v0", lambda o: zero, seed)
        assert obs[0] in (-1.0, 1.0) and reward == obs[0]
    (o0, r0, t0, _), (o1, r1, t1, _) = rollout(f"Probe3{kind}-v0", lambda o: zero)
    assert (o0[0], r0, t0, o1[0], r1, t1) == (0.0, 0.0, False, 1.0, 1.0, True)


def test_action_probes_rewards():
    assert rollout("Probe4Discrete-v0", lambda o: 1)[0][1] == 1.0
    assert rollout("Probe4Discrete-v0", lambda o: 0)[0][1] == -1.0
    assert rollout("Probe4Continuous-v0", lambda o: np.array([0.5], np.float32))[0][1] == pytest.approx(1.0)
    assert rollout("Probe4Continuous-v0", lambda o: np.array([-0.5], np.float32))[0][1] == pytest.approx(0.0)
    for seed in range(6):
        ((obs, r_match, _, _),) = rollout("Probe5Discrete-v0", lambda o: int(o[0] > 0), seed)
        ((_, r_miss, _, _),) = rollout("Probe5Discrete-v0", lambda o: int(o[0] < 0), seed)
        assert (r_match, r_miss) == (1.0, -1.0)
        ((obs, r, _, _),) = rollout("Probe5Continuous-v0", lambda o: 0.5 * o, seed)
        assert r == pytest.approx(1.0)
        ((obs, r, _, _),) = rollout("Probe5Continuous-v0", lambda o: -0.5 * o, seed)
        assert r == pytest.approx(0.0)
        ((obs, r, _, _),) = rollout("Probe6Continuous-v0", lambda o: 1.0 * o, seed)  # the bound on the obs's side
        assert r == pytest.approx(1.0)
        ((obs, r, _, _),) = rollout("Probe6Continuous-v0", lambda o: 0.5 * o, seed)
        assert r == pytest.approx(0.75)


def test_expected_outcomes_table():
    assert probe_envs.expected_outcomes("Probe3Discrete-v0", 0.9)[0].value == 0.9
    assert probe_envs.expected_outcomes("Probe5Continuous-v0", 0.9)[0].action == -0.5
    assert probe_envs.expected_outcomes("Probe5Discrete-v0", 0.9)[1].action == 1
    assert probe_envs.expected_outcomes("Probe6Continuous-v0", 0.9)[0].action == -1.0
    assert "Probe6Discrete-v0" not in probe_envs.probe_ids(False)
    with pytest.raises(ValueError, match="not a probe id"):
        probe_envs.expected_outcomes("CartPole-v1", 0.9)

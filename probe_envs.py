"""Probe environments: tiny tasks that each test one piece of the learning machinery.

After Andy Jones, "Debugging RL, Without the Agonizing Pain". Each probe comes in a
discrete-action flavour (``Discrete(2)``) and a continuous-action flavour
(``Box(-1, 1, (1,))``). Observations are ``Box(-inf, inf, (1,), float32)``. Every
episode ends by *termination* (never truncation), so the value of the last state is
exactly its reward. Importing this module registers every id with gymnasium.

| id (``Probe<k>Discrete-v0`` / ``Probe<k>Continuous-v0``) | what it tests | converges to |
|---|---|---|
| 1 constant obs 0, one step, reward +1 | the value network can fit a constant | ``V(0) = 1`` |
| 2 obs +-1 at random, one step, reward = obs | the value depends on the observation | ``V(-1) = -1``, ``V(+1) = +1`` |
| 3 obs 0 then obs 1, reward +1 only at the end | discounting, bootstrapping across steps | ``V(0) = gamma``, ``V(1) = 1`` |
| 4 constant obs 0, one step, reward depends on the action | advantages and the policy gradient | discrete: action 1 (reward +1; action 0 gives -1); continuous: action 0.5 (reward ``1 - (a - 0.5)^2``); ``V(0)`` = the policy's expected reward (1 once deterministic) |
| 5 obs +-1 at random, one step, reward when the action matches the obs | the policy conditions on the observation | discrete: action 0 for obs -1, action 1 for obs +1 (reward +1, else -1); continuous: action ``0.5 * obs`` (reward ``1 - (a - 0.5 obs)^2``); ``V(+-1)`` = the policy's expected reward (1 once deterministic) |
| 6 (continuous only) obs +-1 at random, one step, reward ``1 - (a - obs)^2`` | the policy plays a bound (bang-bang control) | action ``obs``, the box's bound on that side; ``V(+-1)`` = the policy's expected reward |

``expected_outcomes(env_id, gamma)`` returns these targets as data, so tests and the
CLI (``python probe_envs.py``) check a trained agent against the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

CONTINUOUS_TARGET = 0.5  # the best continuous action of probe 4, and the scale of probe 5's (probe 6's is 1: the bound)
CONTINUOUS_ONLY = (6,)  # probes with no discrete flavour


class ProbeEnv(gym.Env):
    """One probe; ``probe`` in 1..6 picks the task (6: continuous only), ``continuous`` the action space."""

    metadata = {"render_modes": []}

    def __init__(self, probe: int, continuous: bool, render_mode: str | None = None):
        assert probe in (1, 2, 3, 4, 5, 6), f"probe must be 1..6, got {probe}"
        assert continuous or probe not in CONTINUOUS_ONLY, f"probe {probe} has no discrete flavour"
        self.probe, self.continuous = probe, continuous
        self.render_mode = render_mode  # accepted for a uniform gym.make call; probes draw nothing
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        if continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        else:
            self.action_space = gym.spaces.Discrete(2)
        self._obs = 0.0
        self._t = 0

    def _observation(self) -> np.ndarray:
        return np.array([self._obs], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        random_sign = float(self.np_random.choice([-1.0, 1.0]))
        self._obs = random_sign if self.probe in (2, 5, 6) else 0.0
        return self._observation(), {}

    def _action_reward(self, action, best: float, scale: float = CONTINUOUS_TARGET) -> float:
        """+1/-1 for the right/wrong discrete action; ``1 - (a - a*)^2`` for a continuous one, ``a* = scale * best``."""
        if self.continuous:
            a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
            return 1.0 - (a - scale * best) ** 2
        return 1.0 if int(action) == (1 if best > 0 else 0) else -1.0

    def step(self, action):
        if self.probe == 1:
            reward = 1.0
        elif self.probe == 2:
            reward = self._obs
        elif self.probe == 3:
            if self._t == 0:
                self._t, self._obs = 1, 1.0
                return self._observation(), 0.0, False, False, {}
            reward = 1.0
        elif self.probe == 4:
            reward = self._action_reward(action, best=1.0)
        elif self.probe == 5:
            reward = self._action_reward(action, best=self._obs)
        else:
            reward = self._action_reward(action, best=self._obs, scale=1.0)
        return self._observation(), float(reward), True, False, {}


@dataclass(frozen=True)
class ProbeCheck:
    """What a trained agent should output for one observation of a probe.

    ``value`` is the converged ``V(obs)``; ``None`` means "the policy's own expected
    reward" (probes 4 and 5, where the value tracks how good the policy already is).
    ``action`` is the best action (discrete index or continuous value), ``None`` if any
    action is as good as any other.
    """

    obs: float
    value: float | None
    action: float | int | None


def probe_ids(continuous: bool) -> list[str]:
    kind = "Continuous" if continuous else "Discrete"
    return [f"Probe{k}{kind}-v0" for k in range(1, 7) if continuous or k not in CONTINUOUS_ONLY]


def is_probe_id(env_id: str) -> bool:
    return env_id in probe_ids(False) + probe_ids(True)


def expected_outcomes(env_id: str, gamma: float) -> list[ProbeCheck]:
    """The table of the module docstring as data: one ``ProbeCheck`` per distinct observation."""
    if not is_probe_id(env_id):
        raise ValueError(f"{env_id!r} is not a probe id; probe ids are {probe_ids(False) + probe_ids(True)}")
    probe, continuous = int(env_id[5]), "Continuous" in env_id

    def best(sign: float) -> float | int:
        return CONTINUOUS_TARGET * sign if continuous else int(sign > 0)

    return {
        1: [ProbeCheck(0.0, 1.0, None)],
        2: [ProbeCheck(-1.0, -1.0, None), ProbeCheck(1.0, 1.0, None)],
        3: [ProbeCheck(0.0, gamma, None), ProbeCheck(1.0, 1.0, None)],
        4: [ProbeCheck(0.0, None, best(1.0))],
        5: [ProbeCheck(-1.0, None, best(-1.0)), ProbeCheck(1.0, None, best(1.0))],
        6: [ProbeCheck(-1.0, None, -1.0), ProbeCheck(1.0, None, 1.0)],
    }[probe]


def register_probes() -> None:
    for continuous in (False, True):
        for env_id in probe_ids(continuous):
            if env_id not in gym.registry:
                gym.register(env_id, entry_point=ProbeEnv, kwargs={"probe": int(env_id[5]), "continuous": continuous})


register_probes()


if __name__ == "__main__":
    # `python probe_envs.py` prints each probe's expected outcomes (gamma = 0.99).
    for env_id in probe_ids(False) + probe_ids(True):
        print(env_id, [(c.obs, c.value, c.action) for c in expected_outcomes(env_id, 0.99)])

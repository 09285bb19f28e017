"""PPO for continuous actions: a Gaussian (or Beta) policy trained with the clipped surrogate and GAE.

PPO (Schulman et al., 2017, arXiv:1707.06347) with GAE (Schulman et al., 2016, arXiv:1506.02438): the Gaussian's mean is
an MLP, its log std a free parameter, the value a separate MLP; the env clips the actions; a truncated episode bootstraps
from its final observation's value. The update evaluates the policy at a randomly shifted mean (the Beta: logits), as RPO
does (Rahman & Xue, 2022, arXiv:2212.07536); `--rpo-alpha 0` is plain PPO. `--policy auto` trains that Gaussian on the
control suite and elsewhere a Beta on the action box (Chou et al., 2017).

    python ppo_continuous.py --env-id dm_control/walker/walk
    python ppo_continuous.py --env-id dm_control/cartpole/swingup --total-timesteps 500000 --track
    python ppo_continuous.py --resume runs/<run>/ppo_continuous_last.pt --total-timesteps 2000000
    python ppo_continuous.py --eval-only --checkpoint runs/<run>/ppo_continuous_best.pt --capture-video

`--help` lists every option. The math: `docs/ppo_continuous.md` (inline), `docs/ppo_continuous_annotations.md`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import importlib.util
import io
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import deque
from typing import Literal

try:  # Ctrl-C while the libraries load: the exit code of a Ctrl-C later, without a traceback
    import gymnasium as gym
    import numpy as np
    import torch
    import torch.nn as nn
    import tyro
    from torch.utils.tensorboard import SummaryWriter
except KeyboardInterrupt:
    sys.exit(130)


# -------------------------------------------------------------------------------- Arguments
@dataclasses.dataclass
class Args:
    """PPO with RPO's perturbation for continuous actions (a Gaussian the env clips, or a Beta on the box), in one file."""

    exp_name: str = "ppo_continuous"
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when it is available (falls back to CPU and says so once)"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """record one episode of every evaluation as mp4 under `<run_dir>/videos/` (slow with CPU rendering)"""
    env_id: str = "dm_control/walker/walk"
    """gymnasium id, `dm_control/<domain>-<task>-v0`, `dm_control/<domain>/<task>` or a `Probe<k>Continuous-v0`"""
    total_timesteps: int = 1_000_000
    """total environment steps of training (summed over the parallel envs)"""
    num_envs: int = 8
    """number of parallel training environments"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """training envs (auto: EnvPool where its port is the official task); evaluation is always on the official env"""
    num_steps: int = 256
    """steps per environment per rollout; the batch is num_envs * num_steps"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    learning_rate: float = 1e-3
    """learning rate of the optimizer (annealed linearly to 0 with --anneal-lr)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    num_minibatches: int = 8
    """number of minibatches the batch is split into per epoch"""
    update_epochs: int = 10
    """passes over the batch per update"""
    norm_adv: bool = True
    """normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient epsilon (also the value clipping range with --clip-vloss)"""
    clip_vloss: bool = False
    """clip the value loss around the rollout's values (PPO2's variant), for a value that overshoots jumping returns"""
    ent_coef: float = 0.0
    """entropy bonus coefficient (> 0 slows the std's collapse, at the price of a noisier final policy)"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """maximum global norm of the gradient"""
    max_episode_steps: int | None = None
    """override the env's time limit (e.g. short episodes for quick tests); None keeps the env's own"""
    torch_threads: int = 0
    """CPU threads of the update (0: torch's default, the machine's cores or OMP_NUM_THREADS); the rollout acts in numpy"""
    target_kl: float | None = None
    """end the update after an epoch whose approximate KL (the policy's change, RPO's shift aside) exceeds this, e.g. 0.02"""
    policy: Literal["auto", "gaussian", "beta"] = "auto"
    """the policy family. auto: gaussian on dm_control/... tasks or an unbounded box, else beta; gaussian: the env clips"""
    rpo_alpha: float | None = None
    """RPO: the update shifts the mean (the Beta: logits) by Uniform(-alpha, alpha); None: gaussian 0.5, beta 0.2; 0: PPO"""
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the policy-mean MLP"""
    value_hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the value MLP"""
    init_log_std: float | None = None
    """initial log standard deviation of the Gaussian policy (None: 0, std 1 on actions in [-1, 1]); the Beta has none"""
    norm_obs: bool = True
    """normalize observations by one running mean/std shared by all training envs (clipped to [-10, 10])"""
    reward_scaling: bool = True
    """divide rewards by the running std of the discounted return (the learner only; logs show raw returns)"""
    output_dir: str = "runs"
    """the run directory is `<output_dir>/<run_name>` (TensorBoard events, checkpoints, videos)"""
    eval_interval: int = 50_000
    """environment steps between deterministic evaluations (0 = only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel, one per eval env)"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only (and record with --capture-video)"""
    eval_only: bool = False
    """evaluate --checkpoint without training"""
    resume: str | None = None
    """continue training from this checkpoint to --total-timesteps, in a new run dir, with its saved env and hyperparameters"""


SCRIPT = "ppo_continuous"


class ConfigError(ValueError):
    """Bad input, reported as one line before any heavy work."""


class TrainingDiverged(RuntimeError):
    """A loss became NaN or inf; the run stops without overwriting the last good checkpoint."""


# -------------------------------------------------------------------------------- Network
def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int = 0, out_std: float = 1.0) -> nn.Sequential:
    """Linear+Tanh hidden layers, then a linear layer of out_dim outputs (0: none, the last hidden layer's features)."""
    layers, last = [], in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(last, size)), nn.Tanh()]
        last = size
    return nn.Sequential(*layers, *([layer_init(nn.Linear(last, out_dim), std=out_std)] if out_dim else []))


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_space, policy: str, policy_hidden_sizes, value_hidden_sizes, init_log_std=0.0):
        super().__init__()
        self.critic = mlp(obs_dim, tuple(value_hidden_sizes), 1, out_std=1.0)
        self.actor = mlp(obs_dim, tuple(policy_hidden_sizes))
        features = policy_hidden_sizes[-1] if policy_hidden_sizes else obs_dim
        self.policy_head = POLICIES[policy](features, action_space, init_log_std)  # the family

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The family's parameters `params`: the Gaussian's mean, or the Beta's two logits (..., 2, act_dim)."""
        return self.policy_head(self.actor(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)


class BoxPolicy(nn.Module):
    """What every family shares: a linear head near zero (Andrychowicz et al., 2021) and the env's action box, as buffers."""

    def __init__(self, features: int, outputs: int, action_space: gym.spaces.Box):
        super().__init__()
        head = layer_init(nn.Linear(features, outputs), std=0.01)
        self.weight, self.bias = head.weight, head.bias  # held here, so the family's own parameters come after them
        for name in ("low", "high"):
            bound = np.nan_to_num(getattr(action_space, name), posinf=UNBOUNDED, neginf=-UNBOUNDED)
            self.register_buffer(name, torch.as_tensor(bound, dtype=torch.float32), persistent=False)

    def at_bounds(self, action: torch.Tensor) -> torch.Tensor:
        """Which components of the env's action lie within 1% of the box's width from a bound (a clipped one: on it)."""
        return torch.minimum(action - self.low, self.high - action) < 0.01 * (self.high - self.low)


class GaussianPolicy(BoxPolicy):
    """--policy gaussian, RPO's: u ~ N(mu_theta(s), diag(sigma^2)), sigma a parameter; the env plays clip(u). `params`: mu."""

    def __init__(self, features: int, action_space: gym.spaces.Box, init_log_std: float):
        super().__init__(features, action_space.shape[0], action_space)
        self.log_std = nn.Parameter(torch.full(action_space.shape, float(init_log_std)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(h, self.weight, self.bias)

    def act(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        log_std = self.log_std.detach().numpy()  # act: sample and log-prob in numpy, where the rollout's network runs
        noise = np.random.standard_normal(params.shape).astype(np.float32)
        # LaTeX: u_t = \mu_\theta(s_t) + \sigma \odot \xi_t, \quad \xi_t \sim \mathcal{N}(0, I)
        u = params + np.exp(log_std) * noise
        # LaTeX: \log \pi_\theta(u_t \mid s_t) = -\frac{1}{2} \|\xi_t\|^2 - \sum_j \log \sigma_j - \frac{d}{2} \log 2\pi
        logprob = -0.5 * np.square(noise).sum(-1) - (log_std.sum() + 0.5 * math.log(2.0 * math.pi) * params.shape[-1])
        return u, logprob

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return params + self.log_std.exp() * torch.randn(params.shape, generator=generator, device=params.device)

    def log_prob(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: \log \pi_\theta(u \mid s) = -\sum_j (\frac{(u_j - \mu_j)^2}{2 \sigma_j^2} + \log \sigma_j) - \frac{d}{2} \log 2\pi
        return -(((u - params) * torch.exp(-self.log_std)).pow(2) * 0.5 + self.log_std + 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathcal{H}[\pi_\theta(\cdot \mid s)] = \sum_j \left(\log \sigma_j + \frac{1}{2} \log (2 \pi e)\right)
        return (self.log_std + 0.5 * (math.log(2.0 * math.pi) + 1.0)).sum(-1).expand(params.shape[:-1])  # in every state

    def mean_action(self, params: torch.Tensor) -> torch.Tensor:
        return self.env_action(params)  # the mean, clipped

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: a_t = \operatorname{clip}(u_t, a_{low}, a_{high})
        return torch.clamp(u, self.low, self.high)

    def shift(self, params: torch.Tensor, alpha: float) -> torch.Tensor:
        return rpo_perturbation(params, alpha)


class BetaPolicy(BoxPolicy):
    """--policy beta: u ~ Beta(alpha, beta), alpha, beta > 1 (never U-shaped); the env plays low + (high - low) u."""

    def __init__(self, features: int, action_space: gym.spaces.Box, init_log_std: None):
        super().__init__(features, 2 * action_space.shape[0], action_space)  # logits near 0: Beta(1.69, 1.69)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(h, self.weight, self.bias).unflatten(-1, (2, -1))

    @staticmethod
    def distribution(params: torch.Tensor) -> torch.distributions.Beta:
        alpha_logit, beta_logit = params.unbind(-2)
        # LaTeX: \alpha_j = 1 + \operatorname{softplus}(\ell^\alpha_j(s)), \quad \beta_j = 1 + \operatorname{softplus}(\ell^\beta_j(s))
        concentrations = 1.0 + nn.functional.softplus(alpha_logit), 1.0 + nn.functional.softplus(beta_logit)
        return torch.distributions.Beta(*concentrations, validate_args=False)  # NaN ones reach the divergence check

    def act(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        params = params.reshape(*params.shape[:-1], 2, -1)  # act: the rollout's sample, in numpy as its network runs
        alpha, beta = np.moveaxis(1.0 + np.logaddexp(0.0, params), -2, 0)  # distribution()'s, in numpy
        # LaTeX: u_t \sim \mathrm{Beta}(\alpha_\theta(s_t), \beta_\theta(s_t)), \ u_t \in [10^{-6}, 1 - 10^{-6}]
        u = np.clip(np.random.beta(alpha, beta), BETA_EPS, 1.0 - BETA_EPS).astype(np.float32)  # 0 and 1 have density 0
        return u, self.log_prob(torch.from_numpy(params), torch.from_numpy(u)).numpy()

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # Beta sampling takes no generator: a given one seeds a forked copy of the global ones, which stay untouched.
        with torch.random.fork_rng(devices=[params.device] if params.is_cuda else [], enabled=generator is not None):
            if generator is not None:
                torch.manual_seed(int(torch.randint(2**31, (), generator=generator, device=generator.device)))
            return self.distribution(params).sample().clamp(BETA_EPS, 1.0 - BETA_EPS)

    def log_prob(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: \log \pi_\theta(u \mid s) = \sum_j (\alpha_j - 1) \log u_j + (\beta_j - 1) \log(1 - u_j) - \log B(\alpha_j, \beta_j)
        # LaTeX: \log B(\alpha, \beta) = \log\Gamma(\alpha) + \log\Gamma(\beta) - \log\Gamma(\alpha + \beta)
        return self.distribution(params).log_prob(u).sum(-1)  # u's: the box's scale cancels in the ratio

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathcal{H} = \sum_j \log B(\alpha_j, \beta_j) - (\alpha_j - 1)\psi(\alpha_j) - (\beta_j - 1)\psi(\beta_j) + (\alpha_j + \beta_j - 2)\psi(\alpha_j + \beta_j)
        return self.distribution(params).entropy().sum(-1)

    def mean_action(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathbb{E}[a] = a_{low} + (a_{high} - a_{low}) \frac{\alpha}{\alpha + \beta}
        return self.env_action(self.distribution(params).mean)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: a_t = a_{low} + (a_{high} - a_{low})\, u_t
        return self.low + (self.high - self.low) * u

    def shift(self, params: torch.Tensor, alpha: float) -> torch.Tensor:
        return rpo_perturbation(params, alpha)  # both logits


POLICIES = {"gaussian": GaussianPolicy, "beta": BetaPolicy}
RPO_ALPHA = {"gaussian": 0.5, "beta": 0.2}  # --rpo-alpha's default per family: the values the runs chose
BETA_EPS = 1e-6
UNBOUNDED = 1e6  # where an infinite bound of the action box stands


# -------------------------------------------------------------------------------- Normalization
class RunningMeanStd:
    """Running mean and variance (float64) of batches (Chan et al.'s parallel update); disabled, `normalize` only casts."""

    def __init__(self, shape: tuple[int, ...] = (), enabled: bool = True):
        self.mean, self.var, self.count, self.enabled = np.zeros(shape), np.ones(shape), 1e-4, enabled

    def update(self, x: np.ndarray) -> None:
        if not self.enabled:
            return
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        # LaTeX: \sigma^2 \leftarrow \frac{n \sigma^2 + n_b \sigma_b^2 + \delta^2 n n_b / (n + n_b)}{n + n_b}
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        # LaTeX: \mu \leftarrow \mu + \delta \frac{n_b}{n + n_b}, \quad n \leftarrow n + n_b
        self.mean, self.count = self.mean + delta * n / total, total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.asarray(x, np.float32)
        # LaTeX: \tilde{o} = \operatorname{clip}\left(\frac{o - \mu}{\sqrt{\sigma^2 + 10^{-8}}}, -10, 10\right)
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10.0, 10.0).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": float(self.count)}  # float64

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].numpy().copy(), state["var"].numpy().copy(), float(state["count"])


class RewardScaler:
    """--reward-scaling: rewards divided by the running std of the discounted return of each env's episode."""

    def __init__(self, num_envs: int, gamma: float, enabled: bool):
        self.rms, self.gamma, self.enabled, self.discounted_return = RunningMeanStd(), gamma, enabled, np.zeros(num_envs)

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return reward
        # LaTeX: G_t = \gamma (1 - \mathrm{done}_{t-1}) G_{t-1} + r_t, \quad \tilde{r}_t = r_t / \sqrt{\sigma_G^2 + 10^{-8}}
        self.discounted_return = self.discounted_return * self.gamma + reward
        self.rms.update(self.discounted_return)
        self.discounted_return[done] = 0.0
        return reward / np.sqrt(self.rms.var + 1e-8)


# -------------------------------------------------------------------------------- Rollout
@dataclasses.dataclass
class Rollout:
    """(num_steps, num_envs, ...) float32 arrays; NEXT_STEP autoreset: row t+1 is s_{t+1}, the final observation too."""

    obs: np.ndarray
    actions: np.ndarray  # as sampled, before the env's mapping (the Gaussian's clip, the Beta's scaling to the box)
    logprobs: np.ndarray
    rewards: np.ndarray  # scaled with --reward-scaling
    values: np.ndarray
    next_values: np.ndarray  # V(s_{t+1}): the next row's value, the real final observation's where an episode ended
    terminated: np.ndarray
    truncated: np.ndarray
    resets: np.ndarray  # 1 on a reset step, the one after an episode end: its action is ignored, it is never trained on

    @classmethod
    def empty(cls, num_steps: int, envs: gym.vector.VectorEnv) -> Rollout:
        zeros = lambda *shape: np.zeros((num_steps, envs.num_envs, *shape), np.float32)  # noqa: E731
        per_step = {k: zeros() for k in ("logprobs", "rewards", "values", "next_values", "terminated", "truncated", "resets")}
        return cls(obs=zeros(*envs.single_observation_space.shape), actions=zeros(*envs.single_action_space.shape), **per_step)


class RolloutPolicy:
    """A numpy copy of the agent for the rollout: cheaper than torch on a CPU. Noise from numpy's global RNG."""

    def __init__(self, agent: Agent):
        def layers(net: list) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy()) for m in net[::2]]

        self.head = copy.deepcopy(agent.policy_head).cpu()  # the family's numpy `act` and its `env_action`
        self.actor, self.critic = layers([*agent.actor, self.head]), layers(agent.critic)

    @staticmethod
    def mlp(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
        for weight, bias in layers[:-1]:
            x = np.tanh(x @ weight + bias)
        return x @ layers[-1][0] + layers[-1][1]

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.mlp(self.critic, obs)[:, 0]

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The sample u, its log-prob, V(s) and the action the env plays, for a (N, obs_dim) float32 batch."""
        u, logprob = self.head.act(self.mlp(self.actor, obs))
        return u, logprob, self.value(obs), self.head.env_action(torch.from_numpy(u)).numpy()


def collect_rollout(policy: RolloutPolicy, envs, obs: np.ndarray, obs_rms, scale_reward, rollout: Rollout) -> tuple:
    """Fill `rollout`, updating `obs_rms`; return the next observation and the finished episodes (step, return, length)."""
    episodes = []
    done = rollout.terminated[-1] + rollout.truncated[-1] > 0  # the previous rollout's last step (zeros before the first)
    for t in range(len(rollout.obs)):
        rollout.obs[t], rollout.resets[t] = obs, done  # after an episode end: a reset step
        rollout.actions[t], rollout.logprobs[t], rollout.values[t], env_action = policy.act(obs)
        raw_obs, reward, terminated, truncated, infos = envs.step(env_action)
        obs_rms.update(raw_obs)
        obs = obs_rms.normalize(raw_obs)
        done = terminated | truncated
        rollout.rewards[t], rollout.terminated[t], rollout.truncated[t] = scale_reward(reward, done), terminated, truncated
        for i in np.flatnonzero(infos.get("_episode", [])):  # the statistics of the episodes that ended at this step
            episodes.append(((t + 1) * envs.num_envs, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
    rollout.next_values[:] = np.concatenate([rollout.values[1:], policy.value(obs)[None]])
    return obs, episodes


# -------------------------------------------------------------------------------- Advantages
def compute_gae(rewards, values, next_values, terminated, truncated, gamma: float, gae_lambda: float) -> tuple:
    """GAE over (T, N) tensors; `next_values[t]` is V of step t's real successor, the final observation where an episode
    ended (so truncation bootstraps from it). A terminated successor is worth 0; no advantage crosses an episode end."""
    not_done = 1.0 - torch.maximum(terminated, truncated)
    # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last = deltas[t] + gamma * gae_lambda * not_done[t] * last
        advantages[t] = last
    # LaTeX: \hat{R}_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    # LaTeX: \tilde{A}_t = \frac{\hat{A}_t - \operatorname{mean}(\hat{A})}{\operatorname{std}(\hat{A}) + 10^{-8}}
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var(unbiased=False)
    # LaTeX: \mathrm{EV} = 1 - \frac{\operatorname{Var}[\hat{R}_t - V(s_t)]}{\operatorname{Var}[\hat{R}_t]}
    return float("nan") if var_returns == 0 else float(1.0 - (returns - values).var(unbiased=False) / var_returns)


# -------------------------------------------------------------------------------- Losses and update
def clipped_surrogate_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    # LaTeX: L^{\mathrm{CLIP}} = -\mathbb{E}_t[\min(\rho_t \hat{A}_t, \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon) \hat{A}_t)]
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef) * advantages).mean()


def value_loss(new_values, old_values, returns, clip_coef: float, clip_vloss: bool) -> torch.Tensor:
    if not clip_vloss:
        # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[(V_\theta(s_t) - \hat{R}_t)^2\right]
        return 0.5 * (new_values - returns).pow(2).mean()
    # LaTeX: V^\mathrm{clip}_t = V_\mathrm{old}(s_t) + \mathrm{clip}(V_\theta(s_t) - V_\mathrm{old}(s_t), -\epsilon, \epsilon)
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t[\max((V_\theta(s_t) - \hat{R}_t)^2, (V^{\mathrm{clip}}_t - \hat{R}_t)^2)]
    return 0.5 * torch.max((new_values - returns).pow(2), (clipped_values - returns).pow(2)).mean()


def approx_kl(logratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two estimators of KL(pi_old || pi) from samples of pi_old (http://joschu.net/blog/kl-approx.html)."""
    # LaTeX: \widehat{\mathrm{KL}}_1 = \mathbb{E}_t\left[-\log \rho_t\right]
    old_kl = (-logratio).mean()
    # LaTeX: \widehat{\mathrm{KL}}_3 = \mathbb{E}_t\left[(\rho_t - 1) - \log \rho_t\right]
    new_kl = (torch.exp(logratio) - 1.0 - logratio).mean()
    return old_kl, new_kl


def rpo_perturbation(mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """RPO's shifted mean: fresh noise per sample and dimension each time the update (not the rollout) evaluates the policy."""
    if alpha == 0.0:
        return mean
    # LaTeX: \tilde{\mu}_\theta(s_t) = \mu_\theta(s_t) + z_t, \quad z_t \sim \mathcal{U}(-\alpha, \alpha)^d
    return mean + torch.empty_like(mean).uniform_(-alpha, alpha)


def make_optimizer(agent: Agent, args: Args) -> torch.optim.Optimizer:
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # fused: one call for all


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], args: Args) -> dict:
    """Epochs of minibatch steps on the clipped surrogate; the diagnostics' means, checked once (a check syncs a GPU)."""
    size = batch["advantages"].numel()  # reset steps are not in the batch, so it can be a little short of N * T
    minibatch_size = size // args.num_minibatches
    columns = [batch[k].reshape(size, -1) for k in ("obs", "actions", "logprobs", "advantages", "returns", "values")]
    packed, widths = torch.cat(columns, 1), [c.shape[1] for c in columns]  # one gather per epoch shuffles all
    losses, logratios, family = [], [], agent.policy_head  # detached, per minibatch: the diagnostics come at the end
    for epoch in range(1, args.update_epochs + 1):  # noqa: B007  (`epoch` is reported)
        shuffled = packed[torch.randperm(size).to(packed.device)]  # the CPU generator: one order on any device
        for minibatch in shuffled[: minibatch_size * args.num_minibatches].split(minibatch_size):
            obs, actions, old_logprob, advantages, returns, old_values = minibatch.split(widths, dim=1)
            params = agent.policy(obs)
            # LaTeX: \log \rho_t = \log \pi_\theta(a_t \mid s_t) - \log \pi_{\theta_\mathrm{old}}(a_t \mid s_t)
            logratio = family.log_prob(family.shift(params, args.rpo_alpha), actions).unsqueeze(1) - old_logprob
            logratios.append(torch.cat([family.log_prob(params, actions).unsqueeze(1) - old_logprob, logratio], 1).detach())
            if args.norm_adv:
                advantages = normalize_advantages(advantages)
            pg_loss = clipped_surrogate_loss(torch.exp(logratio), advantages, args.clip_coef)
            v_loss = value_loss(agent.critic(obs), old_values, returns, args.clip_coef, args.clip_vloss)
            entropy = family.entropy(params).mean()
            # LaTeX: L = L^{\mathrm{CLIP}} - c_H \mathcal{H}[\pi_\theta] + c_V L^{V}
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            losses.append(torch.stack([pg_loss, v_loss, entropy]).detach())
        if args.target_kl is not None and approx_kl(torch.cat(logratios[-args.num_minibatches :])[:, 0])[1] > args.target_kl:
            break  # this epoch's mean KL estimate is past the target
    stats = dict(zip(("policy_loss", "value_loss", "entropy"), torch.stack(losses).mean(0).tolist(), strict=True))
    bad = [name for name, value in stats.items() if not math.isfinite(value)]
    if bad or not all(torch.isfinite(p).all() for p in agent.parameters()):  # an inf gradient can leave the loss finite
        raise TrainingDiverged(f"non-finite {', '.join(bad) or 'parameters'}")
    change, shifted = torch.cat(logratios).unbind(1)  # the policy's log-ratio (RPO's shift is noise, not a change); the loss's
    old_kl, kl = approx_kl(change)
    clipfrac, rpo_clipfrac = ((torch.stack([change, shifted]).exp() - 1.0).abs() > args.clip_coef).float().mean(1)
    stats |= {"old_approx_kl": old_kl.item(), "approx_kl": kl.item(), "clipfrac": clipfrac.item(), "epochs": epoch}
    return stats | {"rpo_clipfrac": rpo_clipfrac.item()}


# -------------------------------------------------------------------------------- Training
@dataclasses.dataclass
class Run:
    args: Args
    device: torch.device
    run_dir: str
    writer: SummaryWriter
    envs: gym.vector.VectorEnv | None  # None with --eval-only
    eval_envs: gym.vector.VectorEnv
    agent: Agent
    optimizer: torch.optim.Optimizer
    reward_scaler: RewardScaler
    obs_rms: RunningMeanStd
    global_step: int = 0
    iteration: int = 0
    last_eval: float | None = None
    best_eval: float = -math.inf

    def path(self, kind: str) -> str:  # "last" or "best"
        return os.path.join(self.run_dir, f"{SCRIPT}_{kind}.pt")

    def close(self) -> None:
        for resource in (self.envs, self.eval_envs, self.writer):
            if resource is not None:  # no training envs with --eval-only
                resource.close()
        if self.args.track:
            import wandb

            wandb.finish()


def set_up(args: Args) -> Run:
    """Checks, seeds, run dir, logging, envs, agent; a checkpoint's state when resuming or evaluating."""
    gl_backend = choose_gl_backend(args.capture_video)  # before anything imports mujoco
    if args.eval_only and not args.checkpoint:
        raise ConfigError(f"--eval-only needs --checkpoint PATH (a {SCRIPT}_*.pt file)")
    source_path, flag = (args.checkpoint, "--checkpoint") if args.eval_only else (args.resume, "--resume")
    source = load_checkpoint(source_path, flag) if source_path else None
    args = args_with_checkpoint(args, source) if source is not None else args
    if args.resume and args.total_timesteps // (args.num_envs * args.num_steps) <= source["iteration"]:
        nothing = f"--total-timesteps {args.total_timesteps} leaves nothing to train after the checkpoint's step"
        raise ConfigError(f"{nothing} {source['global_step']}; pass a larger total to continue")
    policy, rpo_alpha, init_log_std, note = check_args(args, gl_backend)
    if not args.eval_only:  # the checkpoint records the resolved policy and backend, so --resume keeps them
        print(note)
        backend, note = choose_env_backend(args)
        print(note)
        args = dataclasses.replace(args, policy=policy, rpo_alpha=rpo_alpha, init_log_std=init_log_std, env_backend=backend)
    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.output_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.cuda and not torch.cuda.is_available():
        print("CUDA is not available; running on CPU")
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    if args.track:
        import wandb

        where = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_name, dir=run_dir)
        wandb.init(**where, config=dataclasses.asdict(args), sync_tensorboard=True, save_code=True)
    writer = SummaryWriter(run_dir)
    table = "\n".join(f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    eval_envs = make_vector_env(args, args.eval_episodes, args.seed + 10_000, render_first=args.capture_video)
    threads = args.torch_threads or torch.get_num_threads()  # the update's and EnvPool's
    envs = None if args.eval_only else make_training_envs(args, args.seed, threads)
    torch.set_num_threads(1)  # the orthogonal init's QR sums in an order that depends on the thread count
    network = (args.policy, args.policy_hidden_sizes, args.value_hidden_sizes, args.init_log_std)
    agent = Agent(eval_envs.single_observation_space.shape[0], eval_envs.single_action_space, *network).to(device)
    torch.set_num_threads(threads)  # the update's
    obs_rms = RunningMeanStd(eval_envs.single_observation_space.shape, args.norm_obs)
    scaler = RewardScaler(args.num_envs, args.gamma, args.reward_scaling)
    run = Run(args, device, run_dir, writer, envs, eval_envs, agent, make_optimizer(agent, args), scaler, obs_rms)
    if source is not None:  # the checkpoint's own env and hyperparameters (args_with_checkpoint)
        run.agent.load_state_dict(source["agent"])
        run.obs_rms.load_state_dict(source["obs_rms"])
        run.global_step, run.iteration = source["global_step"], source["iteration"]
        if args.resume:
            run.optimizer.load_state_dict(source["optimizer"])
            run.reward_scaler.rms.load_state_dict(source["reward_rms"])
            restore_rng(source["rng"], device, source.get("device", "cpu"), source_path)
    return run


class DeferredCtrlC:
    """Ctrl-C, raised at the loop's next `check`, not inside TensorBoard's writer, whose lock it can leave held (closing the
    run then hangs); a second press raises at once. Off the main thread, or where SIGINT is ignored (nohup), no change."""

    def __init__(self):
        self.pressed, self.previous = False, signal.getsignal(signal.SIGINT)
        if self.previous not in (signal.SIG_IGN, None) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.check)

    def check(self, *pressed_now) -> None:  # the loop's check; as SIGINT's handler, it notes a first press
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = bool(pressed_now)

    def restore(self) -> None:
        if signal.getsignal(signal.SIGINT) == self.check:
            signal.signal(signal.SIGINT, self.previous)


def train(args: Args) -> dict:
    run = set_up(args)
    start_time = time.time()
    if args.eval_only:  # evaluate the checkpoint's policy once, log it, print one line
        with contextlib.closing(run):
            eval_returns = evaluate(run, "eval-only" if args.capture_video else None)
        mean, std = float(eval_returns.mean()), float(eval_returns.std())
        print(f"eval of {args.checkpoint}: return {mean:.2f} ± {std:.2f} over {len(eval_returns)} episodes")
        summary = dict(run_dir=run.run_dir, global_step=run.global_step, train_sps=0.0, wall_time=time.time() - start_time)
        return summary | dict(final_eval_return=mean, final_eval_std=std, best_eval_return=mean, eval_returns=eval_returns)
    args, agent, optimizer, writer, family = run.args, run.agent, run.optimizer, run.writer, run.agent.policy_head
    batch_size = args.num_envs * args.num_steps
    # LaTeX: U = \left\lfloor \frac{T_{total}}{N \cdot T} \right\rfloor
    num_iterations = args.total_timesteps // batch_size
    rollout = Rollout.empty(args.num_steps, run.envs)
    raw_obs, _ = run.envs.reset(seed=args.seed + run.global_step)  # a resumed run starts fresh episodes
    run.obs_rms.update(raw_obs)
    obs = run.obs_rms.normalize(raw_obs)
    end_step = num_iterations * batch_size
    if args.resume:
        print(f"resuming {args.resume} at step {run.global_step} with its saved hyperparameters; training to step {end_step}")
    elif end_step != args.total_timesteps:
        rounded = f"--total-timesteps {args.total_timesteps} rounded down to whole rollouts of {batch_size} steps"
        print(f"training to step {end_step}: {rounded}")
    recent_returns = deque(maxlen=20)
    train_time, trained_steps = 0.0, 0
    save_checkpoint(run, "last")
    ctrl_c = DeferredCtrlC()
    try:
        for iteration in range(run.iteration + 1, num_iterations + 1):
            ctrl_c.check()
            tick = time.time()
            if args.anneal_lr:
                # LaTeX: \alpha_u = \alpha_0 \left(1 - \frac{u - 1}{U}\right)
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
            # ---- collect a rollout with the current policy
            obs, episodes = collect_rollout(RolloutPolicy(agent), run.envs, obs, run.obs_rms, run.reward_scaler, rollout)
            ctrl_c.check()  # the rollout is dropped: _last holds the update before it
            for offset, episode_return, episode_length in episodes:
                recent_returns.append(episode_return)
                writer.add_scalar("charts/episodic_return", episode_return, run.global_step + offset)
                writer.add_scalar("charts/episodic_length", episode_length, run.global_step + offset)
            # ---- advantages and value targets
            data = {k: torch.as_tensor(v, device=run.device) for k, v in vars(rollout).items()}
            gae_inputs = [data[k] for k in ("rewards", "values", "next_values", "terminated", "truncated")]
            advantages, returns = compute_gae(*gae_inputs, args.gamma, args.gae_lambda)
            trained = data["resets"].flatten() == 0  # a reset step's action was ignored by the env: not a transition
            batch = {k: data[k].flatten(0, 1)[trained] for k in ("obs", "actions", "logprobs", "values")}
            batch.update(advantages=advantages.flatten()[trained], returns=returns.flatten()[trained])
            # ---- update
            stats = ppo_update(agent, optimizer, batch, args)
            run.iteration, run.global_step = iteration, run.global_step + batch_size
            save_checkpoint(run, "last")
            train_time, trained_steps = train_time + time.time() - tick, trained_steps + batch_size
            # ---- log
            sps = trained_steps / train_time
            stats["explained_variance"] = explained_variance(batch["values"], batch["returns"])
            stats = {f"losses/{key}": value for key, value in stats.items()}
            stats |= {"charts/learning_rate": optimizer.param_groups[0]["lr"], "charts/SPS": sps}
            stats["charts/actions_at_bounds"] = family.at_bounds(family.env_action(batch["actions"])).float().mean()
            for key, value in stats.items():
                writer.add_scalar(key, value, run.global_step)
            # ---- evaluate and save: every eval_interval steps, and at the end
            every, last = args.eval_interval, iteration == num_iterations
            if last or (every > 0 and run.global_step // every > (run.global_step - batch_size) // every):
                eval_returns = evaluate(run, f"eval-step-{run.global_step}" if args.capture_video else None)
                run.last_eval = float(eval_returns.mean())
                save_checkpoint(run, "last")
                if run.last_eval >= run.best_eval:
                    run.best_eval = run.last_eval
                    save_checkpoint(run, "best")
            print_progress(run, sps, np.mean(recent_returns or [math.nan]), final=last)
    except TrainingDiverged as e:  # raised by ppo_update before the step was counted
        stopped = f"at global step {run.global_step + batch_size}; stopped"
        raise TrainingDiverged(f"{e} {stopped}. Last good checkpoint: {last_checkpoint(run)}") from None
    except OSError as e:  # a write that failed (a full disk): the checkpoint it would have replaced is kept
        raise OSError(f"{e}; stopped. Last good checkpoint: {last_checkpoint(run)}") from None
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last trained step's checkpoint is {last_checkpoint(run)}")
        raise
    finally:
        ctrl_c.restore()
        with contextlib.suppress(OSError) if sys.exc_info()[1] else contextlib.nullcontext():
            run.close()  # after a failed write, TensorBoard's writer raises it again: once is enough
    summary = dict(run_dir=run.run_dir, global_step=run.global_step, train_sps=sps, wall_time=time.time() - start_time)
    return summary | dict(final_eval_return=run.last_eval, final_eval_std=eval_returns.std(), best_eval_return=run.best_eval)


def print_progress(run: Run, sps: float, recent_return: float, final: bool) -> None:
    """On a terminal, one line rewritten in place after every update; in a file or a pipe, a line every 5% and at the end."""
    step, total, eval_return = run.global_step, run.args.total_timesteps, run.last_eval
    tty, batch = sys.stdout.isatty(), run.args.num_envs * run.args.num_steps
    if not (tty or final or step * 20 // total > (step - batch) * 20 // total):
        return
    seconds = int((total - step) / sps) if sps > 0 else 0
    eta = f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    recent = "-" if math.isnan(recent_return) else f"{recent_return:.1f}"
    evaluation = "-" if eval_return is None else f"{eval_return:.1f}"
    line = f"step {step}/{total} ({100 * step / total:.1f}%) | SPS {sps:.0f} | ETA {eta} | return {recent} | eval {evaluation}"
    print(f"\r{line}\033[K" if tty else line, end="\n" if final or not tty else "", flush=True)


# -------------------------------------------------------------------------------- Environments
def resolve_env_id(env_id: str) -> str:
    forms = "dm_control/<domain>/<task> or dm_control/<domain>-<task>-v0 (e.g. dm_control/walker/walk)"
    if env_id.startswith("Probe"):
        with contextlib.suppress(ImportError):  # probe_envs.py registers the probe ids; a copied script may lack it
            import probe_envs  # noqa: F401
    if env_id.startswith("dm_control/"):
        try:
            import shimmy  # registers the dm_control/* ids with gymnasium
            from dm_control import suite
        except Exception as e:  # its import loads the renderer that MUJOCO_GL names
            reason, gl = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}", os.environ.get("MUJOCO_GL")
            raise ConfigError(f"dm_control does not import with MUJOCO_GL={gl!r} ({reason})") from None
        gym.register_envs(shimmy)
        match = re.fullmatch(r"dm_control/(\w+)(?:/(\w+)|-(\w+)-v0)", env_id)
        if match is None:
            raise ConfigError(f"malformed dm_control id {env_id!r}; accepted forms: {forms}")
        domain, task = match[1], match[2] or match[3]
        if domain not in suite.TASKS_BY_DOMAIN:
            domains = ", ".join(sorted(suite.TASKS_BY_DOMAIN))
            raise ConfigError(f"unknown dm_control domain {domain!r} in {env_id!r}; valid domains: {domains}")
        if task not in suite.TASKS_BY_DOMAIN[domain]:
            tasks = ", ".join(sorted(suite.TASKS_BY_DOMAIN[domain]))
            raise ConfigError(f"unknown task {task!r} for dm_control domain {domain!r}; valid tasks: {tasks}")
        return f"dm_control/{domain}-{task}-v0"
    module, _, name = env_id.rpartition(":")  # gymnasium's "module:Env-v0": importing the module registers the env
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"env id {env_id!r}: its module {module!r} does not import ({e})") from None
    if name not in gym.registry:
        raise ConfigError(f"unknown env id {env_id!r}; accepted: a registered gymnasium id, {forms}, or a probe id")
    return name


# Headless MuJoCo rendering: each MUJOCO_GL backend and a shared library it loads, in order of preference.
GL_BACKENDS = (("egl", "libEGL.so.1"), ("osmesa", "libOSMesa.so.8"), ("osmesa", "libOSMesa.so.6"), ("osmesa", "libOSMesa.so"))
GL_PACKAGES = "Mesa's EGL (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0) or OSMesa (apt-get install libosmesa6)"


def choose_gl_backend(capture_video: bool) -> str | None:
    """Set MUJOCO_GL before mujoco loads: the user's, else 'disable' without video, else the first GL_BACKENDS that loads."""
    if capture_video:  # pygame draws classic control's frames with no display (SDL's own error line otherwise)
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if "MUJOCO_GL" in os.environ or (capture_video and sys.platform != "linux"):
        return os.environ.get("MUJOCO_GL", "default")  # "default": MuJoCo's own windowing (macOS, Windows)
    os.environ["MUJOCO_GL"] = "disable"
    for backend, library in GL_BACKENDS if capture_video else ():
        with contextlib.suppress(OSError):  # a library that does not load
            ctypes.CDLL(library)
            os.environ["MUJOCO_GL"] = backend
            return backend
    return None if capture_video else "disable"


def check_video(env_id: str, gl_backend: str | None) -> None:
    """--capture-video: one env renders one frame now, so a missing renderer fails here, in one line."""
    gym_id = resolve_env_id(env_id)
    if gl_backend is None and (gym_id.startswith("dm_control/") or "mujoco" in str(gym.spec(gym_id).entry_point)):
        raise ConfigError(f"--capture-video: no OpenGL library loads for rendering {env_id}; install {GL_PACKAGES}")
    try:
        with warnings.catch_warnings(action="ignore"):  # gymnasium warns of unsupported render modes: the check below says it
            with gym.make(gym_id, render_mode="rgb_array") as env:
                env.reset(seed=0)
                frame = env.render()
    except Exception as e:  # a renderer that cannot start: name it, without a traceback
        reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        raise ConfigError(f"--capture-video: {env_id} cannot render ({reason})") from None
    if not isinstance(frame, np.ndarray):
        raise ConfigError(f"--capture-video: {env_id} draws no rgb frames (render() returned {type(frame).__name__})")


def make_vector_env(args: Args, num_envs: int, seed: int, render_first: bool = False) -> gym.vector.VectorEnv:
    """The official envs: flat observations, NEXT_STEP autoreset, episode statistics, env 0 rendering with `render_first`."""

    def make_env(render: bool) -> gym.Env:
        limit = {} if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
        env = gym.make(resolve_env_id(args.env_id), **limit, **({"render_mode": "rgb_array"} if render else {}))
        if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict observations
        return env

    thunks = [lambda render=(render_first and i == 0): make_env(render) for i in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.action_space.seed(seed)
    return envs


# EnvPool ports that measurably differ from the official task (benchmarks/README.md, "EnvPool's ports"); "auto" avoids them.
ENVPOOL_DIFFERS = ("FingerSpin-v1", "FingerTurnEasy-v1", "FingerTurnHard-v1")


def envpool_task_id(gym_id: str) -> str | None:
    """EnvPool's id (dm_control/walker-walk-v0 -> WalkerWalk-v1, Hopper-v5 -> Hopper-v5), or None where it has no port."""
    try:
        with warnings.catch_warnings(action="ignore"):  # its glfw import warns without a display; nothing here renders
            import envpool
    except ImportError:
        return None
    if gym_id.startswith("dm_control/"):
        domain, task = gym_id[len("dm_control/") : -len("-v0")].split("-")
        task_id = "".join(part[:1].upper() + part[1:] for part in f"{domain}_{task}".split("_")) + "-v1"
    else:
        task_id = gym_id if "mujoco" in str(gym.spec(gym_id).entry_point) else None
    return task_id if task_id in envpool.list_all_envs() else None


def choose_policy(args: Args, space: gym.spaces.Box) -> tuple[str, float, float | None, str]:
    """--policy, --rpo-alpha, --init-log-std resolved, and a line saying which family trains and why; or a ConfigError."""
    infinite = [f"{name} {getattr(space, name)}" for name in ("low", "high") if not np.isfinite(getattr(space, name)).all()]
    policy, why = args.policy, f"--policy {args.policy}"
    if policy == "auto" and args.env_id.startswith("dm_control/"):
        policy, why = "gaussian", f"--policy auto: {args.env_id} is a control-suite task, whose rewards pay for full force"
    elif policy == "auto" and infinite:
        policy, why = "gaussian", f"--policy auto: {args.env_id}'s action box is unbounded ({infinite[0]}), so no clip"
    elif policy == "auto":
        elsewhere = "is not a control-suite task; rewards elsewhere mostly charge for torque"
        policy, why = "beta", f"--policy auto: {args.env_id} {elsewhere}"
    if policy == "beta" and infinite:
        raise ConfigError(f"--policy beta needs a bounded action box; {args.env_id} has {infinite[0]}: use --policy gaussian")
    if policy == "beta" and args.init_log_std is not None:
        raise ConfigError(f"--init-log-std sets the Gaussian's std; the Beta that {why.split(':')[0]} trains has none")
    rpo_alpha = RPO_ALPHA[policy] if args.rpo_alpha is None else args.rpo_alpha
    init_log_std = None if policy == "beta" else 0.0 if args.init_log_std is None else args.init_log_std
    return policy, rpo_alpha, init_log_std, f"policy: {policy} ({why}), RPO shift alpha {rpo_alpha}"


def choose_env_backend(args: Args) -> tuple[str, str]:
    """The training envs' backend for --env-backend and one line that says which; a ConfigError where it cannot serve."""
    gym_id = resolve_env_id(args.env_id)
    task_id = None if args.env_backend == "gymnasium" else envpool_task_id(gym_id)
    if task_id is not None and (args.env_backend == "envpool" or task_id not in ENVPOOL_DIFFERS):
        differs = " (it differs from the official task)" if task_id in ENVPOOL_DIFFERS else ""
        return "envpool", f"training envs: EnvPool's {task_id}{differs}; evaluation on gymnasium's {gym_id}"
    if task_id is not None:
        why = f"EnvPool's {task_id} differs from the official task; --env-backend envpool uses it anyway"
    elif args.env_backend == "gymnasium":
        why = "--env-backend gymnasium"
    else:
        installed = importlib.util.find_spec("envpool") is not None
        why = "EnvPool " + ("has no port of it" if installed else "is not installed (pip install envpool==1.2.0)")
    if args.env_backend == "envpool":
        raise ConfigError(f"--env-backend envpool: {why} for {args.env_id}; use --env-backend gymnasium or auto")
    return "gymnasium", f"training envs: gymnasium's {gym_id} ({why})"


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """EnvPool's envs with the official env's spaces (its Dict keys, in order); a reset step, reward 0, after each episode."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, task_id: str, official: gym.Env, num_envs: int, num_threads: int, max_episode_steps: int | None):
        self.task_id, self.num_envs, self.num_threads = task_id, num_envs, num_threads
        self.limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        space = official.observation_space
        self.keys = list(space.keys()) if isinstance(space, gym.spaces.Dict) else None
        self.single_observation_space = gym.spaces.flatten_space(space) if self.keys else space
        self.single_action_space = official.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.pool, self.prev_done = None, np.zeros(num_envs, dtype=bool)

    def flatten(self, obs) -> np.ndarray:
        return obs if self.keys is None else np.concatenate([obs[key].reshape(self.num_envs, -1) for key in self.keys], axis=1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.pool is None or seed is not None:  # EnvPool 1.2.0 takes its seed when it is made: a new seed, a new pool
            import envpool

            self.close_extras()
            kwargs = dict(num_envs=self.num_envs, seed=seed or 0, num_threads=self.num_threads, **self.limit)
            self.pool = envpool.make(self.task_id, env_type="gymnasium", **kwargs)
        obs, _ = self.pool.reset()
        self.prev_done[:] = False
        return self.flatten(obs), {}

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, _ = self.pool.step(np.asarray(actions, dtype=np.float64))
        reward = np.where(self.prev_done, 0.0, reward)
        self.prev_done = terminated | truncated
        return self.flatten(obs), reward, terminated, truncated, {}

    def close_extras(self, **kwargs) -> None:
        if self.pool is not None:
            self.pool.close()


def make_training_envs(args: Args, seed: int, threads: int = 1) -> gym.vector.VectorEnv:
    backend = choose_env_backend(args)[0] if args.env_backend == "auto" else args.env_backend
    if backend == "gymnasium":
        return make_vector_env(args, args.num_envs, seed)
    gym_id = resolve_env_id(args.env_id)
    task_id, threads = envpool_task_id(gym_id), min(threads, args.num_envs)
    with gym.make(gym_id) as official:
        envs = EnvPoolVectorEnv(task_id, official, args.num_envs, threads, args.max_episode_steps)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.action_space.seed(seed)
    return envs


# -------------------------------------------------------------------------------- Evaluation
@torch.inference_mode()
def evaluate(run: Run, video_name: str | None = None) -> np.ndarray:
    """The deterministic policy's returns (its mean action), then the sampled policy's from the same starts; logs `eval/*`."""
    family = run.agent.policy_head
    noise = torch.Generator(device=run.device).manual_seed(run.args.seed + run.global_step)  # training's RNG untouched
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one observation per env: one thread, and the same returns at any --torch-threads
    try:
        returns, lengths = run_episodes(run, lambda obs: family.mean_action(run.agent.policy(obs)), video_name)
        sampled = run_episodes(run, lambda obs: family.env_action(family.sample(run.agent.policy(obs), noise)))[0]
    finally:
        torch.set_num_threads(threads)
    stats = {f"return_{k}": getattr(returns, k)() for k in ("mean", "std", "min", "max")}
    stats |= {"length_mean": lengths.mean(), "sampled_return_mean": sampled.mean()}
    stats["episodes_below_100"] = (returns < 100).sum()
    for name, value in stats.items():
        run.writer.add_scalar(f"eval/{name}", float(value), run.global_step)
    return returns


def run_episodes(run: Run, policy, video_name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One episode per eval env, `policy(normalized obs)` giving the env's action; with `video_name`, env 0 is filmed."""
    envs = run.eval_envs
    obs, _ = envs.reset(seed=run.args.seed + 10_000)
    frames = [envs.unwrapped.envs[0].render()] if video_name else None
    returns, lengths = np.zeros(envs.num_envs), np.zeros(envs.num_envs, dtype=np.int64)
    finished = np.zeros(envs.num_envs, dtype=bool)
    while not finished.all():
        actions = policy(torch.as_tensor(run.obs_rms.normalize(obs), device=run.device)).cpu().numpy()
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        if frames is not None and not finished[0]:
            frames.append(envs.unwrapped.envs[0].render())
        returns += rewards * ~finished
        lengths += ~finished
        finished |= terminated | truncated
    if frames is not None:
        import imageio

        fps = 1 / envs.unwrapped.envs[0].unwrapped.dt if hasattr(envs.unwrapped.envs[0].unwrapped, "dt") else 30
        os.makedirs(os.path.join(run.run_dir, "videos"), exist_ok=True)
        imageio.mimsave(os.path.join(run.run_dir, "videos", f"{video_name}.mp4"), frames, fps=fps, macro_block_size=1)
    return returns, lengths


# -------------------------------------------------------------------------------- Checkpoints
def rng_state(device: torch.device) -> dict:
    """The generators: torch's (minibatch order, RPO's noise), numpy's (actions, cached Gaussian too) and the GPU's."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    numpy = {"key": torch.from_numpy(key.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss}
    state = {"torch": torch.get_rng_state(), "numpy": numpy}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device, saved_on: str, path: str) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if saved_on != device.type:
        note = f"note: {path} was written on {saved_on} and resumes on {device.type}: the same state, but the two devices"
        print(f"{note} round floating point differently, so the run will not repeat an uninterrupted one bit for bit")


def save_checkpoint(run: Run, kind: str) -> None:
    path = run.path(kind)
    ckpt = {"algo": SCRIPT, "args": dataclasses.asdict(run.args), "rng": rng_state(run.device), "device": run.device.type}
    ckpt |= {"eval_return": run.last_eval, "global_step": run.global_step, "iteration": run.iteration}
    ckpt |= {"agent": run.agent.state_dict(), "optimizer": run.optimizer.state_dict(), "obs_rms": run.obs_rms.state_dict()}
    ckpt["reward_rms"] = run.reward_scaler.rms.state_dict()
    buffer = io.BytesIO()  # written by Python, whose error names its cause (torch's own writer's does not)
    torch.save(ckpt, buffer)
    try:
        with open(f"{path}.tmp", "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(f"{path}.tmp", path)
    finally:  # a failed write leaves no .tmp
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")


def last_checkpoint(run: Run) -> str:
    """`_last.pt` and its step, read back from the file: a Ctrl-C or a failed write can land after a save's rename."""
    path = run.path("last")
    return f"{path} (step {torch.load(path, map_location='cpu', weights_only=True)['global_step']})"


def load_checkpoint(path: str, flag: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # garbage, truncated, or not written by torch.save
        raise ConfigError(f"{flag} {path!r} is not a readable checkpoint (truncated, or not a {SCRIPT}_*.pt file)") from None
    algo = ckpt.get("algo") if isinstance(ckpt, dict) else None
    if algo != SCRIPT:
        written_by = f"{algo}.py" if isinstance(algo, str) else "something else"
        raise ConfigError(f"{flag} {path!r} was written by {written_by}, not {SCRIPT}.py; load it with that script")
    if not isinstance(ckpt.get("args"), dict):
        raise ConfigError(f"{flag} {path!r} has no saved options ('args'): not a whole {SCRIPT}_*.pt file")
    changed = sorted(set(ckpt["args"]) ^ {field.name for field in dataclasses.fields(Args)})
    if changed:  # a version with other options: no silent default stands in for a setting the run had, or lacked
        options = ", ".join(f"--{name.replace('_', '-')}" for name in changed)
        raise ConfigError(f"{flag} {path!r} was written by a {SCRIPT}.py with other options ({options}; see CHANGELOG.md)")
    if "policy_head.weight" not in ckpt["agent"]:  # written before the policy families held their output layers
        raise ConfigError(f"{flag} {path!r} was written by an earlier {SCRIPT}.py, whose weights are named otherwise")
    if not finite(ckpt):
        raise ConfigError(f"{flag} {path!r} holds NaN or inf values (a diverged run's); use an earlier checkpoint")
    return ckpt


def finite(tree) -> bool:
    if isinstance(tree, dict | list | tuple):
        return all(finite(value) for value in (tree.values() if isinstance(tree, dict) else tree))
    return not (isinstance(tree, torch.Tensor) and tree.is_floating_point()) or bool(tree.isfinite().all())


# Resume and eval-only take the checkpoint's arguments, except these: how this run is run and logged.
RUN_FIELDS = "exp_name cuda track wandb_project_name wandb_entity capture_video output_dir total_timesteps".split()
RUN_FIELDS += ["eval_interval", "eval_episodes", "max_episode_steps", "torch_threads", "checkpoint", "eval_only", "resume"]


def args_with_checkpoint(args: Args, ckpt: dict) -> Args:
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items() if k not in RUN_FIELDS}
    return dataclasses.replace(args, **saved)


# -------------------------------------------------------------------------------- Argument checks
def check_args(args: Args, gl_backend: str | None) -> tuple[str, float, float | None, str]:
    """Reject impossible settings with one line, before any heavy work; `choose_policy`'s answer for the env's actions."""

    def require(ok: bool, flag: str, accepted: str) -> None:
        if not ok:
            raise ConfigError(f"--{flag.replace('_', '-')} must be {accepted}, got {getattr(args, flag)}")

    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        require(getattr(args, name) > 0, name, "> 0")
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
        require(getattr(args, name) >= 1, name, ">= 1")
    require(1 <= args.eval_episodes <= 1000, "eval_episodes", "in [1, 1000] (one env each)")
    require(0 <= args.seed < 2**32, "seed", "in [0, 2**32) (numpy's seeds)")
    for name in ("ent_coef", "vf_coef"):
        require(getattr(args, name) >= 0, name, ">= 0")
    require(args.rpo_alpha is None or args.rpo_alpha >= 0, "rpo_alpha", ">= 0 (0: no shift; unset: the family's)")
    for name in ("torch_threads", "eval_interval"):
        require(getattr(args, name) >= 0, name, ">= 0 (0: the default)")
    for name in ("gamma", "gae_lambda"):
        require(0.0 <= getattr(args, name) <= 1.0, name, "in [0, 1]")
    require(args.target_kl is None or args.target_kl > 0, "target_kl", "> 0 (or left unset)")
    require(args.max_episode_steps is None or args.max_episode_steps >= 1, "max_episode_steps", ">= 1")
    sizes = args.policy_hidden_sizes + args.value_hidden_sizes
    require(min(sizes, default=1) >= 1, "policy_hidden_sizes", "positive integers, as --value-hidden-sizes")
    batch = args.num_envs * args.num_steps
    require(batch % args.num_minibatches == 0, "num_minibatches", f"a divisor of the rollout of {batch}")
    require(args.eval_only or args.total_timesteps >= batch, "total_timesteps", f">= num_envs * num_steps ({batch})")
    with gym.make(resolve_env_id(args.env_id)) as env:  # one env is built and closed: its action space
        space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        use = ": use ppo_discrete.py" if isinstance(space, gym.spaces.Discrete) else ""
        raise ConfigError(f"{args.env_id} has a {type(space).__name__} action space; {SCRIPT}.py needs Box actions{use}")
    policy = choose_policy(args, space)
    if args.capture_video:
        check_video(args.env_id, gl_backend)
    try:  # a real write of 1 MiB: root passes os.access where writes fail (/sys), and a full disk fails here, in one line
        os.makedirs(args.output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.output_dir) as probe:
            probe.write(bytes(2**20))
    except OSError as e:
        raise ConfigError(f"--output-dir {args.output_dir!r} cannot be created or written ({e.strerror or e})") from None
    return policy


if __name__ == "__main__":
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # MKL's products sum in one order on any thread count
    # A failed write (a full disk) is reported in one line by the loop: TensorBoard's writer thread need not print it too.
    threading.excepthook = lambda hook: None if issubclass(hook.exc_type, OSError) else threading.__excepthook__(hook)
    try:
        s = train(tyro.cli(Args))  # the summary
    except (ConfigError, TrainingDiverged, OSError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    returns = f"final eval return {s['final_eval_return']:.2f} ± {s['final_eval_std']:.2f} | best {s['best_eval_return']:.2f}"
    print(f"{returns} | {s['global_step']} steps | train SPS {s['train_sps']:.0f} | run dir {s['run_dir']}")

"""V-MPO for continuous control with a Gaussian policy that the env clips (or a Beta on the action box), in one file.

V-MPO (Song et al., 2019, arXiv:1909.12238) is an on-policy EM-style algorithm. Per rollout, the E-step weights the top
fraction rho of the normalized advantages by psi ~ exp(A / eta), the temperature eta taking one step on its dual (KL
bound epsilon_eta); the M-step fits the policy to the weighted samples under decoupled KL trust regions on its mean and
spread (bounds epsilon_mu, epsilon_sigma), and the value to its targets, in m_steps minibatch steps. The policy is PPO's
Gaussian, fitted to the action the env played (`--policy auto` on the control suite), or a Beta on the action box (Chou
et al., 2017; `auto` elsewhere). The file's departures from the paper are the third group of `Args`, with the paper's values.

    python vmpo_continuous.py --env-id dm_control/walker/walk --cuda
    python vmpo_continuous.py --resume runs/<run>/vmpo_continuous_last.pt --total-timesteps 2000000
    python vmpo_continuous.py --eval-only --checkpoint runs/<run>/vmpo_continuous_best.pt --capture-video

Math: docs/vmpo_continuous.md (the file with its formulas inline) and docs/vmpo_continuous_annotations.md (by formula).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import importlib.util
import io
import itertools
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
from functools import partial
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
    """V-MPO for continuous actions (a Gaussian policy that the env clips, or a Beta on the box), in one file."""

    # The run, as CleanRL's scripts have it.
    exp_name: str = "vmpo_continuous"
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when available (falls back to CPU, and says so once)"""
    track: bool = False
    """track the run with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """record mp4 videos of evaluation episodes to `<run_dir>/videos/`"""
    env_id: str = "dm_control/walker/walk"
    """gymnasium id, `dm_control/<domain>/<task>`, `dm_control/<domain>-<task>-v0`, or a probe id"""
    total_timesteps: int = 1_000_000
    """total environment steps of training"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """training envs (auto: EnvPool where its port is the official task); evaluation is always on the official env"""
    torch_threads: int = 0
    """CPU threads of the update (0: torch's default, the machine's cores or OMP_NUM_THREADS); rollout inference uses 1"""
    max_episode_steps: int | None = None
    """override the env's time limit (e.g. short episodes for quick tests); None keeps the env's own"""
    output_dir: str = "runs"
    """root directory of runs; the run directory is <output_dir>/<run_name>"""
    eval_interval: int = 100_000
    """environment steps between evaluations (0 = only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel, deterministic policy)"""
    checkpoint: str | None = None
    """with --eval-only: the checkpoint to evaluate (and record with --capture-video) without training"""
    eval_only: bool = False
    """evaluate --checkpoint and exit"""
    resume: str | None = None
    """continue this checkpoint to --total-timesteps in a new run dir, with its saved env and hyperparameters"""

    # V-MPO's knobs (Song et al., 2019): the rollout, the E-step, the M-step and its trust regions.
    num_envs: int = 8
    """number of parallel training environments"""
    num_steps: int = 256
    """steps per environment per rollout (rollout size = num_envs * num_steps)"""
    gamma: float = 0.99
    """discount factor"""
    topk_fraction: float = 0.5
    """rho: fraction of the (non-restarting) samples with the highest advantages kept by the E-step (the paper's 0.5)"""
    temperature_init: float = 1.0
    """initial temperature eta"""
    temperature_lr: float = 1e-2
    """learning rate of the temperature (one step per iteration)"""
    epsilon_eta: float = 0.15
    """KL bound of the E-step weights (temperature dual)"""
    policy_lr: float = 1e-3
    """learning rate of the policy parameters"""
    value_lr: float = 5e-4
    """learning rate of the value parameters"""
    epsilon_mu: float = 0.05
    """KL bound on the change of the policy's mean per iteration (the Gaussian's or the Beta's)"""
    epsilon_sigma: float = 0.001
    """KL bound on the change of the policy's spread per iteration (the Gaussian's covariance, the Beta's concentration)"""
    alpha_init: float = 1.0
    """initial alpha_mu and alpha_sigma (KL Lagrange multipliers)"""
    alpha_lr: float = 1e-2
    """learning rate of alpha_mu and alpha_sigma (one step per M-step)"""
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the policy encoder"""
    value_hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the value encoder"""
    init_log_std: float | None = None
    """initial log-std of the Gaussian (None: 1, std e): the parameter, or the log-std head's bias; the Beta has none"""

    # This file's departures from the paper: each default, and the value that gives the paper's.
    m_steps: int = 80
    """M-step gradient steps per rollout (paper: one per fresh batch, its pi_old a target net 100 steps old; nearest: 1)"""
    num_minibatches: int = 8
    """minibatches of the rollout, one per M-step, reshuffled each pass, psi scaled by their number (1: the paper's)"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip of the M-step, PPO's (the seed's 10; the paper's update has none: a large value)"""
    norm_adv: bool = True
    """normalize advantages over the batch's trained samples (not reset steps), as the seed does (off: the paper's)"""
    policy: Literal["auto", "gaussian", "beta"] = "auto"
    """gaussian (paper's, clipped) or beta; auto: gaussian on dm_control/... tasks or an unbounded box, else beta"""
    m_step: Literal["seed", "clip"] = "clip"
    """M-step loss: clip (the top k pulled to ratio 1 + eps, the bottom k pushed to 1 - eps) or seed (the paper's); both
    bound the KLs over the top-k states (paper: all), alpha stepped first, the policy with its new value (paper: jointly)"""
    m_step_clip: float = 0.2
    """epsilon of the likelihood-ratio bounds of --m-step clip"""
    rpo_alpha: float | None = None
    """RPO's U(-alpha, alpha) shift of the M-step likelihood's mean (Beta: logits), scaled as the policy's learning rate
    anneals; None: gaussian 0.5, beta 0.2 (0: the paper's)"""
    gae_lambda: float = 0.95
    """lambda of the GAE targets (1: the paper's n-step returns over the rollout; 0: one-step TD)"""
    anneal_lr: bool = True
    """anneal the policy and value learning rates (how: --lr-horizon; off: constant, the paper's)"""
    lr_horizon: int = 500_000
    """H > 0: as H / (H + step), alike at any budget (a longer run never steps larger); 0: linearly to 0 over the total"""
    ppo_like_backbone: bool = True
    """orthogonal Linear+Tanh, a state-independent log-std; off: the paper's LayerNorm/ELU, a state-dependent log-std head"""
    norm_obs: bool = True
    """normalize observations with running statistics shared by all training envs (off: the paper's raw observations)"""
    reward_scaling: bool = True
    """divide rewards by the running std of each env's discounted return (PPO's reward scaling; off: the paper's)"""
    train_episode_steps: int | None = 125
    """the time limit of the first half of the training envs where the env's own is longer: more starts per step, so
    more practice at getting up from the start's fall (a truncation, bootstrapped), while the other half keeps the env's
    own and sees what comes later; evaluation keeps the env's own (None: the env's own everywhere, the paper's)"""


SCRIPT = "vmpo_continuous"  # written into every checkpoint, so another script's files are recognised
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # std 0.007-7.4, walker reached 4.6 (constant shift): the clamp passes gradients


class ConfigError(ValueError):
    """Bad user input, reported as one line before any heavy work."""


class TrainingDiverged(RuntimeError):
    """A loss or a parameter became NaN/inf."""


# -------------------------------------------------------------------------------- Network
def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def linear(in_dim: int, out_dim: int, ppo_like: bool, std: float = math.sqrt(2)) -> nn.Linear:
    """PPO's orthogonal init, or (the paper's network) torch's default."""
    return layer_init(nn.Linear(in_dim, out_dim), std) if ppo_like else nn.Linear(in_dim, out_dim)


def make_encoder(in_dim: int, hidden_sizes: tuple[int, ...], ppo_like: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, size in enumerate(hidden_sizes):
        layers.append(linear(in_dim, size, ppo_like))
        layers += [nn.Tanh()] if ppo_like else [nn.LayerNorm(size), nn.Tanh()] if i == 0 else [nn.ELU()]
        in_dim = size
    return nn.Sequential(*layers)


class Agent(nn.Module):
    def __init__(
        self, obs_dim: int, action_space, policy: str, policy_hidden_sizes, value_hidden_sizes, init_log_std=0.0, ppo_like=True
    ):
        super().__init__()
        self.policy_encoder = make_encoder(obs_dim, policy_hidden_sizes, ppo_like)
        features = policy_hidden_sizes[-1] if policy_hidden_sizes else obs_dim
        self.policy_head = POLICIES[policy](features, action_space, init_log_std, ppo_like)  # the family
        self.value_encoder = make_encoder(obs_dim, value_hidden_sizes, ppo_like)
        self.value_head = linear(value_hidden_sizes[-1] if value_hidden_sizes else obs_dim, 1, ppo_like, std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The family's parameters `params` (..., 2, act_dim): the Gaussian's mean and log-std, or the Beta's two logits."""
        return self.policy_head(self.policy_encoder(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.value_encoder(obs)).squeeze(-1)


class BoxPolicy(nn.Module):
    """What every family shares: the env's action box as buffers, an infinite bound at +-UNBOUNDED (no sample reaches it)."""

    def __init__(self, action_space: gym.spaces.Box):
        super().__init__()
        for name in ("low", "high"):
            bound = np.nan_to_num(getattr(action_space, name), posinf=UNBOUNDED, neginf=-UNBOUNDED)
            self.register_buffer(name, torch.as_tensor(bound, dtype=torch.float32), persistent=False)

    def at_bounds(self, action: torch.Tensor) -> torch.Tensor:
        """Which components of the env's action lie within 1% of the box's width from a bound (a clipped one: on it)."""
        return torch.minimum(action - self.low, self.high - action) < 0.01 * (self.high - self.low)


class GaussianPolicy(BoxPolicy):
    """--policy gaussian, RPO's: u ~ N(mu_theta(s), sigma_theta(s)), the env plays a = clip(u). `params`: mean, log-std."""

    def __init__(self, features: int, action_space: gym.spaces.Box, init_log_std: float, ppo_like: bool):
        super().__init__(action_space)
        act_dim = action_space.shape[0]
        self.mean, self.ppo_like = linear(features, act_dim, ppo_like, std=0.01), ppo_like
        if ppo_like:  # a state-independent log-std
            self.log_std = nn.Parameter(torch.full((act_dim,), init_log_std))
        else:  # a state-dependent log-std head that starts at init_log_std
            self.log_std = nn.Linear(features, act_dim)
            nn.init.constant_(self.log_std.bias, init_log_std)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mean = self.mean(h)
        log_std = self.log_std.expand_as(mean) if self.ppo_like else self.log_std(h)
        outside = ((log_std < LOG_STD_MIN) | (log_std > LOG_STD_MAX)).float()  # where the clamp passes no gradient
        return torch.stack([mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX) + outside * (log_std - log_std.detach())], dim=-2)

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = params.unbind(-2)
        # LaTeX: u_t \sim \mathcal{N}(\mu_\theta(s_t), \sigma_\theta(s_t))
        return mean + log_std.exp() * torch.randn(mean.shape, generator=generator, device=mean.device)

    def log_prob(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) of the played a = clip(u): every u past a bound gets its mass, so none drags the mean after it."""
        (mean, log_std), low, high = params.unbind(-2), self.low, self.high
        std = log_std.exp()
        # LaTeX: \log\mathcal{N}(u_j|\mu_j,\sigma_j) = -\frac{(u_j-\mu_j)^2}{2\sigma_j^2} - \log\sigma_j - \frac{\log 2\pi}{2}
        inside = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        # LaTeX: \log \pi(a_j) = \begin{cases} \log\Phi\big(\tfrac{l_j - \mu_j}{\sigma_j}\big) & u_j \le l_j \\ \log\mathcal{N}(u_j|\mu_j,\sigma_j) & l_j < u_j < h_j \\ \log\Phi\big(\tfrac{\mu_j - h_j}{\sigma_j}\big) & u_j \ge h_j \end{cases}, \quad \log \pi(a) = \sum_j \log \pi(a_j)
        between = (u > low) & (u < high)
        # Phi's argument is 0 where a lies between the bounds: far in the tail log_ndtr's float32 gradient is inf (NaN here).
        z = torch.where(between, 0.0, torch.where(u <= low, (low - mean) / std, (mean - high) / std))
        return torch.where(between, inside, torch.special.log_ndtr(z)).sum(-1)  # one erfc, not two

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathcal{H} = \sum_j \tfrac{1}{2}\left(1 + \log(2\pi\sigma_j^2)\right)
        return (0.5 * (1.0 + math.log(2 * math.pi)) + params[..., 1, :]).sum(-1)

    def decoupled_kl(self, params: torch.Tensor, old_params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V-MPO's trust regions per sample: KL(N(mu_old, s_old) || N(mu, s_old)), the mean's; KL(... || N(mu_old, s))."""
        (mean, log_std), (old_mean, old_log_std) = params.unbind(-2), old_params.unbind(-2)
        old_var = (2.0 * old_log_std).exp()
        # LaTeX: D_\mu(s_t) = \sum_j \frac{(\mu_j - \mu^{old}_j)^2}{2(\sigma^{old}_j)^2}
        kl_mu = ((mean - old_mean) ** 2 / (2.0 * old_var)).sum(-1)
        # LaTeX: D_\sigma(s_t) = \frac{1}{2} \sum_j \big((\sigma^{old}_j / \sigma_j)^2 - 1 + 2\log(\sigma_j / \sigma^{old}_j)\big)
        kl_sigma = 0.5 * (old_var / (2.0 * log_std).exp() - 1.0 + 2.0 * (log_std - old_log_std)).sum(-1)
        return kl_mu, kl_sigma

    def mean_action(self, params: torch.Tensor) -> torch.Tensor:
        """E[clip(u)] in closed form (not clip(mean), which can sit on a bound the sampled policy seldom plays)."""
        mean, std, low, high = params[..., 0, :], params[..., 1, :].exp(), self.low, self.high
        normal = torch.distributions.Normal(0.0, 1.0)
        alpha, beta = (low - mean) / std, (high - mean) / std
        cdf_alpha, cdf_beta = normal.cdf(alpha), normal.cdf(beta)
        pdf_alpha, pdf_beta = normal.log_prob(alpha).exp(), normal.log_prob(beta).exp()
        # LaTeX: \mathbb{E}[\operatorname{clip}(u, l, h)] = l\,\Phi(\alpha) + h\,(1 - \Phi(\beta)) + \mu\,(\Phi(\beta) - \Phi(\alpha)) + \sigma\,(\varphi(\alpha) - \varphi(\beta)), \quad \alpha = \tfrac{l - \mu}{\sigma}, \ \beta = \tfrac{h - \mu}{\sigma}
        return low * cdf_alpha + high * (1.0 - cdf_beta) + mean * (cdf_beta - cdf_alpha) + std * (pdf_alpha - pdf_beta)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: a = \operatorname{clip}(u, a_{low}, a_{high})
        return torch.clamp(u, self.low, self.high)

    def shift(self, params: torch.Tensor, alpha: float) -> torch.Tensor:
        mean, log_std = params.unbind(-2)
        return torch.stack([rpo_perturbation(mean, alpha), log_std], dim=-2)  # the mean's, not the log-std's


class BetaPolicy(BoxPolicy):
    """--policy beta: u ~ Beta(alpha, beta), alpha, beta > 1 (never U-shaped), a = low + (high - low) u. `params`: logits."""

    def __init__(self, features: int, action_space: gym.spaces.Box, init_log_std: None, ppo_like: bool):
        super().__init__(action_space)
        self.logits = linear(features, 2 * action_space.shape[0], ppo_like, std=0.01)  # near 0: Beta(1.69, 1.69)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.logits(h).unflatten(-1, (2, -1))

    @staticmethod
    def distribution(params: torch.Tensor) -> torch.distributions.Beta:
        alpha_logit, beta_logit = params.unbind(-2)
        # LaTeX: \alpha_j = 1 + \operatorname{softplus}(\ell^\alpha_j(s)), \quad \beta_j = 1 + \operatorname{softplus}(\ell^\beta_j(s))
        concentrations = 1.0 + nn.functional.softplus(alpha_logit), 1.0 + nn.functional.softplus(beta_logit)
        return torch.distributions.Beta(*concentrations, validate_args=False)  # NaN ones reach the divergence check

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # Beta sampling takes no generator: a given one seeds a forked copy of the global ones, which stay untouched.
        with torch.random.fork_rng(devices=[params.device] if params.is_cuda else [], enabled=generator is not None):
            if generator is not None:
                torch.manual_seed(int(torch.randint(2**31, (), generator=generator, device=generator.device)))
            # LaTeX: u_t \sim \mathrm{Beta}(\alpha_\theta(s_t), \beta_\theta(s_t)), \ u_t \in [10^{-6}, 1 - 10^{-6}]
            u = self.distribution(params).sample()
        return u.clamp(BETA_EPS, 1.0 - BETA_EPS)  # a float32 sample can round to 0 or 1, where the density is 0

    def log_prob(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: \log \pi(u \mid s) = \sum_j (\alpha_j - 1) \log u_j + (\beta_j - 1) \log(1 - u_j) - \log B(\alpha_j, \beta_j)
        # LaTeX: \log B(\alpha, \beta) = \log\Gamma(\alpha) + \log\Gamma(\beta) - \log\Gamma(\alpha + \beta)
        return self.distribution(params).log_prob(u).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathcal{H} = \sum_j \log B(\alpha_j, \beta_j) - (\alpha_j - 1)\psi(\alpha_j) - (\beta_j - 1)\psi(\beta_j) + (\alpha_j + \beta_j - 2)\psi(\alpha_j + \beta_j)
        return self.distribution(params).entropy().sum(-1)

    def decoupled_kl(self, params: torch.Tensor, old_params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V-MPO's trust regions: m = alpha / (alpha + beta) moves at the old k = alpha + beta (D_mu), k at the old m."""
        new, old = self.distribution(params), self.distribution(old_params)
        (mean, conc), (old_mean, old_conc) = ((d.mean, d.concentration1 + d.concentration0) for d in (new, old))
        kl = torch.distributions.kl_divergence
        # LaTeX: \mathrm{KL}(p \| q) = \log \tfrac{B(\alpha_q, \beta_q)}{B(\alpha_p, \beta_p)} + (\alpha_p - \alpha_q)\psi(\alpha_p) + (\beta_p - \beta_q)\psi(\beta_p) + (\alpha_q - \alpha_p + \beta_q - \beta_p)\psi(\alpha_p + \beta_p)
        # LaTeX: D_\mu(s_t) = \sum_j \mathrm{KL}\big(\mathrm{B}(m^{old}_j, k^{old}_j) \,\|\, \mathrm{B}(m_j, k^{old}_j)\big), \quad \mathrm{B}(m, k) = \mathrm{Beta}(m k, (1 - m) k)
        kl_mu = kl(old, torch.distributions.Beta(mean * old_conc, (1.0 - mean) * old_conc, validate_args=False)).sum(-1)
        # LaTeX: D_\sigma(s_t) = \sum_j \mathrm{KL}\big(\mathrm{B}(m^{old}_j, k^{old}_j) \,\|\, \mathrm{B}(m^{old}_j, k_j)\big)
        kl_sigma = kl(old, torch.distributions.Beta(old_mean * conc, (1.0 - old_mean) * conc, validate_args=False)).sum(-1)
        return kl_mu, kl_sigma

    def mean_action(self, params: torch.Tensor) -> torch.Tensor:
        # LaTeX: \mathbb{E}[a] = a_{low} + (a_{high} - a_{low}) \frac{\alpha}{\alpha + \beta}
        return self.env_action(self.distribution(params).mean)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: a = a_{low} + (a_{high} - a_{low})\, u
        return self.low + (self.high - self.low) * u

    def shift(self, params: torch.Tensor, alpha: float) -> torch.Tensor:
        # LaTeX: \tilde{\ell}_\theta(s_t) = \ell_\theta(s_t) + z_t, \quad z_t \sim \mathcal{U}(-\alpha_{rpo}, \alpha_{rpo})^{2d}
        return rpo_perturbation(params, alpha)


POLICIES = {"gaussian": GaussianPolicy, "beta": BetaPolicy}
RPO_ALPHA = {"gaussian": 0.5, "beta": 0.2}  # --rpo-alpha's default per family: the values the runs chose
BETA_EPS = 1e-6
UNBOUNDED = 1e6  # where an infinite bound of the action box stands


# -------------------------------------------------------------------------------- Normalization
class RunningMeanStd:
    """Running mean and variance (float64) of batches (Chan et al.'s parallel update), shared by all training envs."""

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
    """(num_steps, num_envs, ...) tensors; NEXT_STEP autoreset: row t+1 is s_{t+1}, the final observation too."""

    obs: torch.Tensor
    u: torch.Tensor  # the policy's samples (the env played a = env_action(u)): the M-step fits the played action's probability
    params: torch.Tensor  # the acting policy's parameters, (..., 2, act_dim)
    rewards: torch.Tensor  # scaled with --reward-scaling
    values: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    resets: torch.Tensor  # 1 on a reset step (after an episode end): its action is ignored, its weight 0

    @classmethod
    def empty(cls, num_steps: int, envs: gym.vector.VectorEnv, device: torch.device) -> Rollout:
        zeros = lambda *shape: torch.zeros((num_steps, envs.num_envs, *shape), device=device)  # noqa: E731
        act_dim = envs.single_action_space.shape[0]
        per_step = {name: zeros() for name in ("rewards", "values", "terminated", "truncated", "resets")}
        return cls(obs=zeros(*envs.single_observation_space.shape), u=zeros(act_dim), params=zeros(2, act_dim), **per_step)

    def batch(self, advantages: torch.Tensor, returns: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
        fields = {**vars(self), "advantages": advantages, "returns": returns}
        return {k: v.reshape(-1, *v.shape[2:]).to(device) for k, v in fields.items()}


@torch.inference_mode()
def collect_rollout(agent: Agent, envs, obs_rms, scale_reward, next_obs: torch.Tensor, buf: Rollout) -> tuple:
    """Fill `buf`; return the next observation and the finished episodes (env steps into the rollout, env, return, length)."""
    num_steps, num_envs = buf.rewards.shape
    prev_done = (torch.maximum(buf.terminated[-1], buf.truncated[-1]) > 0).cpu().numpy()  # zeros before the first
    episodes = []
    for step in range(num_steps):
        buf.obs[step] = next_obs
        buf.resets[step] = torch.as_tensor(prev_done, dtype=torch.float32)  # 1 after an episode end: a reset step
        params = agent.policy(next_obs)
        u = agent.policy_head.sample(params)
        buf.u[step], buf.params[step] = u, params
        raw_obs, reward, terminated, truncated, infos = envs.step(agent.policy_head.env_action(u).cpu().numpy())
        obs_rms.update(raw_obs)
        next_obs = torch.as_tensor(obs_rms.normalize(raw_obs), device=next_obs.device)
        prev_done = terminated | truncated
        reward = scale_reward(reward, prev_done)
        for field, data in ((buf.rewards, reward), (buf.terminated, terminated), (buf.truncated, truncated)):
            field[step] = torch.as_tensor(data, dtype=torch.float32)
        for i in np.flatnonzero(infos.get("_episode", [])):
            episodes.append(((step + 1) * num_envs, i, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
    buf.values[:] = agent.value(buf.obs)  # V(s_t) of the whole rollout in one pass, not a call per step
    return next_obs, episodes


# -------------------------------------------------------------------------------- Advantages
def compute_gae(rewards, values, next_values, terminated, truncated, gamma: float, gae_lambda: float) -> tuple:
    """Advantages and value targets, (num_steps, num_envs); next_values[t] is V of s_t's real successor (NEXT_STEP's row)."""
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
        delta = rewards[t] + gamma * (1.0 - terminated[t]) * next_values[t] - values[t]
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last = delta + gamma * gae_lambda * (1.0 - torch.maximum(terminated[t], truncated[t])) * last
        advantages[t] = last
    # LaTeX: R_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def normalize_advantages(advantages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(advantages, valid)
    std = masked_mean((advantages - mean) ** 2, valid).sqrt()
    # LaTeX: \hat{A}_t \leftarrow (\hat{A}_t - \mu_A) / (\sigma_A + 10^{-8}), \quad \mu_A, \sigma_A \text{ over } w^{restart}=1
    return (advantages - mean) / (std + 1e-8)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var(unbiased=False)
    # LaTeX: \mathrm{EV} = 1 - \frac{\operatorname{Var}[\hat{R}_t - V(s_t)]}{\operatorname{Var}[\hat{R}_t]}
    return float("nan") if var_returns == 0 else float(1.0 - (returns - values).var(unbiased=False) / var_returns)


# -------------------------------------------------------------------------------- Losses and update
class DualVariables(nn.Module):
    """The temperature eta and the KL multipliers alpha_mu, alpha_sigma: each softplus(raw_*) + 1e-8, so it stays > 0."""

    def __init__(self, temperature_init: float, alpha_init: float):
        super().__init__()
        inverse_softplus = lambda x: nn.Parameter(torch.tensor(math.log(math.expm1(x))))  # noqa: E731
        self.raw_temperature = inverse_softplus(max(temperature_init, 1e-8))
        self.raw_alpha_mu, self.raw_alpha_sigma = inverse_softplus(alpha_init), inverse_softplus(alpha_init)

    def temperature(self) -> torch.Tensor:
        # LaTeX: \eta = \operatorname{softplus}(\tilde{\eta}) + 10^{-8}
        return nn.functional.softplus(self.raw_temperature) + 1e-8

    def alphas(self) -> tuple[torch.Tensor, torch.Tensor]:
        return nn.functional.softplus(self.raw_alpha_mu) + 1e-8, nn.functional.softplus(self.raw_alpha_sigma) + 1e-8


def e_step(advantages, restarting_weights, temperature: torch.Tensor, topk_fraction: float, epsilon_eta: float) -> dict:
    """Sample weights psi (detached), the selected samples and the temperature's dual loss, of 1-D inputs."""
    # LaTeX: s_t = \frac{w^{restart}_t \hat{A}_t}{\eta}
    scaled = restarting_weights * advantages / temperature
    with torch.no_grad():
        valid = restarting_weights > 0
        candidates = torch.where(valid, scaled, torch.full_like(scaled, -torch.inf))
        n_valid = int(valid.sum())
        # LaTeX: k = \max\left(1, \lfloor \rho N_{valid} \rfloor\right)
        k = max(1, int(topk_fraction * n_valid))
        # LaTeX: \tau = \min \operatorname{TopK}(\{s_t : w^{restart}_t = 1\}, k)
        threshold = torch.topk(candidates, k).values.min()
        # LaTeX: \bar{w}_t = w^{restart}_t \, \mathbf{1}[s_t \ge \tau]
        selected_weights = restarting_weights * (candidates >= threshold).to(scaled.dtype)
        if n_valid == 0:  # only reset steps (a degenerate tiny rollout): fall back to everything
            selected_weights = torch.ones_like(scaled)
        # Subtracting the max over the selected samples keeps exp() from under/overflowing.
        s_max = scaled.detach()[selected_weights > 0].max()
    # LaTeX: \tilde{\psi}_t = \bar{w}_t \exp(s_t - s_{\max})
    unnormalized = selected_weights * torch.exp(scaled - s_max)
    z, n_selected = unnormalized.sum(), selected_weights.sum()
    # LaTeX: \psi_t = \frac{\tilde{\psi}_t}{Z}, \quad Z = \sum_t \tilde{\psi}_t
    weights = (unnormalized / z).detach()
    # What the dual bounds by epsilon_eta: the weights' KL from uniform weights on the selected samples.
    # LaTeX: \mathrm{KL}(\psi \,\|\, \mathcal{U}_{\mathcal{S}}) = \sum_{t \in \mathcal{S}} \psi_t \log(N_{sel} \psi_t)
    kl = torch.xlogy(weights, weights * n_selected).sum()
    # LaTeX: \log \bar{\psi} = \log \frac{1}{N_{sel}} \sum_{t \in \mathcal{S}} e^{s_t} = \log Z + s_{\max} - \log N_{sel}
    log_mean_weights = torch.log(z) + s_max - torch.log(n_selected)
    # LaTeX: \mathcal{L}_\eta = \eta \left(\epsilon_\eta + \log \bar{\psi}\right)
    dual_loss = temperature * (epsilon_eta + log_mean_weights)
    return {"weights": weights, "selected_weights": selected_weights, "threshold": threshold, "dual_loss": dual_loss, "kl": kl}


def rpo_perturbation(mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """RPO's shift (Rahman & Xue, 2022): fresh noise per sample and dimension each time the M-step takes its likelihood."""
    if alpha == 0:
        return mean
    # LaTeX: \tilde{\mu}_\theta(s_t) = \mu_\theta(s_t) + z_t, \quad z_{t,j} \sim \mathcal{U}(-\alpha_{rpo}, \alpha_{rpo})
    return mean + torch.empty_like(mean).uniform_(-alpha, alpha)


def nll_loss(weights: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """--m-step seed, the paper's M-step: weighted maximum likelihood of the top-k samples."""
    # LaTeX: \mathcal{L}^{NLL}_\pi = -\sum_t \psi_t \log \pi_\theta(a_t \mid s_t)
    return -(weights * log_prob).sum()


def clipped_likelihood_loss(weights, push_weights, log_ratio: torch.Tensor, clip: float) -> torch.Tensor:
    """--m-step clip: the pull to the top k stops at ratio 1 + clip, the push off the bottom k at 1 - clip, lest it diverge."""
    # LaTeX: \mathcal{L}^{pull}_\pi = -\sum_t \psi_t \min\left(\log \rho_t, \log(1 + \epsilon_{clip})\right)
    pull = -(weights * torch.clamp(log_ratio, max=math.log1p(clip))).sum()
    # LaTeX: \mathcal{L}^{push}_\pi = \sum_t \psi^-_t \max\left(\log \rho_t, \log(1 - \epsilon_{clip})\right)
    push = (push_weights * torch.clamp(log_ratio, min=math.log1p(-clip))).sum()
    return pull + push


def m_step_losses(family, params, values, mb: dict, m_step: str, clip: float, rpo_alpha: float) -> dict:
    """The M-step's losses on one minibatch: the likelihood of --m-step, the decoupled KLs, the value loss; the clip's cut."""
    # RPO's shift moves only the likelihood's policy: the KL bounds, the old log-probability and acting see its own.
    # LaTeX: \log \pi_\theta(a_t|s_t) = \log \pi(\operatorname{clip}(u_t) \mid \tilde{\mu}_\theta(s_t), \sigma_\theta(s_t)) \ \text{(Gaussian)}, \quad \log \mathrm{Beta}(x_t \mid \tilde{\alpha}_\theta(s_t), \tilde{\beta}_\theta(s_t)) \ \text{(Beta)}
    log_prob = family.log_prob(family.shift(params, rpo_alpha), mb["u"])
    # LaTeX: \log \rho_t = \log \pi_\theta(a_t|s_t) - \log \pi_{old}(a_t|s_t)
    log_ratio = log_prob - mb["old_log_prob"]
    if m_step == "clip":
        likelihood_loss = clipped_likelihood_loss(mb["psi"], mb["psi_minus"], log_ratio, clip)
    else:
        likelihood_loss = nll_loss(mb["psi"], log_prob)
    # LaTeX: (D_\mu, D_\sigma) = \frac{1}{N_{sel}} \sum_{t \in \mathcal{S}} \big(D_\mu(s_t), D_\sigma(s_t)\big)
    kl_mu, kl_sigma = (masked_mean(kl, mb["selected"]) for kl in family.decoupled_kl(params, mb["params"]))
    # LaTeX: \mathcal{L}_V = \frac{1}{2 N_{valid}} \sum_{t : w^{restart}_t = 1} (V_\phi(s_t) - R_t)^2
    value_loss = 0.5 * masked_mean((values - mb["returns"]) ** 2, mb["restarting"])
    # The share of the clip's terms it cuts (seed: would cut): the pull's above 1 + clip, the push's below 1 - clip.
    cut = torch.cat([log_ratio > math.log1p(clip), log_ratio < math.log1p(-clip)]).float()
    clipfrac = masked_mean(cut, torch.cat([mb["psi"] > 0, mb["psi_minus"] > 0]).float())
    return {"likelihood": likelihood_loss, "kl_mu": kl_mu, "kl_sigma": kl_sigma, "value": value_loss, "clipfrac": clipfrac}


def build_optimizers(agent: Agent, duals: DualVariables, args: Args) -> dict[str, torch.optim.Optimizer]:
    """Adam (eps 1e-5) for the networks and each dual, fused: one kernel for a group's tensors, not a Python loop."""
    adam = partial(torch.optim.Adam, eps=1e-5, fused=True)
    policy, value = ([p for name, p in agent.named_parameters() if name.startswith(part)] for part in ("policy_", "value_"))
    model = adam([{"params": policy, "lr": args.policy_lr}, {"params": value, "lr": args.value_lr}], args.policy_lr)
    temperature = adam([duals.raw_temperature], args.temperature_lr)
    alpha = adam([duals.raw_alpha_mu, duals.raw_alpha_sigma], args.alpha_lr)
    return {"model": model, "temperature": temperature, "alpha": alpha}


def minibatches(fields: dict[str, torch.Tensor], num_minibatches: int, m_steps: int):
    """m_steps minibatches of the fields, reshuffled each pass: one tensor's columns, so a pass costs one gather."""
    n = len(next(iter(fields.values())))
    columns = [field.reshape(n, -1) for field in fields.values()]
    packed, widths = torch.cat(columns, 1), [column.shape[1] for column in columns]
    for step in range(m_steps):
        if step % num_minibatches == 0:  # a fresh shuffle for each pass over the batch
            order = torch.randperm(n) if num_minibatches > 1 else torch.arange(n)  # the CPU generator: one order anywhere
            shuffled = packed[order.to(packed.device)].split(n // num_minibatches)
        columns = zip(fields.items(), shuffled[step % num_minibatches].split(widths, dim=1), strict=True)
        yield {key: column.reshape(-1, *field.shape[1:]) for (key, field), column in columns}


def vmpo_update(
    agent: Agent, duals: DualVariables, optimizers: dict, batch: dict, args: Args, lr_scale: float = 1.0
) -> dict[str, float]:
    """One V-MPO iteration on a flat batch: E-step (one temperature step), then m_steps M-steps. `lr_scale` is the
    learning rates' schedule this iteration, lr_k / lr_0 (1: not annealed)."""
    restarting = 1.0 - batch["resets"]  # the paper's restarting weights: 0 on reset steps, whose actions the env ignored
    advantages = normalize_advantages(batch["advantages"], restarting) if args.norm_adv else batch["advantages"]
    # ---- E-step: weights with the current temperature, then one dual step on it.
    estep = e_step(advantages, restarting, duals.temperature(), args.topk_fraction, args.epsilon_eta)
    optimizers["temperature"].zero_grad()
    estep["dual_loss"].backward()
    optimizers["temperature"].step()
    # --m-step clip's push: the mirror E-step (same k, negated advantages), at eta' after the step (the pull's: before).
    # LaTeX: \psi^-_t \propto \bar{w}^-_t e^{-w^{restart}_t \hat{A}_t / \eta'}, \quad \bar{w}^-_t = w^{restart}_t [t \in \mathrm{BottomK}(s, k)]
    push_weights = e_step(-advantages, restarting, duals.temperature().detach(), args.topk_fraction, 0.0)["weights"]
    # psi sums to 1 over the batch: scaling a minibatch's weights by N / n keeps the likelihood's size against the KLs.
    family = agent.policy_head
    fields = {key: batch[key] for key in ("obs", "u", "params", "returns")}
    fields["old_log_prob"] = family.log_prob(batch["params"], batch["u"])
    fields["psi"], fields["psi_minus"] = args.num_minibatches * estep["weights"], args.num_minibatches * push_weights
    fields["selected"], fields["restarting"] = estep["selected_weights"], restarting
    # ---- M-step: the likelihood loss of --m-step under decoupled KL trust regions, plus the value fit, a minibatch a step.
    # RPO's shift shrinks with the learning rate (a third as wide at 1M on the default schedule): it keeps the std wide
    # early and lets it narrow late, where the evaluated mean must walk on its own.
    # LaTeX: \alpha^{rpo}_k = \alpha^{rpo} \, \mathrm{lr}_k / \mathrm{lr}_0
    rpo_alpha = args.rpo_alpha * lr_scale
    for mb in minibatches(fields, args.num_minibatches, args.m_steps):
        params, values = agent(mb["obs"])
        losses = m_step_losses(family, params, values, mb, args.m_step, args.m_step_clip, rpo_alpha)
        # The multipliers' dual loss, KLs held constant: minimizing it grows alpha while its KL is above epsilon.
        alpha_mu, alpha_sigma = duals.alphas()
        kl_mu, kl_sigma = losses["kl_mu"].detach(), losses["kl_sigma"].detach()
        # LaTeX: \mathcal{L}_\alpha = \alpha_\mu (\epsilon_\mu - D_\mu) + \alpha_\sigma (\epsilon_\sigma - D_\sigma)
        alpha_loss = alpha_mu * (args.epsilon_mu - kl_mu) + alpha_sigma * (args.epsilon_sigma - kl_sigma)
        optimizers["alpha"].zero_grad()
        alpha_loss.backward()
        optimizers["alpha"].step()
        alpha_mu, alpha_sigma = (alpha.detach() for alpha in duals.alphas())  # the updated ones, held constant below
        # LaTeX: \mathcal{L}_\pi = \mathcal{L}^{lik}_\pi + \mathrm{sg}[\alpha_\mu] D_\mu + \mathrm{sg}[\alpha_\sigma] D_\sigma
        policy_loss = losses["likelihood"] + alpha_mu * losses["kl_mu"] + alpha_sigma * losses["kl_sigma"]
        # LaTeX: \mathcal{L} = \mathcal{L}_\pi + \mathcal{L}_V
        total_loss = policy_loss + losses["value"]
        optimizers["model"].zero_grad()
        total_loss.backward()
        # LaTeX: g \leftarrow g \cdot \min\left(1, \frac{c_{\max}}{\lVert g \rVert_2}\right)
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizers["model"].step()
    # ---- Diagnostics: the last M-step's (its minibatch); the KLs that the multipliers and the temperature's dual bound.
    with torch.no_grad():
        stats = {"losses/policy_loss": policy_loss, "losses/value_loss": losses["value"], "losses/alpha_loss": alpha_loss}
        stats |= {"losses/temperature_loss": estep["dual_loss"], "losses/clipfrac": losses["clipfrac"]}
        stats["losses/entropy"] = masked_mean(family.entropy(params), mb["selected"])
        stats |= {"kl/mu": losses["kl_mu"], "kl/sigma": losses["kl_sigma"], "vmpo/kl_weights": estep["kl"]}
        stats |= {"vmpo/alpha_mu": alpha_mu, "vmpo/alpha_sigma": alpha_sigma, "vmpo/temperature": duals.temperature()}
        stats["vmpo/ess"] = 1.0 / (estep["weights"] ** 2).sum()  # effective sample size of the E-step weights
    stats = {k: float(x.detach()) for k, x in stats.items()}
    bad = [k for k in stats if k.startswith("losses/") and not math.isfinite(stats[k])]
    if bad or not all(torch.isfinite(p).all() for p in [*agent.parameters(), *duals.parameters()]):
        raise TrainingDiverged(f"non-finite {', '.join(bad) or 'parameters'}")
    return stats


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
    optimizers: dict[str, torch.optim.Optimizer]
    duals: DualVariables
    obs_rms: RunningMeanStd
    reward_scaler: RewardScaler
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
    network = (args.policy, args.policy_hidden_sizes, args.value_hidden_sizes, args.init_log_std, args.ppo_like_backbone)
    agent = Agent(eval_envs.single_observation_space.shape[0], eval_envs.single_action_space, *network).to(device)
    torch.set_num_threads(threads)  # the update's
    duals = DualVariables(args.temperature_init, args.alpha_init).to(device)
    obs_rms = RunningMeanStd(eval_envs.single_observation_space.shape, args.norm_obs)
    scaler = RewardScaler(args.num_envs, args.gamma, args.reward_scaling)
    optimizers = build_optimizers(agent, duals, args)
    run = Run(args, device, run_dir, writer, envs, eval_envs, agent, optimizers, duals, obs_rms, scaler)
    if source is not None:  # the checkpoint's own env and hyperparameters (args_with_checkpoint)
        run.agent.load_state_dict(source["agent"])
        run.obs_rms.load_state_dict(source["obs_rms"])
        run.global_step = source["global_step"]
        if args.resume:
            run.duals.load_state_dict(source["duals"])
            for name, optimizer in run.optimizers.items():
                optimizer.load_state_dict(source["optimizers"][name])
            run.iteration = source["iteration"]
            run.reward_scaler.rms.load_state_dict(source["reward_rms"])
            restore_rng(source["rng"], device, source.get("device", "cpu"), source_path)
    return run


class DeferredCtrlC:
    """Ctrl-C raised at the loop's next `check`, not in TensorBoard's writer (its lock left held hangs close); twice: now."""

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
    args, agent, optimizers, writer, family = run.args, run.agent, run.optimizers, run.writer, run.agent.policy_head
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    threads = torch.get_num_threads()  # the update's, as set_up leaves them
    # The rollout acts on the CPU, too small a pass to pay for a GPU's launches; on a GPU, a CPU copy synced after updates.
    acting_agent = agent if run.device.type == "cpu" else copy.deepcopy(agent).cpu()
    rollout = Rollout.empty(args.num_steps, run.envs, torch.device("cpu"))
    raw_obs, _ = run.envs.reset(seed=args.seed + run.global_step)  # a resumed run starts fresh episodes
    run.obs_rms.update(raw_obs)
    next_obs = torch.as_tensor(run.obs_rms.normalize(raw_obs))
    end_step = num_iterations * batch_size
    if args.resume:
        print(f"resuming {args.resume} at step {run.global_step} with its saved hyperparameters; training to step {end_step}")
    elif end_step != args.total_timesteps:
        rounded = f"--total-timesteps {args.total_timesteps} rounded down to whole rollouts of {batch_size} steps"
        print(f"training to step {end_step}: {rounded}")
    recent_returns = deque(maxlen=20)
    # The training return is the env's own episode's (the published tables' measure): the capped envs' episodes, which
    # end at --train-episode-steps, are left out of it.
    first_uncapped = num_capped_envs(args)
    train_time, trained_steps = 0.0, 0
    save_checkpoint(run, "last")  # _last always holds the last completed update: Ctrl-C loses only unfinished work
    ctrl_c = DeferredCtrlC()
    try:
        for iteration in range(run.iteration + 1, num_iterations + 1):
            ctrl_c.check()
            tick = time.time()
            lr_scale = learning_rate_scale(iteration, num_iterations, batch_size, args.lr_horizon) if args.anneal_lr else 1.0
            for group, lr in zip(optimizers["model"].param_groups, (args.policy_lr, args.value_lr), strict=True):
                group["lr"] = lr * lr_scale
            # ---- collect a rollout with the current policy
            torch.set_num_threads(1)  # batches of num_envs observations only lose to threading overhead
            next_obs, episodes = collect_rollout(acting_agent, run.envs, run.obs_rms, run.reward_scaler, next_obs, rollout)
            ctrl_c.check()  # the rollout is dropped: _last holds the update before it
            for offset, env, episode_return, episode_length in episodes:
                if env < first_uncapped:
                    continue
                recent_returns.append(episode_return)
                writer.add_scalar("charts/episodic_return", episode_return, run.global_step + offset)
                writer.add_scalar("charts/episodic_length", episode_length, run.global_step + offset)
            # ---- advantages and value targets
            with torch.inference_mode():  # row t+1 holds s_{t+1}; the observation after the rollout bootstraps the last row
                next_values = torch.cat([rollout.values[1:], acting_agent.value(next_obs).unsqueeze(0)], 0)
            target_inputs = (rollout.rewards, rollout.values, next_values, rollout.terminated, rollout.truncated)
            advantages, returns = compute_gae(*target_inputs, args.gamma, args.gae_lambda)
            batch = rollout.batch(advantages, returns, run.device)
            # ---- update
            torch.set_num_threads(threads)  # the batch's matrix products do use the cores
            try:
                stats = vmpo_update(agent, run.duals, optimizers, batch, args, lr_scale)
            except TrainingDiverged as e:
                stopped = f"at global step {run.global_step + batch_size}; stopped"
                raise TrainingDiverged(f"{e} {stopped}. Last good checkpoint: {last_checkpoint(run)}") from None
            if acting_agent is not agent:
                acting_agent.load_state_dict(agent.state_dict())
            run.iteration, run.global_step = iteration, run.global_step + batch_size
            save_checkpoint(run, "last")
            train_time, trained_steps = train_time + time.time() - tick, trained_steps + batch_size
            # ---- log
            sps = trained_steps / train_time
            stats |= {"charts/learning_rate": optimizers["model"].param_groups[0]["lr"], "charts/SPS": sps}
            trained = batch["resets"] == 0  # the value's fit over the trained samples, with the values that acted
            stats["losses/explained_variance"] = explained_variance(batch["values"][trained], batch["returns"][trained])
            stats["charts/actions_at_bounds"] = family.at_bounds(family.env_action(batch["u"][trained])).float().mean()
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
    except OSError as e:  # a write that failed (a full disk): the checkpoint it would have replaced is kept
        raise OSError(f"{e}; stopped. Last good checkpoint: {last_checkpoint(run)}") from None
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last trained step's checkpoint is {last_checkpoint(run)}")
        raise
    finally:
        ctrl_c.restore()
        torch.set_num_threads(threads)
        with contextlib.suppress(OSError) if sys.exc_info()[1] else contextlib.nullcontext():
            run.close()  # after a failed write, TensorBoard's writer raises it again: once is enough
    summary = dict(run_dir=run.run_dir, global_step=run.global_step, train_sps=sps, wall_time=time.time() - start_time)
    return summary | dict(final_eval_return=run.last_eval, final_eval_std=eval_returns.std(), best_eval_return=run.best_eval)


def learning_rate_scale(iteration: int, num_iterations: int, batch_size: int, horizon: int) -> float:
    if horizon == 0:
        # LaTeX: \lambda_k = \lambda_0 \left(1 - \frac{k - 1}{K}\right)
        return 1.0 - (iteration - 1.0) / num_iterations
    # LaTeX: \lambda_k = \lambda_0 \frac{H}{H + (k - 1) B}, \quad B = \text{num\_envs} \cdot \text{num\_steps}
    return horizon / (horizon + (iteration - 1.0) * batch_size)


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
DM_CONTROL_FORMS = "dm_control/<domain>/<task> or dm_control/<domain>-<task>-v0 (e.g. dm_control/walker/walk)"


def resolve_env_id(env_id: str) -> str:
    """The gymnasium id of an accepted env id; any other id is a ConfigError that says what is accepted."""
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
            raise ConfigError(f"malformed dm_control id {env_id!r}; accepted forms: {DM_CONTROL_FORMS}")
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
        raise ConfigError(f"unknown env id {env_id!r}; accepted: a registered gymnasium id, {DM_CONTROL_FORMS}, or a probe id")
    return name


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


def make_vector_env(
    args: Args, num_envs: int, seed: int, render_first: bool = False, limits: list[int | None] | None = None
) -> gym.vector.VectorEnv:
    """The official envs: flat observations, NEXT_STEP autoreset, episode statistics, env 0 rendering with `render_first`;
    env i's time limit `limits[i]` where given, else --max-episode-steps."""

    def make_env(render: bool, steps: int | None) -> gym.Env:
        limit = {} if steps is None else {"max_episode_steps": steps}
        env = gym.make(resolve_env_id(args.env_id), **limit, **({"render_mode": "rgb_array"} if render else {}))
        if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict observations
        return env

    limits = limits or [args.max_episode_steps] * num_envs
    thunks = [lambda render=(render_first and i == 0), steps=limits[i]: make_env(render, steps) for i in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.action_space.seed(seed)
    return envs


ENVPOOL_DIFFERS = ("FingerSpin-v1", "FingerTurnEasy-v1", "FingerTurnHard-v1")  # ports unlike the official task: not in auto


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
    init_log_std = None if policy == "beta" else 1.0 if args.init_log_std is None else args.init_log_std
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

    def __init__(self, task_id: str, official: gym.Env, limits: list[int | None], num_threads: int):
        self.task_id, self.num_envs, self.num_threads = task_id, len(limits), num_threads
        self.groups = [(len(list(run)), limit) for limit, run in itertools.groupby(limits)]  # one pool per run of a limit
        num_envs = self.num_envs
        space = official.observation_space
        self.keys = list(space.keys()) if isinstance(space, gym.spaces.Dict) else None
        self.single_observation_space = gym.spaces.flatten_space(space) if self.keys else space
        self.single_action_space = official.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.pools, self.prev_done = None, np.zeros(num_envs, dtype=bool)

    def flatten(self, obs) -> np.ndarray:
        return obs if self.keys is None else np.concatenate([obs[key].reshape(len(obs[key]), -1) for key in self.keys], axis=1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.pools is None or seed is not None:  # EnvPool 1.2.0 takes its seed when it is made: a new seed, a new pool
            import envpool

            self.close_extras()
            self.pools = []
            for g, (n, limit) in enumerate(self.groups):
                steps = {} if limit is None else {"max_episode_steps": limit}
                kwargs = dict(num_envs=n, seed=(seed or 0) + 7919 * g, num_threads=min(self.num_threads, n), **steps)
                self.pools.append(envpool.make(self.task_id, env_type="gymnasium", **kwargs))
        obs = np.concatenate([self.flatten(pool.reset()[0]) for pool in self.pools])
        self.prev_done[:] = False
        return obs, {}

    def step(self, actions: np.ndarray):
        cuts = np.cumsum([n for n, _ in self.groups])[:-1]
        outs = [
            pool.step(a) for pool, a in zip(self.pools, np.split(np.asarray(actions, dtype=np.float64), cuts), strict=True)
        ]
        obs = np.concatenate([self.flatten(out[0]) for out in outs])
        reward, terminated, truncated = (np.concatenate([out[i] for out in outs]) for i in (1, 2, 3))
        reward = np.where(self.prev_done, 0.0, reward)
        self.prev_done = terminated | truncated
        return obs, reward, terminated, truncated, {}

    def close_extras(self, **kwargs) -> None:
        for pool in self.pools or []:
            pool.close()
        self.pools = None


def num_capped_envs(args: Args) -> int:
    """How many training envs, the first ones, --train-episode-steps caps: half of them (none without it)."""
    return args.num_envs // 2 if args.train_episode_steps is not None else 0


def make_training_envs(args: Args, seed: int, threads: int = 1) -> gym.vector.VectorEnv:
    """The training envs of --env-backend, with NEXT_STEP resets and episode statistics on both backends."""
    backend = choose_env_backend(args)[0] if args.env_backend == "auto" else args.env_backend
    limits = [args.max_episode_steps] * args.num_envs
    if args.train_episode_steps is not None:  # a truncation, bootstrapped like the official limit's; never longer than it
        own = gym.spec(resolve_env_id(args.env_id)).max_episode_steps  # Reacher-v5 50, Pusher-v5 100; dm_control: None
        limit = min(n for n in (args.train_episode_steps, args.max_episode_steps, own) if n is not None)
        capped = num_capped_envs(args)
        limits[:capped] = [limit] * capped  # the first half; the rest keep the env's own
    if backend == "gymnasium":
        return make_vector_env(args, args.num_envs, seed, limits=limits)
    gym_id = resolve_env_id(args.env_id)
    task_id, threads = envpool_task_id(gym_id), min(threads, args.num_envs)
    with gym.make(gym_id) as official:
        envs = EnvPoolVectorEnv(task_id, official, limits, threads)
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
    """The generators: torch's (actions, minibatch order, RPO's noise), numpy's (cached Gaussian too) and the GPU's."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    numpy = {"key": torch.from_numpy(key.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss}
    state = {"torch": torch.get_rng_state(), "numpy": numpy}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device, saved_on: str, path: str) -> None:
    """The checkpoint's generators; one line where the resumed run cannot repeat an uninterrupted one bit for bit."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if saved_on != device.type:
        note = f"note: {path} was written on {saved_on} and resumes on {device.type}: the same state, but the two devices"
        print(f"{note} round floating point differently, so the run will not repeat an uninterrupted one bit for bit")


def save_checkpoint(run: Run, kind: str) -> None:
    """`<script>_<kind>.pt` with the run's state at `run.global_step`; atomic: a temporary file renamed over it."""
    path = run.path(kind)
    ckpt = {"algo": SCRIPT, "args": dataclasses.asdict(run.args), "rng": rng_state(run.device), "device": run.device.type}
    ckpt |= {"eval_return": run.last_eval, "global_step": run.global_step, "iteration": run.iteration}
    ckpt |= {"agent": run.agent.state_dict(), "duals": run.duals.state_dict(), "obs_rms": run.obs_rms.state_dict()}
    ckpt["optimizers"] = {name: optimizer.state_dict() for name, optimizer in run.optimizers.items()}
    ckpt["reward_rms"] = run.reward_scaler.rms.state_dict()
    buffer = io.BytesIO()  # written by Python, whose error names its cause (torch's own writer's does not)
    torch.save(ckpt, buffer)
    try:
        with open(f"{path}.tmp", "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(f"{path}.tmp", path)
    finally:  # a failed write leaves no .tmp behind (a renamed one is gone already)
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")


def last_checkpoint(run: Run) -> str:
    """`_last.pt` and its step, read back from the file: a Ctrl-C or a failed write can land after a save's rename."""
    path = run.path("last")
    return f"{path} (step {torch.load(path, map_location='cpu', weights_only=True)['global_step']})"


def load_checkpoint(path: str, flag: str) -> dict:
    """One of this script's checkpoints, or a ConfigError that says what the file is instead."""
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
    if not finite(ckpt):
        raise ConfigError(f"{flag} {path!r} holds NaN or inf values (a diverged run's); use an earlier checkpoint")
    return ckpt


def finite(tree) -> bool:
    """Whether every floating-point tensor in a checkpoint's nested dicts and lists is finite."""
    if isinstance(tree, dict | list | tuple):
        return all(finite(value) for value in (tree.values() if isinstance(tree, dict) else tree))
    return not (isinstance(tree, torch.Tensor) and tree.is_floating_point()) or bool(tree.isfinite().all())


# Resume and eval-only take the checkpoint's arguments, except these: how this run is run and logged.
RUN_FIELDS = "exp_name cuda track wandb_project_name wandb_entity capture_video output_dir total_timesteps".split()
RUN_FIELDS += ["eval_interval", "eval_episodes", "max_episode_steps", "torch_threads", "checkpoint", "eval_only", "resume"]


def args_with_checkpoint(args: Args, ckpt: dict) -> Args:
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items() if k not in RUN_FIELDS}
    saved["init_log_std"] = None if saved["policy"] == "beta" else saved["init_log_std"]  # earlier versions saved 0.0
    return dataclasses.replace(args, **saved)


# -------------------------------------------------------------------------------- Argument checks
def check_args(args: Args, gl_backend: str | None) -> tuple[str, float, float | None, str]:
    """Reject impossible settings with one line, before any heavy work; `choose_policy`'s answer for the env's actions."""

    def require(ok: bool, flag: str, accepted: str) -> None:
        if not ok:
            raise ConfigError(f"--{flag.replace('_', '-')} must be {accepted}, got {getattr(args, flag)}")

    positive = ("epsilon_eta", "epsilon_mu", "epsilon_sigma", "temperature_init", "alpha_init", "policy_lr", "value_lr")
    for name in (*positive, "temperature_lr", "alpha_lr", "max_grad_norm"):
        require(getattr(args, name) > 0, name, "> 0")
    require(args.rpo_alpha is None or args.rpo_alpha >= 0, "rpo_alpha", ">= 0 (0: no shift; unset: the family's)")
    require(args.lr_horizon >= 0, "lr_horizon", ">= 0 (0: anneal over --total-timesteps)")
    for name in ("num_envs", "num_steps", "m_steps", "num_minibatches"):
        require(getattr(args, name) >= 1, name, ">= 1")
    require(1 <= args.eval_episodes <= 1000, "eval_episodes", "in [1, 1000] (one env each)")
    require(0 <= args.seed < 2**32, "seed", "in [0, 2**32) (numpy's seeds)")
    for name in ("torch_threads", "eval_interval"):
        require(getattr(args, name) >= 0, name, ">= 0 (0: the default)")
    for name in ("gamma", "gae_lambda"):
        require(0.0 <= getattr(args, name) <= 1.0, name, "in [0, 1]")
    require(0.0 < args.topk_fraction <= 1.0, "topk_fraction", "in (0, 1]")
    require(0.0 < args.m_step_clip < 1.0, "m_step_clip", "in (0, 1)")
    require(args.max_episode_steps is None or args.max_episode_steps >= 1, "max_episode_steps", ">= 1")
    require(args.train_episode_steps is None or args.train_episode_steps >= 1, "train_episode_steps", ">= 1")
    sizes = args.policy_hidden_sizes + args.value_hidden_sizes
    require(min(sizes, default=1) >= 1, "policy_hidden_sizes", "positive integers, as --value-hidden-sizes")
    batch = args.num_envs * args.num_steps
    require(batch % args.num_minibatches == 0, "num_minibatches", f"a divisor of the rollout of {batch}")
    require(args.eval_only or args.total_timesteps >= batch, "total_timesteps", f">= num_envs * num_steps ({batch})")
    require(int(args.topk_fraction * batch) >= 1, "topk_fraction", ">= 1 / (num_envs * num_steps) to select a sample")
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
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # MKL's strict mode: one summing order on any thread count
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

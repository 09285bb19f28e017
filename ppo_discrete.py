"""PPO for discrete actions: clipped surrogate objective with GAE, in one file.

Proximal Policy Optimization (Schulman et al., 2017, https://arxiv.org/abs/1707.06347)
with Generalized Advantage Estimation (Schulman et al., 2016,
https://arxiv.org/abs/1506.02438). A categorical policy and a state-value critic
(separate MLPs) are trained on batches of ``num_envs * num_steps`` transitions
collected by the current policy, for ``update_epochs`` passes over shuffled
minibatches.

Run it:

    python ppo_discrete.py                                   # CartPole-v1, 100k steps
    python ppo_discrete.py --env-id Acrobot-v1 --total-timesteps 500000 --track
    python ppo_discrete.py --eval-only --checkpoint runs/<run>/ppo_discrete_best.pt
    python ppo_discrete.py --resume runs/<run>/ppo_discrete_last.pt
    python ppo_discrete.py --help                            # every option

The math, rendered next to the code that computes it: ``docs/ppo_discrete.md`` (the
whole file) and ``docs/ppo_discrete_annotations.md`` (each formula with its code).
Every equation carries a ``# LaTeX:`` comment directly above the line computing it.
Continuous actions (``Box``): use ``ppo_continuous.py``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import random
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    exp_name: str = "ppo_discrete"
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch, envs)"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when available (falls back to CPU, and says so, when it is not)"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team); None uses your default"""
    capture_video: bool = False
    """write mp4 videos of evaluation episodes to `<run dir>/videos/`"""
    env_id: str = "CartPole-v1"
    """a gymnasium id with a Discrete action space, or a probe id such as `Probe3Discrete-v0`"""
    total_timesteps: int = 100_000
    """total environment steps of training (counted over all envs)"""
    num_envs: int = 16
    """number of parallel training environments"""
    num_steps: int = 16
    """steps per environment per rollout (batch size = num_envs * num_steps)"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 0.8
    """lambda of Generalized Advantage Estimation"""
    learning_rate: float = 1e-3
    """Adam learning rate (start value when annealed)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over training"""
    num_minibatches: int = 1
    """minibatches per epoch (must divide the batch size)"""
    update_epochs: int = 10
    """passes over each batch"""
    norm_adv: bool = True
    """normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """clipping range epsilon of the probability ratio (and of the value change with --clip-vloss)"""
    clip_vloss: bool = False
    """use the clipped value loss of the PPO2 implementation"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """clip the global gradient norm to this value"""
    target_kl: Optional[float] = None
    """stop the update early once the approximate KL to the old policy exceeds this (None: never)"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer widths of both the actor and the critic MLPs"""
    norm_obs: bool = False
    """normalize observations with running statistics shared by all training envs"""
    output_dir: str = "runs"
    """parent directory of the run directory (TensorBoard events, checkpoints, videos)"""
    eval_interval: int = 20_000
    """environment steps between greedy evaluations (0: only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per evaluation env)"""
    checkpoint: Optional[str] = None
    """a checkpoint to evaluate with --eval-only"""
    eval_only: bool = False
    """evaluate --checkpoint (and record it with --capture-video) without training"""
    resume: Optional[str] = None
    """continue training from this checkpoint to --total-timesteps, in a new run dir, with its saved env and hyperparameters"""


class ConfigError(ValueError):
    """Bad input; the message names what was wrong and what is accepted."""


SCRIPT = "ppo_discrete"
NON_DISCRETE_HINT = "use ppo_continuous.py (or vmpo_continuous.py) for Box actions"


# ---------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------
def resolve_env_id(env_id: str) -> str:
    """Register the ids this script accepts beyond plain gymnasium ones and map aliases."""
    if env_id.startswith("dm_control/"):
        import shimmy  # registers the dm_control/* ids

        gym.register_envs(shimmy)
        parts = env_id.split("/")
        if len(parts) == 3:  # dm_control/<domain>/<task> -> shimmy's dm_control/<domain>-<task>-v0
            env_id = f"dm_control/{parts[1]}-{parts[2]}-v0"
    elif env_id.startswith("Probe"):
        try:
            import probe_envs  # noqa: F401  (registers Probe*-v0; lives next to this script)
        except ImportError:
            pass
    return env_id


# Headless MuJoCo rendering: each MUJOCO_GL backend and the shared library it loads, in order of preference.
GL_BACKENDS = (("egl", ("libEGL.so.1",)), ("osmesa", ("libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so")))
GL_PACKAGES = "Mesa's EGL (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0) or OSMesa (apt-get install libosmesa6)"


def library_loads(names: tuple[str, ...]) -> bool:
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


def choose_gl_backend(capture_video: bool) -> Optional[str]:
    """Set MUJOCO_GL before anything imports mujoco; return the backend (None: none loads).

    The user's own MUJOCO_GL always wins. Without video nothing is rendered, so no GL library
    is needed ('disable'); for video, the first of EGL and OSMesa whose library loads.
    """
    if "MUJOCO_GL" in os.environ:
        return os.environ["MUJOCO_GL"]
    if not capture_video:
        os.environ["MUJOCO_GL"] = "disable"
        return "disable"
    if sys.platform != "linux":
        return "default"  # macOS / Windows: MuJoCo's own windowing backend
    for backend, libraries in GL_BACKENDS:
        if library_loads(libraries):
            os.environ["MUJOCO_GL"] = backend
            return backend
    os.environ["MUJOCO_GL"] = "disable"  # mujoco still imports; check_video names what to install
    return None


def check_video(env_id: str, gym_id: str, gl_backend: Optional[str]) -> None:
    """--capture-video: one env renders one frame now, so a missing renderer fails here, in one line."""
    spec = gym.spec(gym_id)
    uses_mujoco = gym_id.startswith("dm_control/") or "mujoco" in str(spec.entry_point)
    if uses_mujoco and gl_backend is None:
        raise ConfigError(f"--capture-video: no OpenGL library loads for rendering {env_id}; install {GL_PACKAGES}")
    try:
        with warnings.catch_warnings():  # gymnasium warns about unsupported render modes: the check below says it
            warnings.simplefilter("ignore")
            env = gym.make(gym_id, render_mode="rgb_array")
        try:
            env.reset(seed=0)
            frame = env.render()
        finally:
            env.close()
    except Exception as e:  # a renderer that cannot start: name it, without a traceback
        raise ConfigError(f"--capture-video: {env_id} cannot render ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0]})") from None
    if not isinstance(frame, np.ndarray):
        raise ConfigError(f"--capture-video: {env_id} draws no rgb frames (render() returned {type(frame).__name__})")


class RecordEpisodeVideo(gym.Wrapper):
    """Collects rendered frames and writes one mp4 per finished episode (unfinished ones are dropped)."""

    def __init__(self, env: gym.Env, video_dir: str):
        super().__init__(env)
        self.video_dir, self.frames, self.count = video_dir, [], 0
        os.makedirs(video_dir, exist_ok=True)

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.frames = [self.env.render()]
        return out

    def step(self, action):
        out = self.env.step(action)
        self.frames.append(self.env.render())
        if out[2] or out[3]:
            import imageio

            path = os.path.join(self.video_dir, f"eval-episode-{self.count}-{int(time.time())}.mp4")
            imageio.mimsave(path, self.frames, fps=self.metadata.get("render_fps", 30))
            self.count, self.frames = self.count + 1, []
        return out


def make_vector_env(args: Args, num_envs: int, seed: int, video_dir: Optional[str] = None) -> gym.vector.VectorEnv:
    """The training (or evaluation) vector env with every wrapper.

    SAME_STEP autoreset: an env that ends is reset inside the same ``step`` call, its real
    final observation arrives in ``infos["final_obs"]``, so no transition is a reset step.
    """
    env_id = resolve_env_id(args.env_id)

    def thunk(index: int):
        def make() -> gym.Env:
            record = video_dir is not None and index == 0
            env = gym.make(env_id, render_mode="rgb_array" if record else None)
            if isinstance(env.observation_space, gym.spaces.Dict):
                env = gym.wrappers.FlattenObservation(env)
            if record:
                env = RecordEpisodeVideo(env, video_dir)
            return env

        return make

    envs = gym.vector.SyncVectorEnv([thunk(i) for i in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.action_space.seed(seed)
    return envs


class RunningMeanStd:
    """Running mean/variance of observations (float64), merged batch by batch (Chan et al.)."""

    def __init__(self, shape: tuple[int, ...]):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        # LaTeX: \tilde{s} = \operatorname{clip}\left(\frac{s - \mu}{\sqrt{\sigma^2 + 10^{-8}}}, -10, 10\right)
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10.0, 10.0).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(self.mean), "var": torch.from_numpy(self.var), "count": float(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].numpy(), state["var"].numpy(), state["count"]


# ---------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------
def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    layers, last = [], in_dim
    for width in hidden_sizes:
        layers += [layer_init(nn.Linear(last, width)), nn.Tanh()]
        last = width
    return nn.Sequential(*layers, layer_init(nn.Linear(last, out_dim), std=out_std))


class Agent(nn.Module):
    """Separate actor (logits) and critic (value) MLPs; the small 0.01 init of the policy
    output starts the policy near uniform."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes: tuple[int, ...] = (64, 64)):
        super().__init__()
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_std=1.0)
        self.actor = mlp(obs_dim, hidden_sizes, num_actions, out_std=0.01)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def get_logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)

    @classmethod
    def from_checkpoint(cls, ckpt: dict) -> "Agent":
        agent = cls(ckpt["obs_dim"], ckpt["num_actions"], tuple(ckpt["args"]["hidden_sizes"]))
        agent.load_state_dict(ckpt["agent"])
        return agent


def categorical_log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``actions`` and entropy of the softmax policy given ``logits``."""
    # LaTeX: \log \pi_\theta(b|s_t) = z_b - \log \sum_{b'} e^{z_{b'}} \quad (z = \mathrm{logits})
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    # LaTeX: \log \pi_\theta(a_t|s_t) = \mathrm{log\_probs}_{t, a_t}
    log_prob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    # LaTeX: \mathcal{H}[\pi_\theta(\cdot|s_t)] = -\sum_b \pi_\theta(b|s_t) \log \pi_\theta(b|s_t)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_prob, entropy


# ---------------------------------------------------------------------------------------
# Advantages and targets
# ---------------------------------------------------------------------------------------
def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                terminated: torch.Tensor, truncated: torch.Tensor, gamma: float,
                gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and value targets for a ``(num_steps, num_envs)`` rollout.

    ``next_values[t] = V(s_{t+1})`` of the real successor (the final observation where an
    episode ended), so a truncated step bootstraps from its final state while a terminated
    step's successor is worth 0; the recursion stops at every episode end.
    """
    not_terminated, not_done = 1.0 - terminated.float(), 1.0 - (terminated | truncated).float()
    # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
    deltas = rewards + gamma * not_terminated * next_values - values
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last_advantage = deltas[t] + gamma * gae_lambda * not_done[t] * last_advantage
        advantages[t] = last_advantage
    # LaTeX: R_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


# ---------------------------------------------------------------------------------------
# Losses and update
# ---------------------------------------------------------------------------------------
def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    # LaTeX: \bar{A}_t = \frac{\hat{A}_t - \operatorname{mean}(\hat{A})}{\operatorname{std}(\hat{A}) + 10^{-8}}
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def clipped_surrogate_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """Negative of the clipped surrogate objective L^CLIP (Eq. 7 of the PPO paper), to minimize."""
    # rho_t is the paper's r_t(theta) (renamed: r_t is the reward here).
    # LaTeX: \rho_t(\theta) = \exp\left(\log \pi_\theta(a_t|s_t) - \log \pi_{\theta_{old}}(a_t|s_t)\right)
    ratio = log_ratio.exp()
    # The paper maximizes L^CLIP; this is its negative, minimized by gradient descent.
    # LaTeX: L^{CLIP} = -\mathbb{E}_t\left[\min\left(\rho_t \hat{A}_t, \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon) \hat{A}_t\right)\right]
    return -torch.min(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages).mean()


def value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               clip_coef: float, clip_vloss: bool) -> torch.Tensor:
    """Half mean squared error to the targets; with ``clip_vloss`` the pessimistic clipped form."""
    # LaTeX: L^{V}_{unclipped,t} = \left(V_\theta(s_t) - R_t\right)^2
    unclipped = (new_values - returns) ** 2
    if not clip_vloss:
        # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[\left(V_\theta(s_t) - R_t\right)^2\right]
        return 0.5 * unclipped.mean()
    # LaTeX: V^{clip}_\theta(s_t) = V_{\theta_{old}}(s_t) + \operatorname{clip}\left(V_\theta(s_t) - V_{\theta_{old}}(s_t), -\epsilon, \epsilon\right)
    clipped_values = old_values + (new_values - old_values).clamp(-clip_coef, clip_coef)
    # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[\max\left(\left(V_\theta(s_t) - R_t\right)^2, \left(V^{clip}_\theta(s_t) - R_t\right)^2\right)\right]
    return 0.5 * torch.max(unclipped, (clipped_values - returns) ** 2).mean()


def kl_diagnostics(log_ratio: torch.Tensor, clip_coef: float) -> dict[str, torch.Tensor]:
    """Sample estimates (actions drawn from the old policy) of the KL in both directions."""
    ratio = log_ratio.exp()
    return {
        # LaTeX: \widehat{D}_{KL}^{k_1}(\pi_{old} \| \pi_\theta) = \mathbb{E}_t\left[-\log \rho_t\right]
        "old_approx_kl": (-log_ratio).mean(),
        # LaTeX: \widehat{D}_{KL}^{k_3}(\pi_{old} \| \pi_\theta) = \mathbb{E}_t\left[\rho_t - 1 - \log \rho_t\right]
        "approx_kl": ((ratio - 1) - log_ratio).mean(),
        # LaTeX: \widehat{D}_{KL}(\pi_\theta \| \pi_{old}) = \mathbb{E}_t\left[\rho_t \log \rho_t - \rho_t + 1\right]
        "approx_kl_reverse": (ratio * log_ratio - ratio + 1).mean(),
        # LaTeX: \mathrm{clipfrac} = \mathbb{E}_t\left[\mathbf{1}\left(|\rho_t - 1| > \epsilon\right)\right]
        "clipfrac": ((ratio - 1).abs() > clip_coef).float().mean(),
    }


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var()
    # LaTeX: \mathrm{EV} = 1 - \frac{\operatorname{Var}[R_t - V(s_t)]}{\operatorname{Var}[R_t]}
    return float("nan") if var_returns == 0 else float(1 - (returns - values).var() / var_returns)


def make_optimizer(agent: Agent, args: Args) -> torch.optim.Optimizer:
    # The fused kernel does one pass over all parameters: ~2x faster than the default for tiny nets.
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)


class TrainingDiverged(RuntimeError):
    """A loss became NaN or inf; the run stops and keeps its last good checkpoint."""


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
               args: Args) -> dict[str, float]:
    """``update_epochs`` passes of shuffled minibatch steps on one rollout; returns diagnostics."""
    batch_size = batch["obs"].shape[0]
    minibatch_size = batch_size // args.num_minibatches
    stats: dict[str, list[torch.Tensor]] = {}
    for _ in range(args.update_epochs):
        order = torch.randperm(batch_size, device=batch["obs"].device)
        for start in range(0, batch_size, minibatch_size):
            idx = order[start:start + minibatch_size]
            log_prob, entropy = categorical_log_prob_entropy(agent.get_logits(batch["obs"][idx]), batch["actions"][idx])
            # LaTeX: \log \rho_t = \log \pi_\theta(a_t|s_t) - \log \pi_{\theta_{old}}(a_t|s_t)
            log_ratio = log_prob - batch["log_probs"][idx]
            with torch.no_grad():
                diag = kl_diagnostics(log_ratio, args.clip_coef)
            if args.target_kl is not None and diag["approx_kl"] > args.target_kl:
                stats.setdefault("early_stop", []).append(torch.ones(()))
                break  # this minibatch would move the policy too far: stop the whole update
            advantages = batch["advantages"][idx]
            if args.norm_adv:
                advantages = normalize_advantages(advantages)
            pg_loss = clipped_surrogate_loss(log_ratio, advantages, args.clip_coef)
            v_loss = value_loss(agent.get_value(batch["obs"][idx]), batch["values"][idx], batch["returns"][idx],
                                args.clip_coef, args.clip_vloss)
            entropy_loss = entropy.mean()
            # LaTeX: L = L^{CLIP} - c_H \mathcal{H}[\pi_\theta] + c_V L^{V}
            loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"non-finite loss ({loss.item()})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # LaTeX: g \leftarrow g \cdot \min\left(1, \frac{c_{max}}{\lVert g \rVert_2}\right)
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            for key, value in {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss,
                               "loss": loss, **diag}.items():
                stats.setdefault(key, []).append(value.detach())
        else:
            continue
        break  # early stop leaves the epoch loop too
    out = {key: float(torch.stack(v).float().mean()) for key, v in stats.items()}  # one sync per update
    out["early_stop"] = float("early_stop" in stats)
    return out


# ---------------------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------------------
def as_tensor(obs: np.ndarray, obs_rms: Optional[RunningMeanStd], device: torch.device) -> torch.Tensor:
    obs = obs_rms.normalize(obs) if obs_rms is not None else np.asarray(obs, dtype=np.float32)
    return torch.as_tensor(obs, dtype=torch.float32, device=device)


@dataclass
class Rollout:
    """``(num_steps, num_envs)`` storage in numpy: the env speaks numpy; one conversion per rollout."""

    obs: np.ndarray
    actions: np.ndarray
    log_probs: np.ndarray
    values: np.ndarray
    next_values: np.ndarray  # V(s_{t+1}) of the real successor: the final observation where an episode ended
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @classmethod
    def empty(cls, num_steps: int, num_envs: int, obs_shape: tuple[int, ...]) -> "Rollout":
        f32 = lambda: np.zeros((num_steps, num_envs), dtype=np.float32)  # noqa: E731
        return cls(np.zeros((num_steps, num_envs) + obs_shape, dtype=np.float32),
                   np.zeros((num_steps, num_envs), dtype=np.int64), f32(), f32(), f32(), f32(),
                   np.zeros((num_steps, num_envs), dtype=bool), np.zeros((num_steps, num_envs), dtype=bool))


@torch.inference_mode()
def collect_rollout(agent: Agent, envs: gym.vector.VectorEnv, raw_obs: np.ndarray, obs_rms: Optional[RunningMeanStd],
                    device: torch.device, buf: Rollout) -> tuple[np.ndarray, list[tuple[int, float, int]]]:
    """Fill ``buf`` with ``num_steps`` steps of every env; return the next observation and the
    finished episodes as (env steps into the rollout, return, length)."""
    num_steps, num_envs = buf.rewards.shape
    episodes = []
    obs_t = as_tensor(raw_obs, obs_rms, device)
    value_t = agent.get_value(obs_t)
    for step in range(num_steps):
        # Sampling straight from the logits: a torch.distributions object costs more than the MLP here.
        log_probs = agent.get_logits(obs_t).log_softmax(-1)
        # LaTeX: a_t \sim \pi_\theta(\cdot|s_t) = \operatorname{softmax}(\mathrm{logits})
        action = torch.multinomial(log_probs.exp(), 1)
        buf.obs[step] = obs_t.cpu().numpy()
        buf.values[step] = value_t.cpu().numpy()
        buf.actions[step] = action.squeeze(-1).cpu().numpy()
        buf.log_probs[step] = log_probs.gather(-1, action).squeeze(-1).cpu().numpy()

        raw_obs, reward, terminated, truncated, infos = envs.step(buf.actions[step])
        buf.rewards[step], buf.terminated[step], buf.truncated[step] = reward, terminated, truncated
        if obs_rms is not None:
            obs_rms.update(raw_obs)
        obs_t = as_tensor(raw_obs, obs_rms, device)
        value_t = agent.get_value(obs_t)
        buf.next_values[step] = value_t.cpu().numpy()
        # SAME_STEP autoreset: raw_obs of an ended env is already the reset one, so a truncated
        # step bootstraps from the real final observation instead (terminated ones are masked in GAE).
        if truncated.any():
            final_obs = np.stack([infos["final_obs"][i] for i in np.flatnonzero(truncated)])
            buf.next_values[step, truncated] = agent.get_value(as_tensor(final_obs, obs_rms, device)).cpu().numpy()
        if "_episode" in infos:
            for i in np.flatnonzero(infos["_episode"]):
                episodes.append(((step + 1) * num_envs, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
    return raw_obs, episodes


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------
@torch.inference_mode()
def evaluate(agent: Agent, envs: gym.vector.VectorEnv, obs_rms: Optional[RunningMeanStd], device: torch.device,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One episode per eval env with the greedy action ``argmax_a pi(a|s)``; returns, lengths."""
    obs, _ = envs.reset(seed=seed)
    returns, lengths = np.zeros(envs.num_envs), np.zeros(envs.num_envs, dtype=np.int64)
    finished = np.zeros(envs.num_envs, dtype=bool)
    while not finished.all():
        # LaTeX: a_t = \arg\max_b \pi_\theta(b|s_t)
        actions = agent.get_logits(as_tensor(obs, obs_rms, device)).argmax(-1).cpu().numpy()
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns += rewards * ~finished
        lengths += ~finished
        finished |= terminated | truncated
    return returns, lengths


# ---------------------------------------------------------------------------------------
# Checks, checkpoints, logging helpers
# ---------------------------------------------------------------------------------------
def check_args(args: Args, gl_backend: Optional[str]) -> None:
    """Reject bad input with one clear line before any heavy work."""
    positive = {"--total-timesteps": args.total_timesteps, "--num-envs": args.num_envs, "--num-steps": args.num_steps,
                "--num-minibatches": args.num_minibatches, "--update-epochs": args.update_epochs,
                "--eval-episodes": args.eval_episodes}
    for flag, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise ConfigError(f"batch size num_envs * num_steps = {batch_size} is not divisible by "
                          f"--num-minibatches {args.num_minibatches}; pick a divisor of {batch_size}")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        raise ConfigError(f"minibatch size {batch_size // args.num_minibatches} is too small to normalize "
                          f"advantages; use at least 2 samples per minibatch or --no-norm-adv")
    if not args.eval_only and args.total_timesteps < batch_size:
        raise ConfigError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                          f"(num_envs * num_steps = {batch_size}); nothing would be trained")
    if args.eval_interval < 0:
        raise ConfigError(f"--eval-interval must be >= 0 (0: only the final evaluation), got {args.eval_interval}")
    if not 0.0 < args.gamma <= 1.0:
        raise ConfigError(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0.0 <= args.gae_lambda <= 1.0:
        raise ConfigError(f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    for flag, value in (("--learning-rate", args.learning_rate), ("--clip-coef", args.clip_coef),
                        ("--max-grad-norm", args.max_grad_norm)):
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0, got {value}")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        raise ConfigError(f"--hidden-sizes needs one or more positive widths, got {args.hidden_sizes}")
    env_id = resolve_env_id(args.env_id)
    if env_id not in gym.registry:
        raise ConfigError(f"unknown env id {args.env_id!r}; accepted: a registered gymnasium id with a Discrete "
                          f"action space (e.g. CartPole-v1, Acrobot-v1) or Probe1Discrete-v0 .. Probe5Discrete-v0")
    env = gym.make(env_id)
    action_space = env.action_space
    env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"{args.env_id!r} has a {type(action_space).__name__} action space but ppo_discrete.py "
                          f"needs a Discrete one; {NON_DISCRETE_HINT}")
    if args.capture_video:
        check_video(args.env_id, env_id, gl_backend)


def check_output_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--output-dir {output_dir!r} cannot be created ({e.strerror or e})") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {output_dir!r} is not writable")


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy_key": torch.from_numpy(np_state[1].astype(np.int64)),
            "numpy_pos": int(np_state[2]), "python": random.getstate()[1]}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_key"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    random.setstate((3, tuple(state["python"]), None))


def save_checkpoint(path: str, agent: Agent, optimizer: torch.optim.Optimizer, obs_rms: Optional[RunningMeanStd],
                    args: Args, global_step: int, iteration: int, eval_return: Optional[float]) -> None:
    """Atomic: write a temporary file, then rename it over ``path``."""
    ckpt = {
        "algo": SCRIPT, "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
        "obs_rms": obs_rms.state_dict() if obs_rms is not None else None,
        "args": dataclasses.asdict(args), "obs_dim": agent.actor[0].in_features,
        "num_actions": agent.actor[-1].out_features, "global_step": global_step, "iteration": iteration,
        "eval_return": eval_return, "rng": rng_state(),
    }
    tmp = f"{path}.tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


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
    return ckpt


# Resume and eval-only take the checkpoint's arguments, except these: how this run is run and logged.
RUN_FIELDS = ("exp_name", "cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "output_dir",
              "total_timesteps", "eval_interval", "eval_episodes", "checkpoint", "eval_only", "resume")


def args_with_checkpoint(args: Args, ckpt: dict) -> Args:
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items()
             if k in Args.__dataclass_fields__ and k not in RUN_FIELDS}
    return dataclasses.replace(args, **saved)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


class Progress:
    """One progress line per iteration; rewritten in place on a terminal, one line each in a log file."""

    def __init__(self, total: int):
        self.total, self.tty = total, sys.stdout.isatty()

    def update(self, step: int, sps: float, recent_return: float, eval_return: Optional[float], final: bool = False):
        eta = (self.total - step) / sps if sps > 0 else float("nan")
        line = (f"step {step}/{self.total} ({100 * step / self.total:.1f}%) | SPS {sps:.0f} | "
                f"ETA {format_duration(eta) if math.isfinite(eta) else '?'} | return {recent_return:.1f} | "
                f"eval {'-' if eval_return is None else f'{eval_return:.1f}'}")
        if self.tty:
            print(f"\r{line}\033[K", end="\n" if final else "", flush=True)
        else:
            print(line, flush=True)


def log_eval(writer: SummaryWriter, returns: np.ndarray, lengths: np.ndarray, step: int) -> None:
    for name, value in (("return_mean", returns.mean()), ("return_std", returns.std()),
                        ("return_min", returns.min()), ("return_max", returns.max()),
                        ("length_mean", lengths.mean())):
        writer.add_scalar(f"eval/{name}", float(value), step)


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------
def train(args: Args) -> dict:
    gl_backend = choose_gl_backend(args.capture_video)  # before anything imports mujoco
    if args.eval_only and not args.checkpoint:
        raise ConfigError("--eval-only needs --checkpoint PATH (a ppo_discrete_*.pt file)")
    source_path, flag = (args.checkpoint, "--checkpoint") if args.eval_only else (args.resume, "--resume")
    source = load_checkpoint(source_path, flag) if source_path else None
    if source is not None:
        args = args_with_checkpoint(args, source)
    if args.resume and args.total_timesteps // (args.num_envs * args.num_steps) <= source["iteration"]:
        raise ConfigError(f"--total-timesteps {args.total_timesteps} leaves nothing to train after the checkpoint's "
                          f"step {source['global_step']}; pass a larger total to continue")
    check_args(args, gl_backend)
    check_output_dir(args.output_dir)
    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.output_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    last_path, best_path = (os.path.join(run_dir, f"{SCRIPT}_{k}.pt") for k in ("last", "best"))

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.cuda and not torch.cuda.is_available():
        print("CUDA is not available; running on CPU")
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny MLPs: threading costs more than it saves

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=dataclasses.asdict(args), name=run_name, dir=run_dir, save_code=True)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items()))

    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    envs = make_vector_env(args, args.num_envs, args.seed)
    eval_envs = make_vector_env(args, args.eval_episodes, args.seed + 10_000, video_dir)
    eval_seed = args.seed + 10_000
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    num_actions = int(envs.single_action_space.n)

    agent = Agent(obs_dim, num_actions, args.hidden_sizes).to(device)
    optimizer = make_optimizer(agent, args)
    obs_rms = RunningMeanStd((obs_dim,)) if args.norm_obs else None
    global_step, start_iteration = 0, 0
    if source is not None:  # the checkpoint's own env and hyperparameters (args_with_checkpoint)
        agent = Agent.from_checkpoint(source).to(device)
        optimizer = make_optimizer(agent, args)
        if source["obs_rms"] is not None:
            obs_rms = RunningMeanStd((obs_dim,))
            obs_rms.load_state_dict(source["obs_rms"])
        global_step = source["global_step"]
        if args.resume:
            optimizer.load_state_dict(source["optimizer"])
            start_iteration = source["iteration"]
            set_rng_state(source["rng"])

    result = {"run_dir": run_dir, "global_step": global_step, "train_sps": 0.0, "best_eval_return": -math.inf}
    start_time = time.time()
    try:
        if args.eval_only:
            returns, lengths = evaluate(agent, eval_envs, obs_rms, device, eval_seed)
            log_eval(writer, returns, lengths, global_step)
            print(f"eval of {args.checkpoint}: return {returns.mean():.2f} ± {returns.std():.2f} "
                  f"over {len(returns)} episodes (length {lengths.mean():.1f})")
            result.update(final_eval_return=float(returns.mean()), final_eval_std=float(returns.std()),
                          best_eval_return=float(returns.mean()), wall_time=time.time() - start_time)
            return result
        result.update(_train_loop(args, agent, optimizer, obs_rms, envs, eval_envs, eval_seed, writer, device,
                                  global_step, start_iteration, last_path, best_path))
        result["wall_time"] = time.time() - start_time
        return result
    finally:
        envs.close()
        eval_envs.close()
        writer.close()
        if args.track:
            import wandb

            wandb.finish()


def _train_loop(args: Args, agent: Agent, optimizer: torch.optim.Optimizer, obs_rms: Optional[RunningMeanStd],
                envs: gym.vector.VectorEnv, eval_envs: gym.vector.VectorEnv, eval_seed: int, writer: SummaryWriter,
                device: torch.device, global_step: int, start_iteration: int, last_path: str, best_path: str) -> dict:
    T, N = args.num_steps, args.num_envs
    batch_size = T * N
    # LaTeX: U = \left\lfloor \frac{T_{total}}{N \cdot T} \right\rfloor
    num_iterations = args.total_timesteps // batch_size
    obs_shape = envs.single_observation_space.shape
    rollout = Rollout.empty(T, N, obs_shape)
    raw_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    if obs_rms is not None:
        obs_rms.update(raw_obs)
    recent_returns: deque[float] = deque(maxlen=20)
    best_return, last_eval = -math.inf, None
    train_time, trained_steps = 0.0, 0
    progress = Progress(args.total_timesteps)
    eval_returns = np.array([math.nan])

    def run_evaluation(step: int, iteration: int) -> np.ndarray:
        nonlocal best_return, last_eval
        returns, lengths = evaluate(agent, eval_envs, obs_rms, device, eval_seed)
        log_eval(writer, returns, lengths, step)
        last_eval = float(returns.mean())
        save_checkpoint(last_path, agent, optimizer, obs_rms, args, step, iteration, last_eval)
        if last_eval >= best_return:
            best_return = last_eval
            save_checkpoint(best_path, agent, optimizer, obs_rms, args, step, iteration, last_eval)
        return returns

    if start_iteration > 0:
        print(f"resuming {args.resume} at step {global_step} with its saved hyperparameters; training to step "
              f"{num_iterations * batch_size}")
    elif num_iterations * batch_size != args.total_timesteps:
        print(f"training to step {num_iterations * batch_size}: --total-timesteps {args.total_timesteps} "
              f"rounded down to whole rollouts of {batch_size} steps")
    # _last always holds the last completed update, so Ctrl-C at any point loses only unfinished work.
    done_iteration, done_step = start_iteration, global_step
    save_checkpoint(last_path, agent, optimizer, obs_rms, args, done_step, done_iteration, last_eval)
    try:
        for iteration in range(start_iteration + 1, num_iterations + 1):
            tick = time.time()
            if args.anneal_lr:
                # LaTeX: \alpha_u = \alpha_0 \left(1 - \frac{u - 1}{U}\right)
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)

            # ---- rollout -------------------------------------------------------------
            raw_obs, episodes = collect_rollout(agent, envs, raw_obs, obs_rms, device, rollout)
            for offset, episode_return, episode_length in episodes:
                recent_returns.append(episode_return)
                writer.add_scalar("charts/episodic_return", episode_return, global_step + offset)
                writer.add_scalar("charts/episodic_length", episode_length, global_step + offset)
            global_step += batch_size

            # ---- advantages ----------------------------------------------------------
            to_t = lambda x: torch.as_tensor(x, device=device)  # noqa: E731
            advantages, returns = compute_gae(to_t(rollout.rewards), to_t(rollout.values), to_t(rollout.next_values),
                                              to_t(rollout.terminated), to_t(rollout.truncated), args.gamma,
                                              args.gae_lambda)
            batch = {"obs": to_t(rollout.obs).reshape((batch_size,) + obs_shape),
                     "actions": to_t(rollout.actions).reshape(-1), "log_probs": to_t(rollout.log_probs).reshape(-1),
                     "values": to_t(rollout.values).reshape(-1), "advantages": advantages.reshape(-1),
                     "returns": returns.reshape(-1)}

            # ---- update --------------------------------------------------------------
            try:
                stats = ppo_update(agent, optimizer, batch, args)
            except TrainingDiverged as e:
                raise TrainingDiverged(f"{e} at global step {global_step}; stopped. Last good checkpoint: {last_path} "
                                    f"(step {done_step})") from None
            train_time += time.time() - tick
            trained_steps += batch_size
            done_iteration, done_step = iteration, global_step
            save_checkpoint(last_path, agent, optimizer, obs_rms, args, done_step, done_iteration, last_eval)
            sps = trained_steps / train_time

            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            for key, value in stats.items():
                writer.add_scalar(f"losses/{key}", value, global_step)
            writer.add_scalar("losses/explained_variance", explained_variance(batch["values"], batch["returns"]),
                              global_step)

            prev_step = global_step - batch_size
            if (args.eval_interval > 0 and global_step // args.eval_interval > prev_step // args.eval_interval
                    and iteration < num_iterations):
                run_evaluation(global_step, iteration)
            recent = float(np.mean(recent_returns)) if recent_returns else math.nan
            progress.update(global_step, sps, recent, last_eval)

        eval_returns = run_evaluation(global_step, done_iteration)
        progress.update(global_step, trained_steps / max(train_time, 1e-9),
                        float(np.mean(recent_returns)) if recent_returns else math.nan, last_eval, final=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last checkpoint, at step {done_step} (the last trained step), is {last_path}")
        raise
    return {"final_eval_return": float(eval_returns.mean()), "final_eval_std": float(eval_returns.std()),
            "best_eval_return": best_return, "global_step": global_step,
            "train_sps": trained_steps / max(train_time, 1e-9)}


if __name__ == "__main__":
    try:
        summary = train(tyro.cli(Args))
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except TrainingDiverged as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    print(f"final eval return {summary['final_eval_return']:.2f} ± {summary['final_eval_std']:.2f} | "
          f"best {summary['best_eval_return']:.2f} | {summary['global_step']} steps | "
          f"train SPS {summary['train_sps']:.0f} | run dir {summary['run_dir']}")

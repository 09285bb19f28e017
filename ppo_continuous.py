"""PPO for continuous actions: a diagonal Gaussian policy trained with the clipped surrogate and GAE.

Proximal Policy Optimization (Schulman et al., 2017, https://arxiv.org/abs/1707.06347) with
Generalized Advantage Estimation (Schulman et al., 2016, https://arxiv.org/abs/1506.02438).
The policy is a Gaussian with a state-dependent mean (an MLP) and a state-independent
log standard deviation; the critic is a separate MLP. Actions are sampled unbounded, stored
as sampled (the log-probability is of that action) and clipped only where they enter the env.
Episodes that end by truncation (every dm_control episode after 1000 steps) are bootstrapped
from the value of their real final observation; only termination has value 0.

Run it:

    python ppo_continuous.py --env-id dm_control/walker/walk
    python ppo_continuous.py --env-id dm_control/cartpole/swingup --total-timesteps 500000
    python ppo_continuous.py --eval-only --checkpoint runs/<run>/ppo_continuous_best.pt --capture-video

`--help` lists every option. The annotated math lives in `docs/ppo_continuous.md` (the whole
file with each `# LaTeX:` formula rendered inline) and `docs/ppo_continuous_annotations.md`
(each formula with the code around it).
"""

from __future__ import annotations

import ast
import ctypes
import math
import os
import random
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    exp_name: str = "ppo_continuous"
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when it is available (falls back to CPU and says so once)"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """record one episode of every evaluation as mp4 under `<run_dir>/videos/` (slow with CPU rendering)"""
    env_id: str = "dm_control/walker/walk"
    """gymnasium id, `dm_control/<domain>-<task>-v0`, `dm_control/<domain>/<task>` or a `Probe<k>Continuous-v0`"""
    total_timesteps: int = 1_000_000
    """total environment steps of training (summed over the parallel envs)"""
    num_envs: int = 8
    """number of parallel training environments (one process, stepped in turn)"""
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
    optimizer: str = "adam"
    """optimizer: `adam` (eps 1e-5) or `sgd` (with --sgd-momentum)"""
    sgd_momentum: float = 0.9
    """momentum of the `sgd` optimizer"""
    num_minibatches: int = 8
    """number of minibatches the batch is split into per epoch"""
    update_epochs: int = 10
    """passes over the batch per update"""
    norm_adv: bool = True
    """normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient epsilon (also the value clipping range with --clip-vloss)"""
    clip_vloss: bool = False
    """clip the value loss around the rollout's value predictions"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """maximum global norm of the gradient"""
    target_kl: Optional[float] = None
    """stop the update's epochs early once the epoch's mean approximate KL exceeds this"""
    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the policy-mean MLP"""
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the value MLP (256x256 lifted walker/walk from 399 to 491 and swingup from 712 to 852)"""
    init_log_std: float = -0.5
    """initial log standard deviation of the Gaussian policy (-0.5: std 0.61 on actions in [-1, 1])"""
    normalize_obs: bool = True
    """normalize observations by one running mean/std shared by all training envs (clipped to [-10, 10])"""
    reward_scaling: bool = True
    """divide rewards by the running std of the discounted return (the learner only; logs show raw returns). On by
    default: with the 256x256 critic it gave swingup 851.9 against 785.0 and walker 491.3 against 468.9 (benchmarks/README.md)"""
    output_dir: str = "runs"
    """the run directory is `<output_dir>/<run_name>` (TensorBoard events, checkpoints, videos)"""
    eval_interval: int = 50_000
    """environment steps between deterministic evaluations (0 = only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel, one per eval env)"""
    checkpoint: Optional[str] = None
    """checkpoint to evaluate with --eval-only (and record with --capture-video)"""
    eval_only: bool = False
    """evaluate --checkpoint without training"""
    resume: Optional[str] = None
    """continue training from this checkpoint to --total-timesteps, in a new run dir, with its saved env and hyperparameters"""


class ConfigError(ValueError):
    """Bad input, reported as one line before any heavy work."""


class TrainingDiverged(RuntimeError):
    """A loss became NaN or inf; the run stops without overwriting the last good checkpoint."""


SCRIPT = "ppo_continuous"


# ---------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------

DM_CONTROL_FORMS = "dm_control/<domain>/<task> or dm_control/<domain>-<task>-v0 (e.g. dm_control/walker/walk)"


def resolve_env_id(env_id: str) -> str:
    """Map `dm_control/<domain>/<task>` to shimmy's `dm_control/<domain>-<task>-v0`; check it exists."""
    if env_id.startswith("dm_control/"):
        import shimmy  # registers the dm_control/* ids with gymnasium

        gym.register_envs(shimmy)
        if env_id in gym.registry:
            return env_id
        rest = env_id[len("dm_control/"):]
        parts = rest.split("/")
        if len(parts) == 2 and all(parts):
            domain, task = parts
        elif len(parts) == 1 and rest.endswith("-v0") and rest.count("-") == 2 and all(rest[:-3].split("-")):
            domain, task = rest[:-3].split("-")
        else:
            raise ConfigError(f"malformed dm_control id {env_id!r}; accepted forms: {DM_CONTROL_FORMS}")
        from dm_control import suite

        if domain not in suite.TASKS_BY_DOMAIN:
            raise ConfigError(f"unknown dm_control domain {domain!r} in {env_id!r}; valid domains: "
                              f"{', '.join(sorted(suite.TASKS_BY_DOMAIN))}")
        if task not in suite.TASKS_BY_DOMAIN[domain]:
            raise ConfigError(f"unknown task {task!r} for dm_control domain {domain!r}; valid tasks: "
                              f"{', '.join(suite.TASKS_BY_DOMAIN[domain])}")
        return f"dm_control/{domain}-{task}-v0"
    if env_id.startswith("Probe"):
        import probe_envs  # noqa: F401  (registers the probe ids; only needed for them)
    if env_id not in gym.registry:
        raise ConfigError(f"unknown env id {env_id!r}; accepted: a registered gymnasium id, {DM_CONTROL_FORMS}, "
                          "or Probe<1-5>Continuous-v0")
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
    """Write the next episode after `start(name)` to `<video_dir>/<name>.mp4` (rendered rgb frames)."""

    def __init__(self, env: gym.Env, video_dir: str):
        super().__init__(env)
        self.video_dir, self.name, self.frames = video_dir, None, []
        dt = getattr(env.unwrapped, "dt", None)
        self.fps = round(1.0 / dt) if dt else env.metadata.get("render_fps", 30)

    def start(self, name: str) -> None:
        self.name, self.frames = name, []

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        if self.name is not None:
            self.frames = [self.env.render()]
        return out

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.name is not None:
            self.frames.append(self.env.render())
            if terminated or truncated:
                import imageio

                os.makedirs(self.video_dir, exist_ok=True)
                imageio.mimsave(os.path.join(self.video_dir, f"{self.name}.mp4"), self.frames, fps=self.fps,
                                macro_block_size=1)
                self.name, self.frames = None, []
        return obs, reward, terminated, truncated, info


def make_env(env_id: str, render: bool = False, video_dir: Optional[str] = None):
    """A thunk building one env: flat float observations, episode statistics, optional video."""

    def thunk() -> gym.Env:
        env = gym.make(resolve_env_id(env_id), **({"render_mode": "rgb_array"} if render else {}))
        if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict observations
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if video_dir is not None:
            env = RecordEpisodeVideo(env, video_dir)
        return env

    return thunk


class RunningMeanStd:
    """Running mean and variance (float64) of a stream of batches (Chan et al.'s parallel update)."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        # LaTeX: \mu \leftarrow \mu + \delta \frac{n_b}{n + n_b}, \quad \sigma^2 \leftarrow \frac{n \sigma^2 + n_b \sigma_b^2 + \delta^2 \frac{n n_b}{n + n_b}}{n + n_b}
        self.mean, self.var = (self.mean + delta * n / total,
                               (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total)
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": torch.tensor(self.mean, dtype=torch.float64), "var": torch.tensor(self.var, dtype=torch.float64),
                "count": float(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var = np.array(state["mean"].numpy()), np.array(state["var"].numpy())
        self.count = float(state["count"])


class SharedNormalizeObservation(gym.vector.VectorWrapper):
    """One running normalizer shared by all envs of a vector env; `infos["final_obs"]` normalized too.

    Written here because gymnasium's vector normalizers refuse SAME_STEP autoreset and never touch
    `final_obs`. `final_obs` becomes a dense float32 array (rows valid where `infos["_final_obs"]`).
    `frozen` stops the statistics from updating (evaluation); `enabled=False` only casts to float32.
    """

    def __init__(self, env: gym.vector.VectorEnv, enabled: bool = True, clip: float = 10.0,
                 seed: Optional[int] = None):
        super().__init__(env)
        self.enabled, self.clip, self.frozen = enabled, clip, False
        self.first_seed = seed  # used by the first reset that names no seed: env i gets seed + i
        self.obs_rms = RunningMeanStd(env.single_observation_space.shape)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return obs.astype(np.float32)
        # LaTeX: \tilde{o} = \operatorname{clip}\left(\frac{o - \mu}{\sqrt{\sigma^2 + 10^{-8}}}, -10, 10\right)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -self.clip, self.clip).astype(np.float32)

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        if self.enabled and not self.frozen:
            self.obs_rms.update(obs)
        return self.normalize(obs)

    def reset(self, *, seed=None, options=None):
        seed, self.first_seed = (self.first_seed if seed is None else seed), None
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._observe(obs), infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        obs = self._observe(obs)
        if "final_obs" in infos:
            mask = infos["_final_obs"]
            final_obs = np.zeros(obs.shape, np.float32)
            final_obs[mask] = self.normalize(np.stack(infos["final_obs"][mask]))
            infos["final_obs"] = final_obs
        return obs, rewards, terminations, truncations, infos


def make_vector_env(args: Args, num_envs: int, seed: int, video_dir: Optional[str] = None) -> SharedNormalizeObservation:
    """The training (or evaluation) vector env with every wrapper; `video_dir` records env 0's episodes.

    SAME_STEP autoreset: the step that ends an episode returns the next episode's first
    observation and puts the real final one in `infos["final_obs"]`, so no reset step is wasted.
    """
    thunks = [make_env(args.env_id, render=(video_dir is not None and i == 0), video_dir=video_dir if i == 0 else None)
              for i in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return SharedNormalizeObservation(envs, enabled=args.normalize_obs, seed=seed)


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------

LOG_2PI = math.log(2.0 * math.pi)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2.0), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    layers, last = [], in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(last, size)), nn.Tanh()]
        last = size
    return nn.Sequential(*layers, layer_init(nn.Linear(last, out_dim), std=out_std))


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over action dimensions."""
    # LaTeX: \log \pi_\theta(a_t \mid s_t) = -\sum_{j} \left( \frac{(a_{t,j} - \mu_{t,j})^2}{2 \sigma_j^2} + \log \sigma_j + \frac{1}{2} \log 2\pi \right)
    return -(((action - mean) * torch.exp(-log_std)).pow(2).mul(0.5) + log_std + 0.5 * LOG_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of the diagonal Gaussian; the std is state-independent, so so is the entropy."""
    # LaTeX: \mathcal{H}[\pi_\theta(\cdot \mid s_t)] = \sum_j \left( \log \sigma_j + \frac{1}{2} \log (2 \pi e) \right)
    return (log_std + 0.5 * (LOG_2PI + 1.0)).sum(-1)


class Agent(nn.Module):
    """Separate actor (Gaussian mean) and critic MLPs, orthogonal init, state-independent log-std."""

    def __init__(self, obs_dim: int, act_dim: int, actor_hidden_sizes: tuple[int, ...] = (64, 64),
                 critic_hidden_sizes: tuple[int, ...] = (64, 64), init_log_std: float = 0.0):
        super().__init__()
        self.critic = mlp(obs_dim, tuple(critic_hidden_sizes), 1, out_std=1.0)
        # A near-zero last layer starts the mean at ~0 for every state (Andrychowicz et al., 2021).
        self.actor_mean = mlp(obs_dim, tuple(actor_hidden_sizes), act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)


class RolloutPolicy:
    """A numpy snapshot of the agent for the rollout's one-observation-at-a-time inference.

    The hot path of the rollout: on a CPU a few numpy matrix products cost a fraction of the
    same torch calls (no autograd, no dispatcher, no distribution objects). `sync` refreshes the
    snapshot after every update. Noise comes from numpy's global RNG (saved in checkpoints).
    """

    def __init__(self, agent: Agent):
        self.sync(agent)

    def sync(self, agent: Agent) -> None:
        def layers(net: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy())
                    for m in net if isinstance(m, nn.Linear)]

        self.actor, self.critic = layers(agent.actor_mean), layers(agent.critic)
        self.log_std = agent.actor_logstd.detach().cpu().numpy().astype(np.float32)
        self.std = np.exp(self.log_std)

    @staticmethod
    def mlp(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
        for weight, bias in layers[:-1]:
            x = np.tanh(x @ weight + bias)
        weight, bias = layers[-1]
        return x @ weight + bias

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.mlp(self.critic, obs)[:, 0]

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled action (unclipped), its log-prob and V(s) for a (N, obs_dim) float32 batch."""
        mean = self.mlp(self.actor, obs)
        noise = np.random.standard_normal(mean.shape).astype(np.float32)
        # LaTeX: a_t = \mu_\theta(s_t) + \sigma \odot \xi_t, \quad \xi_t \sim \mathcal{N}(0, I)
        action = mean + self.std * noise
        # gaussian_log_prob's density written with the noise, since (a - mu) / sigma = xi.
        # LaTeX: \log \pi_\theta(a_t \mid s_t) = -\frac{1}{2} \lVert \xi_t \rVert^2 - \sum_j \log \sigma_j - \frac{d}{2} \log 2\pi
        logprob = -0.5 * np.square(noise).sum(-1) - (self.log_std.sum() + 0.5 * LOG_2PI * mean.shape[-1])
        return action, logprob, self.value(obs)


# ---------------------------------------------------------------------------------------------
# Advantages and targets
# ---------------------------------------------------------------------------------------------

def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a (T, N) rollout; `next_values[t]` is V of the real successor of step t.

    The successor is the final observation where an episode ended (so truncation bootstraps
    from it); a terminated successor is worth 0 and no advantage flows across an episode end.
    """
    not_done = 1.0 - torch.maximum(terminated, truncated)
    # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last = deltas[t] + gamma * gae_lambda * not_done[t] * last
        advantages[t] = last
    # LaTeX: \hat{R}_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var(unbiased=False).item()
    # LaTeX: \mathrm{EV} = 1 - \frac{\operatorname{Var}[\hat{R} - V]}{\operatorname{Var}[\hat{R}]}
    return float("nan") if var_returns == 0 else 1.0 - (returns - values).var(unbiased=False).item() / var_returns


# ---------------------------------------------------------------------------------------------
# Losses and update
# ---------------------------------------------------------------------------------------------

def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    # LaTeX: \tilde{A}_t = \frac{\hat{A}_t - \operatorname{mean}(\hat{A})}{\operatorname{std}(\hat{A}) + 10^{-8}}
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def clipped_surrogate_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    # LaTeX: L^{\mathrm{CLIP}} = -\mathbb{E}_t\left[\min\left(\rho_t \hat{A}_t, \operatorname{clip}(\rho_t, 1 - \epsilon, 1 + \epsilon) \hat{A}_t\right)\right]
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef) * advantages).mean()


def value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_coef: float,
               clip_vloss: bool) -> torch.Tensor:
    if not clip_vloss:
        # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[(V_\theta(s_t) - \hat{R}_t)^2\right]
        return 0.5 * (new_values - returns).pow(2).mean()
    # LaTeX: V^{\mathrm{clip}}_t = V_{\theta_\mathrm{old}}(s_t) + \operatorname{clip}(V_\theta(s_t) - V_{\theta_\mathrm{old}}(s_t), -\epsilon, \epsilon)
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[\max\left((V_\theta(s_t) - \hat{R}_t)^2, (V^{\mathrm{clip}}_t - \hat{R}_t)^2\right)\right]
    return 0.5 * torch.max((new_values - returns).pow(2), (clipped_values - returns).pow(2)).mean()


def approx_kl(logratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two estimators of KL(pi_old || pi) from samples of pi_old (http://joschu.net/blog/kl-approx.html)."""
    # LaTeX: \widehat{\mathrm{KL}}_1 = \mathbb{E}_t\left[-\log \rho_t\right]
    old_kl = (-logratio).mean()
    # LaTeX: \widehat{\mathrm{KL}}_3 = \mathbb{E}_t\left[(\rho_t - 1) - \log \rho_t\right]
    new_kl = (torch.exp(logratio) - 1.0 - logratio).mean()
    return old_kl, new_kl


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float) -> None:
    """In-place global-norm clipping; a leaner path than nn.utils.clip_grad_norm_ for many tiny tensors."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    # LaTeX: g \leftarrow g \cdot \min\left(1, \frac{c_{\max}}{\lVert g \rVert_2 + 10^{-6}}\right)
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def make_optimizer(args: Args, params) -> torch.optim.Optimizer:
    params = list(params)
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.learning_rate, momentum=args.sgd_momentum, foreach=True)
    # The fused kernel runs all parameter updates in one call: cheap for small minibatches on CPU.
    return torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5, fused=True)


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], args: Args) -> dict:
    """Epochs of minibatch gradient steps on the clipped surrogate; returns diagnostics (means over minibatches).

    `batch` holds flat (B, ...) tensors. They are packed into one (B, columns) tensor so that each
    epoch shuffles with a single gather and each minibatch is a contiguous slice: on a CPU the
    per-operation overhead, not the arithmetic, is what costs. Raises FloatingPointError before
    stepping on a non-finite loss.
    """
    names = ("obs", "actions", "logprobs", "advantages", "returns", "values")
    columns = [batch[k].reshape(batch["obs"].shape[0], -1) for k in names]  # every column block 2-D, (B, width)
    packed, widths = torch.cat(columns, 1), [c.shape[1] for c in columns]
    minibatch_size = packed.shape[0] // args.num_minibatches
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses, logratios = [], []  # detached, per minibatch: the diagnostics are computed once at the end
    for epoch in range(args.update_epochs):
        shuffled = packed[torch.randperm(packed.shape[0], device=packed.device)]
        for minibatch in shuffled.split(minibatch_size):
            obs, actions, old_logprob, advantages, returns, old_values = minibatch.split(widths, dim=1)
            new_logprob = gaussian_log_prob(agent.actor_mean(obs), agent.actor_logstd, actions).unsqueeze(1)
            # LaTeX: \log \rho_t = \log \pi_\theta(a_t \mid s_t) - \log \pi_{\theta_\mathrm{old}}(a_t \mid s_t)
            logratio = new_logprob - old_logprob
            # LaTeX: \rho_t = \exp(\log \rho_t)
            ratio = torch.exp(logratio)
            if args.norm_adv:
                advantages = normalize_advantages(advantages)
            pg_loss = clipped_surrogate_loss(ratio, advantages, args.clip_coef)
            v_loss = value_loss(agent.critic(obs), old_values, returns, args.clip_coef, args.clip_vloss)
            entropy = gaussian_entropy(agent.actor_logstd)
            # LaTeX: L = L^{\mathrm{CLIP}} - c_H \mathcal{H}[\pi_\theta] + c_V L^{V}
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss (policy {pg_loss.item()}, value {v_loss.item()})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip_grad_norm([p.grad for p in params], args.max_grad_norm)
            optimizer.step()
            losses.append(torch.stack([pg_loss, v_loss, entropy]).detach())
            logratios.append(logratio.detach())
        if args.target_kl is not None and approx_kl(torch.cat(logratios[-args.num_minibatches:]))[1] > args.target_kl:
            break  # this epoch's mean KL estimate is past the target
    policy_loss, v_loss, entropy = torch.stack(losses).mean(0).tolist()
    old_kl, kl = approx_kl(torch.cat(logratios))
    clipfrac = (torch.cat(logratios).exp().sub(1.0).abs() > args.clip_coef).float().mean()
    return {"policy_loss": policy_loss, "value_loss": v_loss, "entropy": entropy, "old_approx_kl": old_kl.item(),
            "approx_kl": kl.item(), "clipfrac": clipfrac.item(), "epochs": epoch + 1}


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

def evaluate(agent: Agent, envs: SharedNormalizeObservation, seed: int, device: torch.device,
             video_name: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """One episode per eval env with the deterministic policy (the Gaussian mean); frozen statistics."""
    envs.frozen = True
    if video_name is not None:
        envs.env.envs[0].get_wrapper_attr("start")(video_name)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset(seed=seed)
    returns, lengths = np.full(envs.num_envs, np.nan), np.zeros(envs.num_envs)
    while np.isnan(returns).any():
        with torch.inference_mode():
            action = agent.actor_mean(torch.from_numpy(obs).to(device)).cpu().numpy()
        obs, _, _, _, infos = envs.step(np.clip(action, low, high))
        if "final_info" in infos and "_episode" in infos["final_info"]:
            first = infos["final_info"]["_episode"] & np.isnan(returns)
            returns[first] = infos["final_info"]["episode"]["r"][first]
            lengths[first] = infos["final_info"]["episode"]["l"][first]
    return returns, lengths


def log_eval(writer: SummaryWriter, returns: np.ndarray, lengths: np.ndarray, step: int) -> dict:
    stats = {"return_mean": float(returns.mean()), "return_std": float(returns.std()),
             "return_min": float(returns.min()), "return_max": float(returns.max()),
             "length_mean": float(lengths.mean())}
    for name, value in stats.items():
        writer.add_scalar(f"eval/{name}", value, step)
    return stats


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------

def save_checkpoint(path: Path, agent: Agent, optimizer: torch.optim.Optimizer, envs: SharedNormalizeObservation,
                    reward_rms: RunningMeanStd, args: Args, global_step: int, iteration: int,
                    best_eval_return: float) -> None:
    """Atomic write (temporary file, then os.replace); loadable with torch.load(weights_only=True)."""
    np_state = np.random.get_state()
    state = {
        "algo": SCRIPT, "agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
        "obs_rms": envs.obs_rms.state_dict(), "reward_rms": reward_rms.state_dict(),
        "args": asdict(args), "global_step": global_step, "iteration": iteration,
        "best_eval_return": best_eval_return,
        "rng": {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
                "numpy_pos": int(np_state[2]), "numpy_gauss": (int(np_state[3]), float(np_state[4])),
                "python": repr(random.getstate())},
    }
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
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
    return replace(args, **saved)


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    np.random.set_state(("MT19937", rng["numpy"].numpy().astype(np.uint32), rng["numpy_pos"], *rng["numpy_gauss"]))
    random.setstate(ast.literal_eval(rng["python"]))


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def check_args(args: Args, gl_backend: Optional[str]) -> None:
    """Reject impossible settings with one line, before any heavy work."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes",
                "learning_rate", "clip_coef", "max_grad_norm")
    for name in positive:
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise ConfigError(f"--num-minibatches {args.num_minibatches} must divide the batch num_envs * num_steps = "
                          f"{batch_size}")
    if args.total_timesteps < batch_size:
        raise ConfigError(f"--total-timesteps {args.total_timesteps} is less than one batch (num_envs * num_steps = "
                          f"{batch_size})")
    if not 0.0 < args.gamma <= 1.0:
        raise ConfigError(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0.0 <= args.gae_lambda <= 1.0:
        raise ConfigError(f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    if args.optimizer not in ("adam", "sgd"):
        raise ConfigError(f"--optimizer must be one of: adam, sgd; got {args.optimizer!r}")
    if not 0.0 <= args.sgd_momentum < 1.0:
        raise ConfigError(f"--sgd-momentum must be in [0, 1), got {args.sgd_momentum}")
    for name in ("ent_coef", "vf_coef"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.target_kl is not None and args.target_kl <= 0:
        raise ConfigError(f"--target-kl must be > 0 (or left unset), got {args.target_kl}")
    if args.eval_interval < 0:
        raise ConfigError(f"--eval-interval must be >= 0 (0 = only the final evaluation), got {args.eval_interval}")
    for name in ("actor_hidden_sizes", "critic_hidden_sizes"):
        if not getattr(args, name) or min(getattr(args, name)) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be one or more positive sizes, got {getattr(args, name)}")
    check_env(args.env_id)
    if args.capture_video:
        check_video(args.env_id, resolve_env_id(args.env_id), gl_backend)


def check_output_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--output-dir {output_dir!r} cannot be created ({e.strerror or e})") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {output_dir!r} is not writable")


def check_env(env_id: str) -> None:
    """The env id resolves and has a Box action space (one env is built and closed)."""
    env = gym.make(resolve_env_id(env_id))
    space = env.action_space
    env.close()
    if isinstance(space, gym.spaces.Discrete):
        raise ConfigError(f"{env_id} has a Discrete action space; this script needs Box actions: use ppo_discrete.py")
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(f"{env_id} has a {type(space).__name__} action space; this script needs a Box action space")


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def train(args: Args) -> dict:
    gl_backend = choose_gl_backend(args.capture_video)  # before anything imports mujoco
    if args.eval_only and args.checkpoint is None:
        raise ConfigError("--eval-only needs --checkpoint PATH")
    ckpt = None
    if args.eval_only or args.resume:
        ckpt = load_checkpoint(*((args.checkpoint, "--checkpoint") if args.eval_only else (args.resume, "--resume")))
        args = args_with_checkpoint(args, ckpt)  # the checkpoint's hyperparameters and env
    if args.resume and args.total_timesteps // (args.num_envs * args.num_steps) <= ckpt["iteration"]:
        raise ConfigError(f"--total-timesteps {args.total_timesteps} leaves nothing to train after the checkpoint's "
                          f"step {ckpt['global_step']}; pass a larger total to continue")
    check_args(args, gl_backend)
    check_output_dir(args.output_dir)
    batch_size = args.num_envs * args.num_steps
    final_step = args.total_timesteps // batch_size * batch_size  # whole rollouts only

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(1)  # tiny MLPs: one thread is fastest and leaves the other cores to the envs
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    if args.cuda and device.type == "cpu":
        print("CUDA is not available; running on CPU")

    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = Path(args.output_dir) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=asdict(args), name=run_name, dir=str(run_dir), save_code=True)
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))
    video_dir = str(run_dir / "videos") if args.capture_video else None
    stem = Path(__file__).stem
    last_path, best_path = run_dir / f"{stem}_last.pt", run_dir / f"{stem}_best.pt"

    eval_envs = make_vector_env(args, args.eval_episodes, args.seed + 10_000, video_dir=video_dir)
    envs = None if args.eval_only else make_vector_env(args, args.num_envs, args.seed)
    obs_dim = int(np.prod(eval_envs.single_observation_space.shape))
    act_dim = int(np.prod(eval_envs.single_action_space.shape))
    agent = Agent(obs_dim, act_dim, args.actor_hidden_sizes, args.critic_hidden_sizes, args.init_log_std).to(device)
    optimizer = make_optimizer(args, agent.parameters())
    obs_rms = envs.obs_rms if envs is not None else RunningMeanStd(eval_envs.single_observation_space.shape)
    reward_rms = RunningMeanStd()
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        obs_rms.load_state_dict(ckpt["obs_rms"])

    def run_eval(step: int) -> dict:
        eval_envs.obs_rms.load_state_dict(obs_rms.state_dict())  # a frozen copy of the training statistics
        name = f"eval_step{step}" if video_dir is not None else None
        returns, lengths = evaluate(agent, eval_envs, args.seed + 10_000, device, video_name=name)
        return log_eval(writer, returns, lengths, step)

    try:
        if args.eval_only:
            stats = run_eval(ckpt["global_step"])
            print(f"eval of {args.checkpoint} (step {ckpt['global_step']}) on {args.env_id}: return "
                  f"{stats['return_mean']:.1f} ± {stats['return_std']:.1f} (min {stats['return_min']:.1f}, max "
                  f"{stats['return_max']:.1f}), length {stats['length_mean']:.0f}"
                  + (f"; videos in {video_dir}" if video_dir else ""))
            return {"final_eval_return": stats["return_mean"], "final_eval_std": stats["return_std"],
                    "best_eval_return": stats["return_mean"], "global_step": ckpt["global_step"], "wall_time": 0.0,
                    "train_sps": 0.0, "run_dir": str(run_dir)}
        global_step, start_iteration, best_eval_return = 0, 0, -math.inf
        if ckpt is not None:
            optimizer.load_state_dict(ckpt["optimizer"])
            reward_rms.load_state_dict(ckpt["reward_rms"])
            global_step, start_iteration = ckpt["global_step"], ckpt["iteration"]
            best_eval_return = ckpt["best_eval_return"]
            restore_rng(ckpt["rng"])
            print(f"resuming {args.resume} at step {global_step} with its saved hyperparameters; training to step "
                  f"{final_step}")
        elif final_step != args.total_timesteps:
            print(f"training to step {final_step}: --total-timesteps {args.total_timesteps} rounded down to whole "
                  f"rollouts of {batch_size} steps")
        summary = run_training(args, agent, optimizer, envs, reward_rms, writer, device, run_eval, last_path,
                               best_path, global_step, start_iteration, best_eval_return)
        return {**summary, "run_dir": str(run_dir)}
    finally:
        for e in (envs, eval_envs):
            if e is not None:
                e.close()
        writer.close()
        if args.track:
            import wandb

            wandb.finish()


def run_training(args: Args, agent: Agent, optimizer: torch.optim.Optimizer, envs: SharedNormalizeObservation,
                 reward_rms: RunningMeanStd, writer: SummaryWriter, device: torch.device, run_eval, last_path: Path,
                 best_path: Path, global_step: int, start_iteration: int, best_eval_return: float) -> dict:
    """The rollout / update loop from `start_iteration`; saves `_last` every iteration, `_best` at evaluations."""
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    T, N = args.num_steps, args.num_envs
    # Rollout storage in numpy (the env speaks numpy); one conversion to torch per iteration.
    obs_buf = np.zeros((T, N, int(np.prod(envs.single_observation_space.shape))), np.float32)
    actions_buf = np.zeros((T, N, int(np.prod(envs.single_action_space.shape))), np.float32)
    logprobs, rewards, values, next_values, terminations, truncations = (np.zeros((T, N), np.float32) for _ in range(6))
    low, high = envs.single_action_space.low, envs.single_action_space.high
    discounted_return = np.zeros(N)  # of the current episodes, for reward scaling
    recent_returns, last_eval = deque(maxlen=20), None
    policy = RolloutPolicy(agent)

    def save(path: Path, iteration: int) -> None:
        if not all(torch.isfinite(p).all() for p in agent.parameters()):
            raise TrainingDiverged(f"non-finite weights at global step {global_step}")
        save_checkpoint(path, agent, optimizer, envs, reward_rms, args, global_step, iteration, best_eval_return)

    # Resuming: the new episodes' first observations must not move the restored statistics.
    envs.frozen = start_iteration > 0
    next_obs, _ = envs.reset(seed=None if start_iteration == 0 else args.seed + start_iteration * N)
    envs.frozen = False
    save(last_path, start_iteration)  # _last always holds the last completed update
    train_time, start_step, saved_iteration = 0.0, global_step, start_iteration
    try:
        for iteration in range(start_iteration + 1, num_iterations + 1):
            t0 = time.perf_counter()
            episode_returns, episode_lengths = [], []  # of the episodes that end in this rollout
            if args.anneal_lr:
                # LaTeX: \alpha_u = \alpha_0 \left(1 - \frac{u - 1}{U}\right)
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
            for step in range(T):
                obs_buf[step] = next_obs
                actions_buf[step], logprobs[step], values[step] = policy.act(next_obs)
                next_obs, reward, terminated, truncated, infos = envs.step(np.clip(actions_buf[step], low, high))
                global_step += N
                done = terminated | truncated
                if args.reward_scaling:
                    # LaTeX: G_t = \gamma G_{t-1} (1 - \mathrm{done}_{t-1}) + r_t, \quad \tilde{r}_t = r_t / \sqrt{\operatorname{Var}[G] + 10^{-8}}
                    discounted_return = discounted_return * args.gamma + reward
                    reward_rms.update(discounted_return)
                    reward = reward / np.sqrt(reward_rms.var + 1e-8)
                    discounted_return[done] = 0.0
                rewards[step], terminations[step], truncations[step] = reward, terminated, truncated
                if done.any():
                    # V of the real final observation: the bootstrap of a truncated step.
                    next_values[step] = np.where(done, policy.value(infos["final_obs"]), 0.0)
                    finished = infos["final_info"].get("_episode", np.zeros(N, bool))
                    episode_returns.extend(infos["final_info"]["episode"]["r"][finished].tolist())
                    episode_lengths.extend(infos["final_info"]["episode"]["l"][finished].tolist())
            # V(s_{t+1}) is the next stored value unless the episode ended at t (then V of its final obs).
            following = np.concatenate([values[1:], policy.value(next_obs)[None]])
            successor_values = np.where((terminations > 0) | (truncations > 0), next_values, following)
            to_torch = lambda x: torch.from_numpy(x).to(device)
            advantages, returns = compute_gae(to_torch(rewards), to_torch(values), to_torch(successor_values),
                                              to_torch(terminations), to_torch(truncations), args.gamma, args.gae_lambda)
            batch = {"obs": to_torch(obs_buf).reshape(batch_size, -1),
                     "actions": to_torch(actions_buf).reshape(batch_size, -1), "logprobs": to_torch(logprobs).reshape(-1),
                     "advantages": advantages.reshape(-1), "returns": returns.reshape(-1),
                     "values": to_torch(values).reshape(-1)}
            try:
                stats = ppo_update(agent, optimizer, batch, args)
            except FloatingPointError as e:
                raise TrainingDiverged(f"{e} at global step {global_step}") from None
            policy.sync(agent)
            save(last_path, iteration)  # before logging: Ctrl-C from here on keeps this update
            saved_iteration = iteration
            stats["explained_variance"] = explained_variance(batch["values"], batch["returns"])
            train_time += time.perf_counter() - t0
            sps = (global_step - start_step) / train_time

            if episode_returns:  # one point per iteration: tiny-episode envs would otherwise flood the log
                recent_returns.extend(episode_returns)
                writer.add_scalar("charts/episodic_return", np.mean(episode_returns), global_step)
                writer.add_scalar("charts/episodic_length", np.mean(episode_lengths), global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/action_std", agent.actor_logstd.exp().mean().item(), global_step)
            for name, value in stats.items():
                writer.add_scalar(f"losses/{name}", value, global_step)

            is_last = iteration == num_iterations
            if args.eval_interval > 0 and not is_last and \
                    global_step // args.eval_interval > (global_step - batch_size) // args.eval_interval:
                last_eval = run_eval(global_step)["return_mean"]
                if last_eval > best_eval_return:
                    best_eval_return = last_eval
                    save(best_path, iteration)
                save(last_path, iteration)  # records the new best eval return
            ret = f"{np.mean(recent_returns):.1f}" if recent_returns else "-"
            ev = f" | eval {last_eval:.1f}" if last_eval is not None else ""
            print(f"step {global_step}/{args.total_timesteps} ({100 * global_step / args.total_timesteps:.1f}%) | "
                  f"SPS {sps:.0f} | ETA {format_duration((args.total_timesteps - global_step) / max(sps, 1e-8))} | "
                  f"return {ret}{ev}", flush=True)
    except TrainingDiverged as e:
        raise TrainingDiverged(f"{e}; stopped. Last good checkpoint: {last_path}") from None
    except KeyboardInterrupt:
        # _last already holds the state of the last completed iteration (an interrupted update is dropped).
        print(f"\ninterrupted; the last checkpoint, at step {saved_iteration * batch_size} (the last trained step), is "
              f"{last_path}", flush=True)
        raise

    stats = run_eval(global_step)
    if stats["return_mean"] > best_eval_return:
        best_eval_return = stats["return_mean"]
        save(best_path, num_iterations)
    save(last_path, num_iterations)
    print(f"final eval at step {global_step}: return {stats['return_mean']:.1f} ± {stats['return_std']:.1f}; "
          f"checkpoints in {last_path.parent}", flush=True)
    return {"final_eval_return": stats["return_mean"], "final_eval_std": stats["return_std"],
            "best_eval_return": best_eval_return, "global_step": global_step, "wall_time": train_time,
            "train_sps": (global_step - start_step) / max(train_time, 1e-8)}


if __name__ == "__main__":
    try:
        train(tyro.cli(Args))
    except (ConfigError, TrainingDiverged) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)

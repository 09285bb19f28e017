"""V-MPO for continuous control with a tanh-squashed Gaussian policy, in one file.

V-MPO (Song et al., 2019, "V-MPO: On-Policy Maximum a Posteriori Policy Optimization
for Discrete and Continuous Control", https://arxiv.org/abs/1909.12238) is an
on-policy EM-style algorithm. Each iteration collects a rollout, then:

* E-step: normalize the advantages, keep the top fraction rho of them, and give each
  kept sample a weight psi proportional to exp(A / eta). The temperature eta is a
  Lagrange multiplier, trained by one step on its dual loss so that the weights stay
  within a KL of epsilon_eta of the data distribution.
* M-step: move the policy toward the weighted samples, subject to decoupled KL trust
  regions on the Gaussian mean (epsilon_mu) and covariance (epsilon_sigma) enforced by
  the Lagrange multipliers alpha_mu / alpha_sigma, and fit the value function to the
  targets. Repeated m_steps times on the full batch.

The M-step's policy loss is a choice (`--m-step`). `seed` is the paper's: the weighted
maximum likelihood of the top-k samples, which only pulls the policy toward them.
`clip` (the default) departs from the paper: the pull stops once a sample's likelihood
ratio to the acting policy exceeds 1 + epsilon, and a push away from the bottom-k samples,
weighted by the mirror E-step psi^- proportional to exp(-A / eta), stops once their ratio
is below 1 - epsilon (PPO's clip, on the E-step's weights). `push` bounds the push only.
With the pull alone the policy settles in a do-nothing optimum at these budgets
(benchmarks/README.md); the clipped M-step learns. The default network is PPO's: a 64x64
tanh policy with a state-independent log-std, and the learning rate is annealed.

Run:
    python vmpo_continuous.py --env-id dm_control/walker/walk --cuda
    python vmpo_continuous.py --help
    python vmpo_continuous.py --eval-only --checkpoint runs/<run>/vmpo_continuous_last.pt --capture-video

Docs: docs/vmpo_continuous.md (the file with its math rendered inline) and
docs/vmpo_continuous_annotations.md (each formula with the code around it).

Choices this file makes where the seed agent left room (all documented at the code):
* Vector envs use gymnasium's NEXT_STEP autoreset. The step after an episode end is a
  "reset step": its observation is the real final observation of the finished episode
  (so it bootstraps a truncation), its action is ignored, and it gets restarting
  weight 0: it is never selected by top-k, and never enters the advantage
  normalization statistics, the value loss, or any KL / diagnostic mean.
* top-k keeps floor(rho * N_valid) samples, N_valid = the number of non-restarting
  samples (the seed counted all samples; the two agree without reset steps).
"""

import ctypes
import dataclasses
import math
import os
import random
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

SCRIPT_STEM = os.path.splitext(os.path.basename(__file__))[0]
ALGO = "vmpo_continuous"  # written into every checkpoint, so another script's files are recognised


@dataclass
class Args:
    exp_name: str = SCRIPT_STEM
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch, environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when available (falls back to CPU, and says so once)"""
    track: bool = False
    """track the run with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """record mp4 videos of evaluation episodes to `<run_dir>/videos/`"""
    env_id: str = "dm_control/walker/walk"
    """gymnasium id, `dm_control/<domain>/<task>`, `dm_control/<domain>-<task>-v0`, or a probe id"""
    total_timesteps: int = 1_000_000
    """total environment steps of training"""
    num_envs: int = 8
    """number of parallel training environments"""
    num_steps: int = 256
    """steps per environment per rollout (rollout size = num_envs * num_steps)"""
    gamma: float = 0.99
    """discount factor"""
    advantage_estimator: Literal["returns", "dae", "gae"] = "gae"
    """targets: bootstrapped discounted returns to the rollout end, one-step TD, or GAE(lambda)"""
    gae_lambda: float = 0.95
    """lambda of GAE (only with --advantage-estimator gae)"""
    m_steps: int = 80
    """M-step gradient steps on the full rollout per iteration"""
    policy_lr: float = 1e-3
    """learning rate of the policy parameters"""
    value_lr: float = 5e-4
    """learning rate of the value parameters"""
    anneal_lr: bool = True
    """anneal the policy and value learning rates linearly to 0 over training"""
    optimizer: Literal["adam", "sgd"] = "adam"
    """optimizer of the networks and of the dual variables"""
    sgd_momentum: float = 0.9
    """momentum of SGD (only with --optimizer sgd)"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip of the M-step"""
    normalize_advantages: bool = True
    """normalize advantages over the non-restarting samples of the batch"""
    topk_fraction: float = 0.7
    """rho: fraction of the (non-restarting) samples with the highest advantages kept by the E-step"""
    temperature_init: float = 1.0
    """initial temperature eta"""
    temperature_lr: float = 1e-2
    """learning rate of the temperature (one step per iteration)"""
    epsilon_eta: float = 0.15
    """KL bound of the E-step weights (temperature dual)"""
    epsilon_mu: float = 0.05
    """KL bound on the change of the Gaussian mean per iteration"""
    epsilon_sigma: float = 0.001
    """KL bound on the change of the Gaussian covariance per iteration"""
    alpha_init: float = 1.0
    """initial alpha_mu and alpha_sigma (KL Lagrange multipliers)"""
    alpha_lr: float = 1e-2
    """learning rate of alpha_mu and alpha_sigma (one step per M-step)"""
    m_step: Literal["seed", "push", "clip"] = "clip"
    """policy loss of the M-step. seed: the paper's weighted maximum likelihood of the top-k samples, which only
    pulls the policy toward good actions. push (a departure from the paper): the same plus a bounded push away from
    the bottom-k samples, weighted by the mirror E-step psi^- ~ exp(-A/eta), that stops once a sample's likelihood
    ratio is below 1 - m_step_clip. clip (the default, a departure): the push, and the pull also stops once a top-k
    sample's ratio is above 1 + m_step_clip (PPO's two-sided clip on the E-step's weights). The pull alone settles in
    a do-nothing optimum at these budgets; the KL trust regions apply to every variant"""
    m_step_clip: float = 0.2
    """epsilon of the likelihood-ratio bounds of --m-step push and clip"""
    importance_weights: bool = False
    """multiply the E-step weights by min(1, pi(a|s) / pi_behaviour(a|s)); kept from the seed for lagged
    (asynchronous) data: here every batch is collected by the current parameters, so the ratio is 1"""
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the policy encoder"""
    value_hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the value encoder (ignored with --shared-encoder)"""
    shared_encoder: bool = False
    """the value head reads the policy encoder (one encoder for both)"""
    ppo_like_backbone: bool = True
    """orthogonal-init Linear+Tanh layers with a state-independent log-std, instead of LayerNorm/ELU with a state-dependent log-std head"""
    log_std_min: float = -5.0
    """lower clamp of the pre-tanh log standard deviation"""
    log_std_max: float = 2.0
    """upper clamp of the pre-tanh log standard deviation"""
    init_log_std: Optional[float] = -0.5
    """initial pre-tanh log standard deviation: the state-independent parameter of --ppo-like-backbone (0 when None),
    or the bias of the log-std head (PyTorch's random init when None)"""
    torch_threads: int = 1
    """CPU threads of the full-batch update (0 = torch's default); rollout inference always uses 1.
    On the shared 2-core machines 1 was 4x faster than 2 (thread contention)"""
    normalize_observations: bool = True
    """normalize observations with running statistics shared by all training envs"""
    max_episode_steps: Optional[int] = None
    """override the env's time limit (e.g. short episodes for quick tests); None keeps the env's own"""
    output_dir: str = "runs"
    """root directory of runs; the run directory is <output_dir>/<run_name>"""
    eval_interval: int = 100_000
    """environment steps between evaluations (0 = only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel, deterministic policy)"""
    checkpoint: Optional[str] = None
    """with --eval-only: the checkpoint to evaluate (and record with --capture-video) without training"""
    eval_only: bool = False
    """evaluate --checkpoint and exit"""
    resume: Optional[str] = None
    """continue training from this checkpoint to --total-timesteps, in a new run dir, with its saved env and hyperparameters"""


class ConfigError(ValueError):
    """Bad user input, reported as one line before any heavy work."""


class TrainingDiverged(RuntimeError):
    """A loss or a parameter became NaN/inf."""


# ---------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------

DM_CONTROL_FORMS = "'dm_control/<domain>/<task>' (e.g. dm_control/walker/walk) or 'dm_control/<domain>-<task>-v0'"


def dm_control_tasks() -> dict[str, list[str]]:
    """{domain: [tasks]} of the dm_control ids shimmy registers with gymnasium."""
    import shimmy

    gym.register_envs(shimmy)
    tasks: dict[str, list[str]] = {}
    for env_id in gym.registry:
        if env_id.startswith("dm_control/") and env_id.endswith("-v0") and env_id.count("-") == 2:
            domain, task = env_id[len("dm_control/"):-len("-v0")].split("-")
            tasks.setdefault(domain, []).append(task)
    tasks.pop("compatibility", None)
    return tasks


def resolve_env_id(env_id: str) -> str:
    """Map an accepted env id to a gymnasium id; bad dm_control ids raise ConfigError."""
    if env_id.startswith("dm_control/"):
        rest = env_id[len("dm_control/"):]
        parts = rest.split("/")
        if len(parts) == 2 and all(parts):
            domain, task = parts
        elif len(parts) == 1 and rest.endswith("-v0") and rest.count("-") == 2 and all(rest[:-3].split("-")):
            domain, task = rest[:-3].split("-")
        else:
            raise ConfigError(f"malformed dm_control env id {env_id!r}; accepted forms: {DM_CONTROL_FORMS}")
        tasks = dm_control_tasks()
        if domain not in tasks:
            raise ConfigError(f"unknown dm_control domain {domain!r} in {env_id!r}; valid domains: {', '.join(sorted(tasks))}")
        if task not in tasks[domain]:
            raise ConfigError(f"unknown task {task!r} for dm_control domain {domain!r}; valid tasks: {', '.join(sorted(tasks[domain]))}")
        return f"dm_control/{domain}-{task}-v0"
    if env_id.startswith("Probe"):
        import probe_envs  # noqa: F401  (registers the probe ids; only needed for them)
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


class RecordFirstEpisode(gym.Wrapper):
    """Render the first episode that completes after construction to `<video_dir>/<name>.mp4`
    (imageio + ffmpeg). Each evaluation builds fresh envs, so that is its first episode."""

    def __init__(self, env: gym.Env, video_dir: str, name: str):
        super().__init__(env)
        self.video_dir, self.name, self.frames, self.written = video_dir, name, [], False

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if not self.written:
            self.frames = [self.env.render()]
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not self.written:
            self.frames.append(self.env.render())
            if terminated or truncated:
                import imageio

                os.makedirs(self.video_dir, exist_ok=True)
                fps = self.env.metadata.get("render_fps") or 30
                imageio.mimsave(os.path.join(self.video_dir, f"{self.name}.mp4"), self.frames, fps=fps)
                self.frames, self.written = [], True
        return obs, reward, terminated, truncated, info


def make_env(gym_id: str, max_episode_steps: Optional[int], video_dir: Optional[str] = None, name_prefix: str = "eval"):
    def thunk():
        kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        if video_dir:
            kwargs["render_mode"] = "rgb_array"
        env = gym.make(gym_id, **kwargs)
        if isinstance(env.observation_space, gym.spaces.Dict):
            env = gym.wrappers.FlattenObservation(env)
        if video_dir:
            env = RecordFirstEpisode(env, video_dir, name_prefix)
        return env

    return thunk


def make_vector_env(args: Args, num_envs: int, seed: int, video_dir: Optional[str] = None,
                    name_prefix: str = "eval") -> gym.vector.VectorEnv:
    """Training (or evaluation) vector env: NEXT_STEP autoreset, flat float observations,
    episode statistics; with video_dir, env 0 records its first episode."""
    gym_id = resolve_env_id(args.env_id)
    thunks = [make_env(gym_id, args.max_episode_steps, video_dir if i == 0 else None, name_prefix) for i in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.reset(seed=seed)
    return envs


class RunningMeanStd:
    """Running mean/variance of observations (float64), shared by all training envs."""

    def __init__(self, shape: tuple[int, ...]):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        # Parallel-variance merge (Chan et al.) of the stored statistics with a batch.
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        # LaTeX: \tilde{o} = \operatorname{clip}\left(\frac{o - \mu_o}{\sqrt{\sigma_o^2 + 10^{-8}}}, -10, 10\right)
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10.0, 10.0).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(self.mean.copy()), "var": torch.from_numpy(self.var.copy()), "count": float(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var = state["mean"].numpy().astype(np.float64), state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class IdentityNormalizer(RunningMeanStd):
    """--no-normalize-observations: same interface, no change to the observations."""

    def update(self, x: np.ndarray) -> None:
        pass

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, np.float32)


# ---------------------------------------------------------------------------------
# Policy and value network
# ---------------------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def make_encoder(in_dim: int, hidden_sizes: tuple[int, ...], ppo_like: bool) -> nn.Sequential:
    """Default: Linear -> LayerNorm -> Tanh, then Linear -> ELU. PPO-like: orthogonal Linear -> Tanh."""
    layers: list[nn.Module] = []
    for i, size in enumerate(hidden_sizes):
        if ppo_like:
            layers += [layer_init(nn.Linear(in_dim, size)), nn.Tanh()]
        elif i == 0:
            layers += [nn.Linear(in_dim, size), nn.LayerNorm(size), nn.Tanh()]
        else:
            layers += [nn.Linear(in_dim, size), nn.ELU()]
        in_dim = size
    return nn.Sequential(*layers)


class Agent(nn.Module):
    """Gaussian over pre-squash actions u; the env action is a = low + (tanh(u) + 1) (high - low) / 2."""

    def __init__(self, obs_dim: int, act_dim: int, action_low: np.ndarray, action_high: np.ndarray, args: Args):
        super().__init__()
        self.shared_encoder, self.ppo_like = args.shared_encoder, args.ppo_like_backbone
        self.log_std_min, self.log_std_max = args.log_std_min, args.log_std_max
        self.policy_encoder = make_encoder(obs_dim, args.policy_hidden_sizes, self.ppo_like)
        feat = args.policy_hidden_sizes[-1] if args.policy_hidden_sizes else obs_dim
        self.policy_mean = layer_init(nn.Linear(feat, act_dim), std=0.01) if self.ppo_like else nn.Linear(feat, act_dim)
        if self.ppo_like:
            init = 0.0 if args.init_log_std is None else args.init_log_std
            self.policy_log_std = nn.Parameter(torch.full((act_dim,), init))  # state-independent
        else:
            self.policy_log_std = nn.Linear(feat, act_dim)  # state-dependent head
            if args.init_log_std is not None:
                nn.init.constant_(self.policy_log_std.bias, args.init_log_std)
        if self.shared_encoder:
            self.value_encoder, value_feat = None, feat
        else:
            self.value_encoder = make_encoder(obs_dim, args.value_hidden_sizes, self.ppo_like)
            value_feat = args.value_hidden_sizes[-1] if args.value_hidden_sizes else obs_dim
        self.value_head = layer_init(nn.Linear(value_feat, 1), std=1.0) if self.ppo_like else nn.Linear(value_feat, 1)
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def policy_parameters(self) -> list[nn.Parameter]:
        params = list(self.policy_encoder.parameters()) + list(self.policy_mean.parameters())
        return params + ([self.policy_log_std] if self.ppo_like else list(self.policy_log_std.parameters()))

    def value_parameters(self) -> list[nn.Parameter]:
        encoder = [] if self.value_encoder is None else list(self.value_encoder.parameters())
        return encoder + list(self.value_head.parameters())

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass for everything: (Gaussian mean, clamped log-std, value)."""
        h = self.policy_encoder(obs)
        mean = self.policy_mean(h)
        log_std = self.policy_log_std.expand_as(mean) if self.ppo_like else self.policy_log_std(h)
        log_std = log_std.clamp(self.log_std_min, self.log_std_max)
        value = self.value_head(h if self.value_encoder is None else self.value_encoder(obs)).squeeze(-1)
        return mean, log_std, value

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        # LaTeX: a = b + s \odot \tanh(u), \quad s = \tfrac{1}{2}(a_{\mathrm{high}} - a_{\mathrm{low}}),\ b = \tfrac{1}{2}(a_{\mathrm{high}} + a_{\mathrm{low}})
        return self.action_bias + self.action_scale * torch.tanh(u)

    def unsquash(self, actions: torch.Tensor) -> torch.Tensor:
        """Pre-tanh u of stored env-scale actions; clamped so atanh stays finite at the bounds."""
        y = ((actions - self.action_bias) / self.action_scale).clamp(-1.0 + 1e-6, 1.0 - 1e-6)
        # LaTeX: u = \operatorname{atanh}\left(\operatorname{clip}\left(\frac{a - b}{s}, -1 + 10^{-6}, 1 - 10^{-6}\right)\right)
        return torch.atanh(y)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.squash(self(obs)[0])


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """log N(u; mean, diag(exp(log_std))^2), summed over action dimensions."""
    # LaTeX: \log \mathcal{N}(u \mid \mu, \sigma) = \sum_j \left(-\frac{(u_j - \mu_j)^2}{2\sigma_j^2} - \log\sigma_j - \tfrac{1}{2}\log 2\pi\right)
    return (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def squash_log_det(u: torch.Tensor, action_scale: torch.Tensor) -> torch.Tensor:
    """log |da/du| of a = b + s tanh(u), summed over action dimensions (stable form of log(1 - tanh^2))."""
    # LaTeX: \log\left|\det \frac{\partial a}{\partial u}\right| = \sum_j \left(\log s_j + 2\left(\log 2 - u_j - \operatorname{softplus}(-2u_j)\right)\right)
    return (torch.log(action_scale) + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)


def squashed_log_prob(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor, action_scale: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) of the env-scale action a = b + s tanh(u) (change of variables)."""
    # LaTeX: \log \pi_\theta(a_t \mid s_t) = \log \mathcal{N}(u_t \mid \mu_\theta(s_t), \sigma_\theta(s_t)) - \log\left|\det \frac{\partial a}{\partial u}\right|
    return gaussian_log_prob(mean, log_std, u) - squash_log_det(u, action_scale)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of the pre-squash Gaussian (the seed's diagnostic), summed over action dimensions."""
    # LaTeX: \mathcal{H} = \sum_j \tfrac{1}{2}\left(1 + \log(2\pi\sigma_j^2)\right)
    return (0.5 * (1.0 + math.log(2 * math.pi)) + log_std).sum(-1)


# ---------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------

ESTIMATOR_LAMBDA = {"returns": 1.0, "dae": 0.0}


def compute_targets(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
                    truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets, shape (num_steps, num_envs).

    next_values[t] = V(real successor of s_t): at an episode end that is the real final
    observation (NEXT_STEP autoreset stores it as the next row), at the rollout end the
    last observation. lam = 1 gives bootstrapped discounted returns minus V, lam = 0
    the one-step TD error (DAE), anything between GAE(lambda).
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - torch.maximum(terminated.float(), truncated.float())
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
        delta = rewards[t] + gamma * not_terminated[t] * next_values[t] - values[t]
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last = delta + gamma * lam * not_done[t] * last
        advantages[t] = last
    # LaTeX: R_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


def normalize_advantages(advantages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Standardize with the mean/std of the non-restarting samples only (reset steps carry no data)."""
    n = valid.sum().clamp(min=1.0)
    mean = (advantages * valid).sum() / n
    std = (((advantages - mean) ** 2 * valid).sum() / n).sqrt()
    # LaTeX: \hat{A}_t \leftarrow \frac{\hat{A}_t - \mu_A}{\sigma_A + 10^{-8}}, \quad \mu_A, \sigma_A \text{ over } \{t : w^{restart}_t = 1\}
    return (advantages - mean) / (std + 1e-8)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    # LaTeX: \operatorname{EV} = 1 - \frac{\operatorname{Var}[R - V]}{\operatorname{Var}[R] + 10^{-8}}
    return float(1.0 - (returns - values).var(unbiased=False) / (returns.var(unbiased=False) + 1e-8))


# ---------------------------------------------------------------------------------
# V-MPO update
# ---------------------------------------------------------------------------------


def inverse_softplus(x: float) -> float:
    return math.log(math.expm1(x))


class DualVariables(nn.Module):
    """Unconstrained parameters of eta, alpha_mu, alpha_sigma (each = softplus(raw) + 1e-8)."""

    def __init__(self, temperature_init: float, alpha_init: float):
        super().__init__()
        self.log_temperature = nn.Parameter(torch.tensor(inverse_softplus(max(temperature_init, 1e-8))))
        self.log_alpha_mu = nn.Parameter(torch.tensor(inverse_softplus(alpha_init)))
        self.log_alpha_sigma = nn.Parameter(torch.tensor(inverse_softplus(alpha_init)))

    def temperature(self) -> torch.Tensor:
        # LaTeX: \eta = \operatorname{softplus}(\tilde{\eta}) + 10^{-8}
        return F.softplus(self.log_temperature) + 1e-8

    def alphas(self) -> tuple[torch.Tensor, torch.Tensor]:
        # LaTeX: \alpha_\mu = \operatorname{softplus}(\tilde{\alpha}_\mu) + 10^{-8}, \quad \alpha_\sigma = \operatorname{softplus}(\tilde{\alpha}_\sigma) + 10^{-8}
        return F.softplus(self.log_alpha_mu) + 1e-8, F.softplus(self.log_alpha_sigma) + 1e-8


def e_step(advantages: torch.Tensor, restarting_weights: torch.Tensor, importance_weights: torch.Tensor,
           temperature: torch.Tensor, topk_fraction: float, epsilon_eta: float) -> dict:
    """Sample weights psi, the selected set and the temperature dual loss (1-D inputs).

    Gradients flow to `temperature` through `dual_loss` only; `weights` are detached.
    """
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
        selected = selected_weights > 0
        # Subtracting the max over the selected samples keeps exp() from under/overflowing.
        s_max = scaled.detach()[selected].max()
    # LaTeX: \tilde{\psi}_t = \bar{w}_t \, w^{imp}_t \exp(s_t - s_{\max})
    unnormalized = selected_weights * importance_weights.detach() * torch.exp(scaled - s_max)
    # LaTeX: Z = \sum_t \tilde{\psi}_t, \quad N_{sel} = \sum_t \bar{w}_t
    z, n_selected = unnormalized.sum(), selected_weights.sum()
    # LaTeX: \psi_t = \frac{\tilde{\psi}_t}{Z}
    weights = (unnormalized / z).detach()
    # LaTeX: \log \bar{\psi} = \log Z + s_{\max} - \log N_{sel} = \log \frac{1}{N_{sel}} \sum_{t \in \mathcal{S}} w^{imp}_t \exp(s_t)
    log_mean_weights = torch.log(z) + s_max - torch.log(n_selected)
    # LaTeX: \mathcal{L}_\eta = \eta \left(\epsilon_\eta + \log \bar{\psi}\right)
    dual_loss = temperature * (epsilon_eta + log_mean_weights)
    return {"weights": weights, "selected": selected, "selected_weights": selected_weights, "threshold": threshold,
            "dual_loss": dual_loss, "log_mean_weights": log_mean_weights}


def decoupled_kl(mean: torch.Tensor, log_std: torch.Tensor, old_mean: torch.Tensor,
                 old_log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample KL of the mean (new mean, old sigma) and of the covariance (old mean, new sigma)."""
    old_var = (2.0 * old_log_std).exp()
    # LaTeX: D_\mu(s_t) = \sum_j \frac{(\mu_j - \mu^{old}_j)^2}{2(\sigma^{old}_j)^2} = \mathrm{KL}\left(\mathcal{N}(\mu^{old}, \sigma^{old}) \,\|\, \mathcal{N}(\mu, \sigma^{old})\right)
    kl_mu = ((mean - old_mean) ** 2 / (2.0 * old_var)).sum(-1)
    # LaTeX: D_\sigma(s_t) = \frac{1}{2} \sum_j \left(\frac{(\sigma^{old}_j)^2}{\sigma_j^2} - 1 + 2(\log\sigma_j - \log\sigma^{old}_j)\right) = \mathrm{KL}\left(\mathcal{N}(\mu^{old}, \sigma^{old}) \,\|\, \mathcal{N}(\mu^{old}, \sigma)\right)
    kl_sigma = 0.5 * (old_var / (2.0 * log_std).exp() - 1.0 + 2.0 * (log_std - old_log_std)).sum(-1)
    return kl_mu, kl_sigma


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def alpha_loss_fn(alpha_mu: torch.Tensor, alpha_sigma: torch.Tensor, kl_mu: torch.Tensor, kl_sigma: torch.Tensor,
                  epsilon_mu: float, epsilon_sigma: float) -> torch.Tensor:
    """Dual loss of the KL multipliers: minimizing it grows alpha while KL > epsilon, shrinks it below."""
    # LaTeX: \mathcal{L}_\alpha = \alpha_\mu\left(\epsilon_\mu - \operatorname{sg}[D_\mu]\right) + \alpha_\sigma\left(\epsilon_\sigma - \operatorname{sg}[D_\sigma]\right)
    return alpha_mu * (epsilon_mu - kl_mu.detach()) + alpha_sigma * (epsilon_sigma - kl_sigma.detach())


def weighted_nll(weights: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """The paper's M-step policy loss (--m-step seed): weighted maximum likelihood, a pull toward the top-k samples."""
    # LaTeX: \mathcal{L}^{NLL}_\pi = -\sum_t \psi_t \log \pi_\theta(a_t \mid s_t)
    return -(weights * log_prob).sum()


def clipped_pull_loss(weights: torch.Tensor, log_ratio: torch.Tensor, clip: float) -> torch.Tensor:
    """--m-step clip: the weighted likelihood of a top-k sample stops rising once its ratio is above 1 + clip."""
    # LaTeX: \mathcal{L}^{pull}_\pi = -\sum_t \psi_t \min\left(\log \frac{\pi_\theta(a_t \mid s_t)}{\pi_{old}(a_t \mid s_t)}, \log(1 + \epsilon_{clip})\right)
    return -(weights * torch.clamp(log_ratio, max=math.log1p(clip))).sum()


def push_loss(push_weights: torch.Tensor, log_ratio: torch.Tensor, clip: float) -> torch.Tensor:
    """--m-step push and clip: lower the likelihood of the bottom-k samples until their ratio is below 1 - clip.

    Without the bound the push is unbounded (the likelihood of an action can fall without limit)."""
    # LaTeX: \mathcal{L}^{push}_\pi = \sum_t \psi^-_t \max\left(\log \frac{\pi_\theta(a_t \mid s_t)}{\pi_{old}(a_t \mid s_t)}, \log(1 - \epsilon_{clip})\right)
    return (push_weights * torch.clamp(log_ratio, min=math.log1p(-clip))).sum()


def m_step_policy_loss(m_step: str, weights: torch.Tensor, push_weights: Optional[torch.Tensor], log_prob: torch.Tensor,
                       log_ratio: torch.Tensor, clip: float) -> torch.Tensor:
    """The likelihood part of the M-step's policy loss for each --m-step variant (the KL terms come on top)."""
    if m_step == "seed":
        # LaTeX: \mathcal{L}^{lik}_\pi = \mathcal{L}^{NLL}_\pi
        return weighted_nll(weights, log_prob)
    if m_step == "push":
        # LaTeX: \mathcal{L}^{lik}_\pi = \mathcal{L}^{NLL}_\pi + \mathcal{L}^{push}_\pi
        return weighted_nll(weights, log_prob) + push_loss(push_weights, log_ratio, clip)
    # LaTeX: \mathcal{L}^{lik}_\pi = \mathcal{L}^{pull}_\pi + \mathcal{L}^{push}_\pi
    return clipped_pull_loss(weights, log_ratio, clip) + push_loss(push_weights, log_ratio, clip)


def build_optimizer(params, lr: float, args: Args) -> torch.optim.Optimizer:
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, eps=1e-5)
    return torch.optim.SGD(params, lr=lr, momentum=args.sgd_momentum)


def build_optimizers(agent: Agent, duals: DualVariables, args: Args) -> dict[str, torch.optim.Optimizer]:
    """One combined optimizer for policy and value (separate learning rates), one per dual group."""
    model = build_optimizer([{"params": agent.policy_parameters(), "lr": args.policy_lr},
                             {"params": agent.value_parameters(), "lr": args.value_lr}], args.policy_lr, args)
    return {"model": model,
            "temperature": build_optimizer([duals.log_temperature], args.temperature_lr, args),
            "alpha": build_optimizer([duals.log_alpha_mu, duals.log_alpha_sigma], args.alpha_lr, args)}


def vmpo_update(agent: Agent, duals: DualVariables, optimizers: dict, batch: dict, args: Args) -> dict[str, float]:
    """One V-MPO iteration on a flat batch: E-step (one temperature step), then m_steps M-steps."""
    obs, actions = batch["obs"], batch["actions"]
    old_means, old_log_stds = batch["means"], batch["log_stds"]
    returns, raw_advantages = batch["returns"], batch["advantages"]
    restarting = batch["restarting_weights"]
    valid = restarting > 0
    # Pre-tanh actions and the (parameter-free) squash Jacobian are fixed for the whole update.
    u = agent.unsquash(actions)
    log_det = squash_log_det(u, agent.action_scale)

    advantages = normalize_advantages(raw_advantages, restarting) if args.normalize_advantages else raw_advantages
    if args.importance_weights:
        # The ratio is 1 when the acting and the learning parameters are the same, as in this loop.
        with torch.no_grad():
            mean, log_std, _ = agent(obs)
            # LaTeX: w^{imp}_t = \min\left(1, \frac{\pi_\theta(a_t \mid s_t)}{\pi_{old}(a_t \mid s_t)}\right)
            importance = torch.exp(gaussian_log_prob(mean, log_std, u) - gaussian_log_prob(old_means, old_log_stds, u)).clamp(max=1.0)
    else:
        importance = torch.ones_like(advantages)
    params_before = nn.utils.parameters_to_vector(agent.parameters()).detach().clone()

    # ---- E-step: weights with the current temperature, then one dual step on it.
    estep = e_step(advantages, restarting, importance, duals.temperature(), args.topk_fraction, args.epsilon_eta)
    optimizers["temperature"].zero_grad()
    estep["dual_loss"].backward()
    optimizers["temperature"].step()
    weights, selected = estep["weights"], estep["selected_weights"]
    push_weights = None
    if args.m_step != "seed":
        # The mirror E-step: the same temperature and k on the negated advantages gives weights
        # proportional to exp(-s_t) over the bottom k samples (its dual loss is not used).
        # LaTeX: \psi^-_t = \frac{\bar{w}^-_t \exp(-s_t)}{\sum_{t'} \bar{w}^-_{t'} \exp(-s_{t'})}, \quad \bar{w}^-_t = w^{restart}_t \mathbf{1}[t \in \operatorname{BottomK}(s, k)]
        push_weights = e_step(-advantages, restarting, importance, duals.temperature().detach(), args.topk_fraction,
                              args.epsilon_eta)["weights"]
    # The squash Jacobian cancels in the ratio, so the pre-tanh Gaussians are enough.
    old_log_prob = gaussian_log_prob(old_means, old_log_stds, u)
    all_params = list(agent.parameters())

    # ---- M-step: the likelihood loss of --m-step (the paper's: weighted maximum likelihood) under decoupled KL
    # trust regions, plus the value fit.
    for _ in range(args.m_steps):
        mean, log_std, values = agent(obs)
        gaussian_lp = gaussian_log_prob(mean, log_std, u)
        log_prob = gaussian_lp - log_det
        # LaTeX: \log \frac{\pi_\theta(a_t \mid s_t)}{\pi_{old}(a_t \mid s_t)} = \log \mathcal{N}(u_t \mid \mu_\theta, \sigma_\theta) - \log \mathcal{N}(u_t \mid \mu_{old}, \sigma_{old})
        log_ratio = gaussian_lp - old_log_prob
        likelihood_loss = m_step_policy_loss(args.m_step, weights, push_weights, log_prob, log_ratio, args.m_step_clip)
        kl_mu_t, kl_sigma_t = decoupled_kl(mean, log_std, old_means, old_log_stds)
        # LaTeX: D_\mu = \frac{1}{N_{sel}} \sum_{t \in \mathcal{S}} D_\mu(s_t), \quad D_\sigma = \frac{1}{N_{sel}} \sum_{t \in \mathcal{S}} D_\sigma(s_t)
        kl_mu, kl_sigma = masked_mean(kl_mu_t, selected), masked_mean(kl_sigma_t, selected)

        alpha_mu, alpha_sigma = duals.alphas()
        alpha_loss = alpha_loss_fn(alpha_mu, alpha_sigma, kl_mu, kl_sigma, args.epsilon_mu, args.epsilon_sigma)
        optimizers["alpha"].zero_grad()
        alpha_loss.backward()
        optimizers["alpha"].step()
        with torch.no_grad():
            alpha_mu, alpha_sigma = duals.alphas()  # the just-updated multipliers, held constant below

        # LaTeX: \mathcal{L}_\pi = \mathcal{L}^{lik}_\pi + \operatorname{sg}[\alpha_\mu] D_\mu + \operatorname{sg}[\alpha_\sigma] D_\sigma
        policy_loss = likelihood_loss + alpha_mu * kl_mu + alpha_sigma * kl_sigma
        # LaTeX: \mathcal{L}_V = \frac{1}{2} \cdot \frac{1}{N_{valid}} \sum_{t : w^{restart}_t = 1} \left(V_\phi(s_t) - R_t\right)^2
        value_loss = 0.5 * masked_mean((values - returns) ** 2, restarting)
        # LaTeX: \mathcal{L} = \mathcal{L}_\pi + \mathcal{L}_V
        total_loss = policy_loss + value_loss
        optimizers["model"].zero_grad()
        total_loss.backward()
        # LaTeX: g \leftarrow g \cdot \min\left(1, \frac{c_{\max}}{\lVert g \rVert_2}\right)
        grad_norm = nn.utils.clip_grad_norm_(all_params, args.max_grad_norm)
        optimizers["model"].step()

    # ---- Diagnostics (the last M-step's quantities, as the seed reports them).
    with torch.no_grad():
        param_delta = (nn.utils.parameters_to_vector(agent.parameters()) - params_before).norm()
        mean_after, _, values_after = agent(obs)
        v, r = values_after[valid], returns[valid]
        temperature = duals.temperature()
        w = estep["weights"]
        a_valid = advantages[valid]
        stats = {
            "loss/total": total_loss, "loss/value": value_loss, "loss/policy": policy_loss,
            "loss/policy_weighted_nll": weighted_nll(weights, log_prob), "loss/policy_likelihood": likelihood_loss,
            "loss/policy_kl_mean_pen": alpha_mu * kl_mu,
            "loss/policy_kl_std_pen": alpha_sigma * kl_sigma, "loss/alpha": alpha_loss,
            "kl/mean": masked_mean(kl_mu_t, restarting), "kl/std": masked_mean(kl_sigma_t, restarting),
            "kl/mean_sel": kl_mu, "kl/std_sel": kl_sigma,
            "vmpo/alpha_mu": alpha_mu, "vmpo/alpha_sigma": alpha_sigma, "vmpo/dual_loss": estep["dual_loss"],
            "vmpo/epsilon_eta": args.epsilon_eta, "vmpo/temperature_raw": temperature,
            "vmpo/adv_std_over_temperature": a_valid.std(unbiased=False) / temperature,
            "vmpo/selected_frac": selected[valid].mean(), "vmpo/threshold": estep["threshold"],
            # LaTeX: \mathrm{ESS} = \frac{1}{\sum_t \psi_t^2}
            "vmpo/ess": 1.0 / (w**2).sum(), "vmpo/log_mean_weights": estep["log_mean_weights"],
            "vmpo/restarting_frac": 1.0 - valid.float().mean(), "vmpo/importance_mean": importance[valid].mean(),
            "vmpo/grad_norm": grad_norm,
            # Fraction of the valid samples whose likelihood ratio was outside [1 - clip, 1 + clip] at the last M-step.
            "vmpo/ratio_outside_clip_frac": masked_mean((log_ratio.abs() > math.log1p(args.m_step_clip)).float(), restarting),
            "train/entropy": masked_mean(gaussian_entropy(log_std), selected),
            "train/param_delta": param_delta,
            "train/mean_abs_action": agent.squash(mean_after)[valid].abs().mean(),
            "adv/raw_mean": raw_advantages[valid].mean(), "adv/raw_std": raw_advantages[valid].std(unbiased=False),
            "returns/raw_mean": r.mean(), "returns/raw_std": r.std(unbiased=False),
            "value/explained_var": explained_variance(v, r), "value/pred_mean": v.mean(),
            "value/pred_std": v.std(unbiased=False),
        }
    return {k: float(x.detach()) if torch.is_tensor(x) else float(x) for k, x in stats.items()}


# Standard tags shared with the PPO scripts, so dashboards line up across algorithms.
STANDARD_TAGS = {"losses/policy_loss": "loss/policy", "losses/value_loss": "loss/value", "losses/total_loss": "loss/total",
                 "losses/entropy": "train/entropy", "losses/explained_variance": "value/explained_var",
                 "losses/temperature_loss": "vmpo/dual_loss", "losses/alpha_loss": "loss/alpha"}


# ---------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(agent: Agent, obs_rms: RunningMeanStd, args: Args, device: torch.device, seed: int,
             video_dir: Optional[str] = None, name_prefix: str = "eval") -> tuple[np.ndarray, np.ndarray]:
    """args.eval_episodes episodes in parallel with the deterministic action b + s tanh(mean);
    the normalizer is only read (frozen)."""
    envs = make_vector_env(args, args.eval_episodes, seed, video_dir, name_prefix)
    obs, _ = envs.reset(seed=seed)
    n = args.eval_episodes
    returns, lengths, finished = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
    while not finished.all():
        obs_t = torch.as_tensor(obs_rms.normalize(obs), device=device)
        obs, reward, terminated, truncated, _ = envs.step(agent.deterministic_action(obs_t).cpu().numpy())
        returns += np.where(finished, 0.0, reward)
        lengths += ~finished
        finished |= terminated | truncated
    envs.close()
    return returns, lengths


# ---------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------


def save_checkpoint(path: str, agent: Agent, duals: DualVariables, optimizers: dict, obs_rms: RunningMeanStd,
                    args: Args, global_step: int, iteration: int, best_eval_return: float) -> None:
    """Atomic write (tmp file, then os.replace) of everything resume needs; weights_only-loadable."""
    np_state = np.random.get_state()
    state = {
        "algo": ALGO, "agent": agent.state_dict(), "duals": duals.state_dict(),
        "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()},
        "obs_rms": obs_rms.state_dict(), "args": dataclasses.asdict(args),
        "global_step": global_step, "iteration": iteration, "best_eval_return": best_eval_return,
        "rng": {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
                "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                          "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])}},
    }
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate((3, tuple(rng["python"]), None))
    n = rng["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))


def load_checkpoint(path: str, flag: str) -> dict:
    """One of this script's checkpoints, or a ConfigError that says what the file is instead."""
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # garbage, truncated, or not written by torch.save
        raise ConfigError(f"{flag} {path!r} is not a readable checkpoint (truncated, or not a {SCRIPT_STEM}_*.pt file)") from None
    algo = ckpt.get("algo") if isinstance(ckpt, dict) else None
    if algo != ALGO:
        written_by = f"{algo}.py" if isinstance(algo, str) else "something else"
        raise ConfigError(f"{flag} {path!r} was written by {written_by}, not {ALGO}.py; load it with that script")
    return ckpt


# Resume and eval-only take the checkpoint's arguments, except these: how this run is run and logged.
RUN_FIELDS = ("exp_name", "cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "output_dir",
              "total_timesteps", "eval_interval", "eval_episodes", "max_episode_steps", "torch_threads", "checkpoint",
              "eval_only", "resume")


def args_with_checkpoint(args: Args, ckpt: dict) -> Args:
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items()
             if k in Args.__dataclass_fields__ and k not in RUN_FIELDS}
    return dataclasses.replace(args, **saved)


def build_agent(envs: gym.vector.VectorEnv, args: Args) -> Agent:
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    space = envs.single_action_space
    return Agent(obs_dim, int(np.prod(space.shape)), space.low, space.high, args)


def make_normalizer(args: Args, shape) -> RunningMeanStd:
    return RunningMeanStd(tuple(shape)) if args.normalize_observations else IdentityNormalizer(tuple(shape))


# ---------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------

def check_args(args: Args, gl_backend: Optional[str]) -> None:
    """Validate everything cheap to validate; raise ConfigError with one clear line."""
    if not 0.0 < args.topk_fraction <= 1.0:
        raise ConfigError(f"--topk-fraction must be in (0, 1], got {args.topk_fraction}")
    for name in ("epsilon_eta", "epsilon_mu", "epsilon_sigma", "temperature_init", "alpha_init", "policy_lr",
                 "value_lr", "temperature_lr", "alpha_lr", "max_grad_norm"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not 0.0 < args.m_step_clip < 1.0:
        raise ConfigError(f"--m-step-clip must be in (0, 1), got {args.m_step_clip}")
    if not 0.0 <= args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        raise ConfigError(f"--gamma and --gae-lambda must be in [0, 1], got {args.gamma} and {args.gae_lambda}")
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads must be >= 0 (0 = torch's default), got {args.torch_threads}")
    for name in ("num_envs", "num_steps", "m_steps", "eval_episodes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.eval_interval < 0:
        raise ConfigError(f"--eval-interval must be >= 0 (0 = only the final evaluation), got {args.eval_interval}")
    batch_size = args.num_envs * args.num_steps
    if not args.eval_only and args.total_timesteps < batch_size:
        raise ConfigError(f"--total-timesteps ({args.total_timesteps}) must be >= num_envs * num_steps ({batch_size}), one rollout")
    if int(args.topk_fraction * batch_size) < 1:
        raise ConfigError(f"topk_fraction * num_envs * num_steps = {args.topk_fraction * batch_size:g} selects no sample; raise one of them")
    if any(h < 1 for h in args.policy_hidden_sizes + args.value_hidden_sizes):
        raise ConfigError("hidden sizes must be positive integers")
    if not args.log_std_min < args.log_std_max:
        raise ConfigError(f"--log-std-min ({args.log_std_min}) must be < --log-std-max ({args.log_std_max})")
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        raise ConfigError(f"--max-episode-steps must be >= 1, got {args.max_episode_steps}")
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
    gym_id = resolve_env_id(env_id)
    try:
        env = gym.make(gym_id)
    except gym.error.Error as e:
        raise ConfigError(f"unknown env id {env_id!r} ({type(e).__name__}: {e}); accepted: any gymnasium id, {DM_CONTROL_FORMS}, or a probe id") from None
    space = env.action_space
    env.close()
    if isinstance(space, gym.spaces.Discrete):
        raise ConfigError(f"{env_id!r} has a Discrete action space; vmpo_continuous.py needs a continuous Box action space (use ppo_discrete.py)")
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(f"{env_id!r} has action space {space}; vmpo_continuous.py needs a continuous Box action space")
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ConfigError(f"{env_id!r} has unbounded actions {space}; the tanh-squashed policy needs finite bounds")


def select_device(args: Args) -> torch.device:
    if args.cuda and torch.cuda.is_available():
        return torch.device("cuda")
    if args.cuda:
        print("CUDA is not available; running on CPU.")
    return torch.device("cpu")


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = deterministic


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, m, s = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def log_eval(writer: SummaryWriter, returns: np.ndarray, lengths: np.ndarray, step: int) -> None:
    for tag, value in (("return_mean", returns.mean()), ("return_std", returns.std()), ("return_min", returns.min()),
                       ("return_max", returns.max()), ("length_mean", lengths.mean())):
        writer.add_scalar(f"eval/{tag}", float(value), step)


def policy_from_checkpoint(ckpt: dict, device: torch.device) -> tuple[Agent, RunningMeanStd]:
    """The saved agent and observation normalizer, built with the checkpoint's own arguments."""
    args = args_with_checkpoint(Args(), ckpt)
    envs = make_vector_env(args, 1, 0)  # for the spaces only
    agent = build_agent(envs, args).to(device)
    envs.close()
    agent.load_state_dict(ckpt["agent"])
    obs_rms = make_normalizer(args, ckpt["obs_rms"]["mean"].shape)
    obs_rms.load_state_dict(ckpt["obs_rms"])
    return agent, obs_rms


def run_evaluation_only(args: Args, ckpt: dict) -> dict:
    """Evaluate (and record) the checkpoint's policy on its own env, with this command's evaluation settings."""
    device = select_device(args)
    agent, obs_rms = policy_from_checkpoint(ckpt, device)
    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}-eval__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.output_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
    start = time.time()
    returns, lengths = evaluate(agent, obs_rms, args, device, seed=args.seed + 10_000, video_dir=video_dir,
                                name_prefix=f"eval-step{ckpt['global_step']}")
    writer = SummaryWriter(run_dir)
    log_eval(writer, returns, lengths, ckpt["global_step"])
    writer.close()
    print(f"evaluated {args.checkpoint} (step {ckpt['global_step']}) on {args.env_id}: "
          f"return {returns.mean():.2f} ± {returns.std():.2f} over {len(returns)} episodes; run dir {run_dir}")
    return {"final_eval_return": float(returns.mean()), "final_eval_std": float(returns.std()),
            "best_eval_return": float(returns.mean()), "global_step": int(ckpt["global_step"]),
            "wall_time": time.time() - start, "train_sps": 0.0, "run_dir": run_dir}


def train(args: Args) -> dict:
    gl_backend = choose_gl_backend(args.capture_video)  # before anything imports mujoco
    if args.eval_only and not args.checkpoint:
        raise ConfigError("--eval-only needs --checkpoint PATH (a vmpo_continuous_*.pt file)")
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
    if args.eval_only:
        return run_evaluation_only(args, ckpt)
    resume_ckpt = ckpt
    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.output_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    last_path = os.path.join(run_dir, f"{SCRIPT_STEM}_last.pt")
    best_path = os.path.join(run_dir, f"{SCRIPT_STEM}_best.pt")

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=dataclasses.asdict(args), name=os.path.basename(run_dir), dir=run_dir, save_code=False)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items()))

    seed_everything(args.seed, args.torch_deterministic)
    device = select_device(args)
    default_threads = torch.get_num_threads()
    update_threads = args.torch_threads or default_threads
    envs = make_vector_env(args, args.num_envs, args.seed)
    agent = build_agent(envs, args).to(device)
    duals = DualVariables(args.temperature_init, args.alpha_init).to(device)
    optimizers = build_optimizers(agent, duals, args)
    obs_shape = envs.single_observation_space.shape
    obs_rms = make_normalizer(args, obs_shape)

    num_iterations = args.total_timesteps // batch_size
    global_step, start_iteration, best_eval_return = 0, 1, -math.inf
    if resume_ckpt is not None:
        agent.load_state_dict(resume_ckpt["agent"])
        duals.load_state_dict(resume_ckpt["duals"])
        for name, opt in optimizers.items():
            opt.load_state_dict(resume_ckpt["optimizers"][name])
        obs_rms.load_state_dict(resume_ckpt["obs_rms"])
        restore_rng(resume_ckpt["rng"])
        global_step, start_iteration = resume_ckpt["global_step"], resume_ckpt["iteration"] + 1
        best_eval_return = resume_ckpt["best_eval_return"]
        print(f"resuming {args.resume} at step {global_step} with its saved hyperparameters; training to step "
              f"{final_step}")
    elif final_step != args.total_timesteps:
        print(f"training to step {final_step}: --total-timesteps {args.total_timesteps} rounded down to whole "
              f"rollouts of {batch_size} steps")

    # Rollout storage, (num_steps, num_envs, ...).
    act_dim = envs.single_action_space.shape[0]
    T, N = args.num_steps, args.num_envs
    obs_buf = torch.zeros((T, N) + obs_shape, device=device)
    actions_buf = torch.zeros((T, N, act_dim), device=device)
    means_buf, log_stds_buf = torch.zeros_like(actions_buf), torch.zeros_like(actions_buf)
    rewards_buf, values_buf = torch.zeros((T, N), device=device), torch.zeros((T, N), device=device)
    terminated_buf, truncated_buf = torch.zeros((T, N), device=device), torch.zeros((T, N), device=device)
    restarting_buf = torch.zeros((T, N), device=device)

    # Env states are not checkpointed: a resumed run starts fresh episodes (differently seeded).
    raw_obs = envs.reset(seed=args.seed if resume_ckpt is None else args.seed + resume_ckpt["iteration"])[0]
    obs_rms.update(raw_obs)
    next_obs = torch.as_tensor(obs_rms.normalize(raw_obs), device=device)
    prev_done = np.zeros(N, bool)  # the previous step ended an episode -> this step is a reset step
    recent_returns: list[float] = []
    last_eval, last_eval_std = float("nan"), float("nan")
    next_eval = (global_step // args.eval_interval + 1) * args.eval_interval if args.eval_interval > 0 else math.inf
    train_time, start_time = 0.0, time.time()
    iteration = start_iteration - 1
    lr_scale = 1.0

    def checkpoint(path: str) -> None:
        save_checkpoint(path, agent, duals, optimizers, obs_rms, args, global_step, iteration, best_eval_return)

    checkpoint(last_path)  # _last always holds the last completed update, so Ctrl-C loses only unfinished work
    saved_step = global_step

    def run_eval() -> tuple[np.ndarray, np.ndarray]:
        video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
        return evaluate(agent, obs_rms, args, device, seed=args.seed + 10_000, video_dir=video_dir,
                        name_prefix=f"eval-step{global_step}")

    try:
        for iteration in range(start_iteration, num_iterations + 1):
            t0 = time.time()
            if args.anneal_lr:
                # LaTeX: \lambda_k = \lambda_0 \left(1 - \frac{k - 1}{K}\right)
                lr_scale = 1.0 - (iteration - 1.0) / num_iterations
                for group, lr in zip(optimizers["model"].param_groups, (args.policy_lr, args.value_lr)):
                    group["lr"] = lr * lr_scale

            # ---- Rollout (cheap inference: no autograd, no distribution objects, one thread:
            # batches of num_envs observations only lose to threading overhead).
            torch.set_num_threads(1)
            for step in range(T):
                global_step += N
                obs_buf[step] = next_obs
                restarting_buf[step] = torch.as_tensor(~prev_done, dtype=torch.float32)
                with torch.inference_mode():
                    mean, log_std, value = agent(next_obs)
                    u = mean + log_std.exp() * torch.randn_like(mean)
                    action = agent.squash(u)
                actions_buf[step], means_buf[step], log_stds_buf[step], values_buf[step] = action, mean, log_std, value
                raw_obs, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                obs_rms.update(raw_obs)
                next_obs = torch.as_tensor(obs_rms.normalize(raw_obs), device=device)
                rewards_buf[step] = torch.as_tensor(reward, dtype=torch.float32)
                terminated_buf[step] = torch.as_tensor(terminated, dtype=torch.float32)
                truncated_buf[step] = torch.as_tensor(truncated, dtype=torch.float32)
                prev_done = terminated | truncated
                if "_episode" in infos:
                    for i in np.nonzero(infos["_episode"])[0]:
                        recent_returns = (recent_returns + [float(infos["episode"]["r"][i])])[-20:]
                        writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                        writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)

            # ---- Targets. Row t+1 holds s_{t+1}; at an episode end it is the real final observation.
            with torch.inference_mode():
                next_values = torch.cat([values_buf[1:], agent(next_obs)[2].unsqueeze(0)], 0)
            lam = ESTIMATOR_LAMBDA.get(args.advantage_estimator, args.gae_lambda)
            advantages, returns = compute_targets(rewards_buf, values_buf, next_values, terminated_buf, truncated_buf,
                                                  args.gamma, lam)
            batch = {"obs": obs_buf.reshape((-1,) + obs_shape), "actions": actions_buf.reshape(-1, act_dim),
                     "means": means_buf.reshape(-1, act_dim), "log_stds": log_stds_buf.reshape(-1, act_dim),
                     "advantages": advantages.reshape(-1), "returns": returns.reshape(-1),
                     "restarting_weights": restarting_buf.reshape(-1)}

            # ---- Update (full-batch matrix products do use the cores).
            torch.set_num_threads(update_threads)
            stats = vmpo_update(agent, duals, optimizers, batch, args)
            bad = [k for k in ("loss/total", "vmpo/dual_loss", "loss/alpha") if not math.isfinite(stats[k])]
            if bad or not all(torch.isfinite(p).all() for p in list(agent.parameters()) + list(duals.parameters())):
                raise TrainingDiverged(f"non-finite {', '.join(bad) or 'parameters'} at global step {global_step} "
                                       f"(iteration {iteration}); stopped; last good checkpoint: {last_path} "
                                       f"(step {saved_step})")
            checkpoint(last_path)  # before logging: Ctrl-C from here on keeps this update
            saved_step = global_step
            train_time += time.time() - t0
            sps = int((global_step - (start_iteration - 1) * batch_size) / max(train_time, 1e-9))
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/learning_rate", optimizers["model"].param_groups[0]["lr"], global_step)
            for tag, value in stats.items():
                writer.add_scalar(tag, value, global_step)
            for tag, source in STANDARD_TAGS.items():
                writer.add_scalar(tag, stats[source], global_step)

            if global_step >= next_eval and iteration < num_iterations:
                returns_e, lengths_e = run_eval()
                log_eval(writer, returns_e, lengths_e, global_step)
                last_eval, last_eval_std = float(returns_e.mean()), float(returns_e.std())
                if last_eval > best_eval_return:
                    best_eval_return = last_eval
                    checkpoint(best_path)
                checkpoint(last_path)  # records the new best eval return
                next_eval = (global_step // args.eval_interval + 1) * args.eval_interval

            eta = (num_iterations - iteration) * batch_size / max(sps, 1)
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            print(f"step {global_step}/{args.total_timesteps} ({100 * global_step / args.total_timesteps:.1f}%) | SPS {sps} | "
                  f"ETA {format_duration(eta)} | return {recent} | eval {last_eval:.1f}".replace("eval nan", "eval n/a"), flush=True)

        returns_e, lengths_e = run_eval()
        log_eval(writer, returns_e, lengths_e, global_step)
        last_eval, last_eval_std = float(returns_e.mean()), float(returns_e.std())
        if last_eval > best_eval_return:
            best_eval_return = last_eval
            checkpoint(best_path)
        checkpoint(last_path)
        print(f"final eval return {last_eval:.2f} ± {last_eval_std:.2f} | best {best_eval_return:.2f} | run dir {run_dir}")
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last checkpoint, at step {saved_step} (the last trained step), is {last_path}",
              flush=True)
        raise
    finally:
        torch.set_num_threads(default_threads)
        envs.close()
        writer.close()
        if args.track:
            import wandb

            wandb.finish()

    return {"final_eval_return": last_eval, "final_eval_std": last_eval_std, "best_eval_return": best_eval_return,
            "global_step": global_step, "wall_time": time.time() - start_time,
            "train_sps": (global_step - (start_iteration - 1) * batch_size) / max(train_time, 1e-9), "run_dir": run_dir}


if __name__ == "__main__":
    cli_args = tyro.cli(Args)
    try:
        train(cli_args)
    except (ConfigError, TrainingDiverged) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)

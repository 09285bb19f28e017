"""PPO for discrete actions: clipped surrogate objective with GAE, in one file.

Proximal Policy Optimization (Schulman et al., 2017, https://arxiv.org/abs/1707.06347) with Generalized Advantage
Estimation (Schulman et al., 2016, https://arxiv.org/abs/1506.02438): a categorical policy and a separate value MLP.

    python ppo_discrete.py                                   # CartPole-v1, 100k steps
    python ppo_discrete.py --env-id Acrobot-v1 --total-timesteps 500000 --track
    python ppo_discrete.py --eval-only --checkpoint runs/<run>/ppo_discrete_best.pt
    python ppo_discrete.py --resume runs/<run>/ppo_discrete_last.pt

The math: ``docs/ppo_discrete.md`` (the whole file) and ``docs/ppo_discrete_annotations.md`` (each ``# LaTeX:``
comment with the line below it). Continuous actions (``Box``): use ``ppo_continuous.py``.
"""

import contextlib
import copy
import dataclasses
import importlib
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
    """PPO with a categorical policy for discrete actions, in one file."""

    exp_name: str = "ppo_discrete"
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy and the environments)"""
    torch_deterministic: bool = True
    """set `torch.backends.cudnn.deterministic=True` (turn it off only for a network of your own that uses cuDNN)"""
    cuda: bool = True
    """use CUDA when available (falls back to CPU, and says so, when it is not)"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "policy-optimization"
    """the wandb project name"""
    wandb_entity: str | None = None
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
    """anneal the learning rate linearly to 0 over the run; --no-anneal-lr keeps it constant (a run to extend with --resume)"""
    num_minibatches: int = 1
    """minibatches per epoch (must divide the batch size)"""
    update_epochs: int = 10
    """passes over each batch"""
    norm_adv: bool = True
    """normalize advantages per minibatch, so the policy's step does not scale with the rewards (off: tiny minibatches)"""
    clip_coef: float = 0.2
    """clipping range epsilon of the probability ratio (and of the value change with --clip-vloss)"""
    clip_vloss: bool = False
    """clip the value loss around the rollout's values (PPO2's variant): for a value that overshoots returns that jump"""
    ent_coef: float = 0.0
    """weight of the entropy bonus (> 0, e.g. 0.01, where the policy settles on one action before it has explored)"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """clip the global gradient norm to this value"""
    target_kl: float | None = None
    """end the update after an epoch whose mean approximate KL exceeds this (e.g. 0.01 where updates overshoot)"""
    policy_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer widths of the policy (actor) MLP"""
    value_hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer widths of the value (critic) MLP"""
    norm_obs: bool = False
    """normalize observations by a running mean/std shared by the training envs: for observations far from unit scale"""
    output_dir: str = "runs"
    """parent directory of the run directory (TensorBoard events, checkpoints, videos)"""
    eval_interval: int = 20_000
    """environment steps between greedy evaluations (0: only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation (one per evaluation env)"""
    checkpoint: str | None = None
    """a checkpoint to evaluate with --eval-only"""
    eval_only: bool = False
    """evaluate --checkpoint (and record it with --capture-video) without training"""
    resume: str | None = None
    """continue training from this checkpoint to --total-timesteps, in a new run dir, with its saved env and hyperparameters"""


SCRIPT = "ppo_discrete"


class ConfigError(ValueError):
    """Bad input; the message names what was wrong and what is accepted."""


class TrainingDiverged(RuntimeError):
    """A loss or a parameter became NaN or inf; the run stops and keeps its last good checkpoint."""


# -------------------------------------------------------------------------------- Network
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
    """Separate policy (``actor``: the logits) and value MLPs; the 0.01 init of the logits starts the policy near uniform."""

    def __init__(self, obs_dim: int, num_actions: int, policy_hidden_sizes=(64, 64), value_hidden_sizes=(64, 64)):
        super().__init__()
        self.critic = mlp(obs_dim, tuple(value_hidden_sizes), 1, out_std=1.0)
        self.actor = mlp(obs_dim, tuple(policy_hidden_sizes), num_actions, out_std=0.01)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)


def categorical_log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # LaTeX: \log \pi_\theta(b|s_t) = z_b - \log \sum_{b'} e^{z_{b'}} \quad (z = \mathrm{logits})
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    log_prob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    # LaTeX: \mathcal{H}[\pi_\theta(\cdot|s_t)] = -\sum_b \pi_\theta(b|s_t) \log \pi_\theta(b|s_t)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_prob, entropy


# -------------------------------------------------------------------------------- Normalization
class RunningMeanStd:
    """Running mean/variance (float64) of observations, merged batch by batch (Chan et al.); disabled, a no-op."""

    def __init__(self, shape: tuple[int, ...], enabled: bool = True):
        self.mean, self.var, self.count, self.enabled = np.zeros(shape), np.ones(shape), 1e-4, enabled

    def update(self, x: np.ndarray) -> None:
        if not self.enabled:
            return
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.mean, self.count = self.mean + delta * n / total, total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.asarray(x, np.float32)
        # LaTeX: \tilde{s} = \operatorname{clip}\left(\frac{s - \mu}{\sqrt{\sigma^2 + 10^{-8}}}, -10, 10\right)
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10.0, 10.0).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(self.mean), "var": torch.from_numpy(self.var), "count": float(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].numpy().copy(), state["var"].numpy().copy(), float(state["count"])


# -------------------------------------------------------------------------------- Rollout
@dataclasses.dataclass
class Rollout:
    """``(num_steps, num_envs)`` storage in numpy: the env speaks numpy; one conversion per rollout."""

    obs: np.ndarray  # normalized, as the policy saw them
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    next_values: np.ndarray  # V(s_{t+1}) of the real successor: the final observation where an episode ended
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @classmethod
    def empty(cls, num_steps: int, envs: gym.vector.VectorEnv) -> "Rollout":
        zeros = lambda dtype=np.float32, shape=(): np.zeros((num_steps, envs.num_envs, *shape), dtype)  # noqa: E731
        per_step = {name: zeros() for name in ("logprobs", "values", "next_values", "rewards")}
        ends = {name: zeros(bool) for name in ("terminated", "truncated")}
        return cls(obs=zeros(shape=envs.single_observation_space.shape), actions=zeros(np.int64), **per_step, **ends)


@torch.inference_mode()
def collect_rollout(agent, envs, raw_obs, obs_rms, device, buf: Rollout) -> tuple[np.ndarray, list]:
    """Fill ``buf``, update ``obs_rms``; return the next raw obs and the ended episodes' (step offset, return, length)."""
    num_steps, num_envs = buf.rewards.shape
    episodes = []
    obs_t = torch.as_tensor(obs_rms.normalize(raw_obs), device=device)
    value_t = agent.get_value(obs_t)
    for step in range(num_steps):
        # Sampling straight from the logits: a torch.distributions object costs more than the MLP here.
        log_probs = agent.actor(obs_t).log_softmax(-1)
        # LaTeX: a_t \sim \pi_\theta(\cdot|s_t) = \operatorname{softmax}(\mathrm{logits})
        action = torch.multinomial(log_probs.exp(), 1)
        buf.obs[step] = obs_t.cpu().numpy()
        buf.values[step] = value_t.cpu().numpy()
        buf.actions[step] = action.squeeze(-1).cpu().numpy()
        buf.logprobs[step] = log_probs.gather(-1, action).squeeze(-1).cpu().numpy()
        raw_obs, reward, terminated, truncated, infos = envs.step(buf.actions[step])
        buf.rewards[step], buf.terminated[step], buf.truncated[step] = reward, terminated, truncated
        obs_rms.update(raw_obs)
        obs_t = torch.as_tensor(obs_rms.normalize(raw_obs), device=device)
        value_t = agent.get_value(obs_t)
        buf.next_values[step] = value_t.cpu().numpy()
        # SAME_STEP: an ended env's raw_obs is the reset one; a truncated step bootstraps from its real final observation.
        if truncated.any():
            final_obs = obs_rms.normalize(np.stack([infos["final_obs"][i] for i in np.flatnonzero(truncated)]))
            buf.next_values[step, truncated] = agent.get_value(torch.as_tensor(final_obs, device=device)).cpu().numpy()
        for i in np.flatnonzero(infos.get("_episode", [])):
            episodes.append(((step + 1) * num_envs, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
    return raw_obs, episodes


# -------------------------------------------------------------------------------- Advantages
def compute_gae(rewards, values, next_values, terminated, truncated, gamma: float, gae_lambda: float):
    """Advantages and value targets of a ``(num_steps, num_envs)`` rollout; the recursion stops at every episode end."""
    not_done = 1.0 - (terminated | truncated).float()
    # LaTeX: \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V(s_{t+1}) - V(s_t)
    deltas = rewards + gamma * (1.0 - terminated.float()) * next_values - values
    advantages, last_advantage = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # LaTeX: \hat{A}_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) \hat{A}_{t+1}
        last_advantage = deltas[t] + gamma * gae_lambda * not_done[t] * last_advantage
        advantages[t] = last_advantage
    # LaTeX: \hat{R}_t = \hat{A}_t + V(s_t)
    returns = advantages + values
    return advantages, returns


def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    # LaTeX: \bar{A}_t = \frac{\hat{A}_t - \operatorname{mean}(\hat{A})}{\operatorname{std}(\hat{A}) + 10^{-8}}
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var(unbiased=False)
    # LaTeX: \mathrm{EV} = 1 - \frac{\operatorname{Var}[\hat{R}_t - V(s_t)]}{\operatorname{Var}[\hat{R}_t]}
    return float("nan") if var_returns == 0 else float(1.0 - (returns - values).var(unbiased=False) / var_returns)


# -------------------------------------------------------------------------------- Losses and update
def clipped_surrogate_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    # The paper maximizes L^CLIP (its Eq. 7); this is its negative, minimized by gradient descent.
    # LaTeX: L^{CLIP} = -\mathbb{E}_t\left[\min\left(\rho_t \hat{A}_t, \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon) \hat{A}_t\right)\right]
    return -torch.min(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages).mean()


def value_loss(new_values, old_values, returns, clip_coef: float, clip_vloss: bool) -> torch.Tensor:
    unclipped = (new_values - returns) ** 2
    if not clip_vloss:
        # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[\left(V_\theta(s_t) - \hat{R}_t\right)^2\right]
        return 0.5 * unclipped.mean()
    # LaTeX: V^{clip}_\theta(s_t) = V_{\theta_{old}}(s_t) + \operatorname{clip}\left(V_\theta(s_t) - V_{\theta_{old}}(s_t), -\epsilon, \epsilon\right)
    clipped_values = old_values + (new_values - old_values).clamp(-clip_coef, clip_coef)
    # LaTeX: L^{V} = \frac{1}{2} \mathbb{E}_t\left[\max\left(\left(V_\theta(s_t) - \hat{R}_t\right)^2, \left(V^{clip}_\theta(s_t) - \hat{R}_t\right)^2\right)\right]
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


def make_optimizer(agent: Agent, args: Args) -> torch.optim.Optimizer:
    # The fused kernel does one pass over all parameters: cheaper than one call per parameter for tiny nets.
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict, args: Args) -> dict[str, float]:
    """``update_epochs`` passes of shuffled minibatch steps on one rollout; returns the means of the diagnostics."""
    batch_size = batch["obs"].shape[0]
    minibatch_size = batch_size // args.num_minibatches
    losses, log_ratios = [], []  # per minibatch, detached: the diagnostics are computed once, after the update
    for epoch in range(1, args.update_epochs + 1):  # noqa: B007  (`epoch` is reported)
        order = torch.randperm(batch_size).to(batch["obs"].device)  # the CPU generator: the same order on any device
        for idx in order.split(minibatch_size):
            log_prob, entropy = categorical_log_prob_entropy(agent.actor(batch["obs"][idx]), batch["actions"][idx])
            # LaTeX: \log \rho_t = \log \pi_\theta(a_t|s_t) - \log \pi_{\theta_{old}}(a_t|s_t)
            log_ratio = log_prob - batch["logprobs"][idx]
            # rho_t is the paper's r_t(theta) (renamed: r_t is the reward here).
            # LaTeX: \rho_t(\theta) = \exp\left(\log \pi_\theta(a_t|s_t) - \log \pi_{\theta_{old}}(a_t|s_t)\right)
            ratio = log_ratio.exp()
            advantages = batch["advantages"][idx]
            if args.norm_adv:
                advantages = normalize_advantages(advantages)
            pg_loss = clipped_surrogate_loss(ratio, advantages, args.clip_coef)
            new_values = agent.get_value(batch["obs"][idx])
            v_loss = value_loss(new_values, batch["values"][idx], batch["returns"][idx], args.clip_coef, args.clip_vloss)
            entropy_loss = entropy.mean()
            # LaTeX: L = L^{CLIP} - c_H \mathcal{H}[\pi_\theta] + c_V L^{V}
            loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # LaTeX: g \leftarrow g \cdot \min\left(1, \frac{c_{max}}{\lVert g \rVert_2}\right)
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            losses.append(torch.stack([pg_loss, v_loss, entropy_loss, loss]).detach())
            log_ratios.append(log_ratio.detach())
        if args.target_kl is not None:  # checked once per epoch (as CleanRL does), on the epoch's mean KL
            if kl_diagnostics(torch.cat(log_ratios[-args.num_minibatches :]), args.clip_coef)["approx_kl"] > args.target_kl:
                break  # the policy has moved too far from the one that acted
    # Checked once, not per minibatch (a GPU's queue waits for each read); an inf gradient norm leaves the losses finite.
    stats = dict(zip(("policy_loss", "value_loss", "entropy", "loss"), torch.stack(losses).mean(0).tolist(), strict=True))
    bad = [name for name, value in stats.items() if not math.isfinite(value)]
    if bad or not nn.utils.parameters_to_vector(agent.parameters()).isfinite().all():
        raise TrainingDiverged(f"non-finite {', '.join(bad) or 'parameters'}")
    diagnostics = kl_diagnostics(torch.cat(log_ratios), args.clip_coef)
    return stats | {key: value.item() for key, value in diagnostics.items()} | {"epochs": epoch}


# -------------------------------------------------------------------------------- Training
@dataclasses.dataclass
class Run:
    args: Args
    device: torch.device
    run_dir: str
    writer: SummaryWriter
    envs: gym.vector.VectorEnv
    eval_envs: gym.vector.VectorEnv
    agent: Agent
    optimizer: torch.optim.Optimizer
    obs_rms: RunningMeanStd
    global_step: int = 0
    iteration: int = 0
    last_eval: float | None = None
    best_eval: float = -math.inf

    def path(self, kind: str) -> str:  # "last" or "best"
        return os.path.join(self.run_dir, f"{SCRIPT}_{kind}.pt")

    def close(self) -> None:
        for resource in (self.envs, self.eval_envs, self.writer):
            resource.close()
        if self.args.track:
            import wandb

            wandb.finish()


def set_up(args: Args) -> Run:
    """Checks, seeds, run dir, logging, envs, agent; a checkpoint's state when resuming or evaluating."""
    if args.eval_only and not args.checkpoint:
        raise ConfigError(f"--eval-only needs --checkpoint PATH (a {SCRIPT}_*.pt file)")
    source_path, flag = (args.checkpoint, "--checkpoint") if args.eval_only else (args.resume, "--resume")
    source = load_checkpoint(source_path, flag) if source_path else None
    args = args_with_checkpoint(args, source) if source is not None else args
    if args.resume and args.total_timesteps // (args.num_envs * args.num_steps) <= source["iteration"]:
        nothing = f"--total-timesteps {args.total_timesteps} leaves nothing to train after the checkpoint's step"
        raise ConfigError(f"{nothing} {source['global_step']}; pass a larger total to continue")
    check_args(args)
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
    envs = make_vector_env(args, args.num_envs, args.seed)
    eval_envs = make_vector_env(args, args.eval_episodes, args.seed + 10_000, render_first=args.capture_video)
    obs_dim = envs.single_observation_space.shape[0]
    torch.set_num_threads(1)  # for tiny MLPs threads cost more than they save; and the init's QR sums in one order
    agent = Agent(obs_dim, int(envs.single_action_space.n), args.policy_hidden_sizes, args.value_hidden_sizes).to(device)
    obs_rms = RunningMeanStd((obs_dim,), args.norm_obs)
    run = Run(args, device, run_dir, writer, envs, eval_envs, agent, make_optimizer(agent, args), obs_rms)
    if source is not None:  # the checkpoint's own env and hyperparameters (args_with_checkpoint)
        run.agent.load_state_dict(source["agent"])
        run.obs_rms.load_state_dict(source["obs_rms"])
        run.global_step = source["global_step"]
        if args.resume:
            run.optimizer.load_state_dict(source["optimizer"])
            run.iteration = source["iteration"]
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
    args, agent, optimizer, writer = run.args, run.agent, run.optimizer, run.writer
    batch_size = args.num_envs * args.num_steps
    # LaTeX: U = \left\lfloor \frac{T_{total}}{N \cdot T} \right\rfloor
    num_iterations = args.total_timesteps // batch_size
    cpu = torch.device("cpu")  # the rollout acts on the CPU: its passes are too small to pay for a GPU's launches
    acting_agent = agent if run.device == cpu else copy.deepcopy(agent).to(cpu)  # on a GPU, a copy synced after updates
    rollout = Rollout.empty(args.num_steps, run.envs)
    raw_obs, _ = run.envs.reset(seed=args.seed + run.global_step)  # a resumed run starts fresh episodes
    run.obs_rms.update(raw_obs)
    end_step = num_iterations * batch_size
    if args.resume:
        print(f"resuming {args.resume} at step {run.global_step} with its saved hyperparameters; training to step {end_step}")
    elif end_step != args.total_timesteps:
        rounded = f"--total-timesteps {args.total_timesteps} rounded down to whole rollouts of {batch_size} steps"
        print(f"training to step {end_step}: {rounded}")
    recent_returns = deque(maxlen=20)
    train_time, trained_steps = 0.0, 0
    save_checkpoint(run, "last")  # _last always holds the last completed update: a Ctrl-C loses only unfinished work
    ctrl_c = DeferredCtrlC()
    try:
        for iteration in range(run.iteration + 1, num_iterations + 1):
            ctrl_c.check()
            tick = time.time()
            if args.anneal_lr:
                # LaTeX: \alpha_u = \alpha_0 \left(1 - \frac{u - 1}{U}\right)
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
            # ---- collect a rollout with the current policy
            raw_obs, episodes = collect_rollout(acting_agent, run.envs, raw_obs, run.obs_rms, cpu, rollout)
            ctrl_c.check()  # the rollout is dropped: _last holds the update before it
            for offset, episode_return, episode_length in episodes:
                recent_returns.append(episode_return)
                writer.add_scalar("charts/episodic_return", episode_return, run.global_step + offset)
                writer.add_scalar("charts/episodic_length", episode_length, run.global_step + offset)
            # ---- advantages and value targets
            data = {k: torch.as_tensor(v, device=run.device) for k, v in vars(rollout).items()}
            gae_inputs = [data[k] for k in ("rewards", "values", "next_values", "terminated", "truncated")]
            advantages, returns = compute_gae(*gae_inputs, args.gamma, args.gae_lambda)
            batch = {k: data[k].flatten(0, 1) for k in ("obs", "actions", "logprobs", "values")}
            batch.update(advantages=advantages.flatten(), returns=returns.flatten())
            # ---- update
            stats = ppo_update(agent, optimizer, batch, args)
            if acting_agent is not agent:
                acting_agent.load_state_dict(agent.state_dict())
            run.iteration, run.global_step = iteration, run.global_step + batch_size
            save_checkpoint(run, "last")
            train_time, trained_steps = train_time + time.time() - tick, trained_steps + batch_size
            # ---- log
            sps = trained_steps / train_time
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], run.global_step)
            writer.add_scalar("charts/SPS", sps, run.global_step)
            stats["explained_variance"] = explained_variance(batch["values"], batch["returns"])
            for key, value in stats.items():
                writer.add_scalar(f"losses/{key}", value, run.global_step)
            # ---- evaluate and save: every eval_interval steps, and at the end
            every, last = args.eval_interval, iteration == num_iterations
            if last or (every > 0 and run.global_step // every > (run.global_step - batch_size) // every):
                eval_returns = evaluate(run, f"eval-step-{run.global_step}" if args.capture_video else None)
                run.last_eval = float(eval_returns.mean())
                save_checkpoint(run, "last")
                if run.last_eval >= run.best_eval:
                    run.best_eval = run.last_eval
                    save_checkpoint(run, "best")
            print_progress(run, sps, recent_returns, final=last)
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


def print_progress(run: Run, sps: float, recent_returns: deque, final: bool) -> None:
    """On a terminal, one line rewritten in place after every update; in a file or a pipe, a line every 5% and at the end."""
    step, total = run.global_step, run.args.total_timesteps
    tty, batch = sys.stdout.isatty(), run.args.num_envs * run.args.num_steps
    if not (tty or final or step * 20 // total > (step - batch) * 20 // total):
        return
    seconds = int((total - step) / sps) if sps > 0 else 0
    eta = f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "-"
    evaluation = "-" if run.last_eval is None else f"{run.last_eval:.1f}"
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


def make_vector_env(args: Args, num_envs: int, seed: int, render_first: bool = False) -> gym.vector.VectorEnv:
    """SAME_STEP autoreset (no reset steps; ``infos["final_obs"]``), reset by the caller; env 0 renders with `render_first`."""
    env_id = resolve_env_id(args.env_id)

    def make(render: bool) -> gym.Env:
        env = gym.make(env_id, render_mode="rgb_array" if render else None)
        if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
            env = gym.wrappers.FlattenObservation(env)
        return env

    thunks = [lambda render=(render_first and i == 0): make(render) for i in range(num_envs)]
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.action_space.seed(seed)
    return envs


# -------------------------------------------------------------------------------- Evaluation
@torch.inference_mode()
def evaluate(run: Run, video_name: str | None = None) -> np.ndarray:
    """One greedy episode per eval env, frozen normalizer; logs ``eval/*``; films env 0 to ``videos/<video_name>.mp4``."""
    envs = run.eval_envs
    obs, _ = envs.reset(seed=run.args.seed + 10_000)
    frames = [envs.unwrapped.envs[0].render()] if video_name else None
    returns, lengths = np.zeros(envs.num_envs), np.zeros(envs.num_envs, dtype=np.int64)
    finished = np.zeros(envs.num_envs, dtype=bool)
    while not finished.all():
        # LaTeX: a_t = \arg\max_b \pi_\theta(b|s_t)
        actions = run.agent.actor(torch.as_tensor(run.obs_rms.normalize(obs), device=run.device)).argmax(-1).cpu().numpy()
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        if frames is not None and not (finished[0] or terminated[0] or truncated[0]):  # SAME_STEP: env 0 has reset
            frames.append(envs.unwrapped.envs[0].render())
        returns += rewards * ~finished
        lengths += ~finished
        finished |= terminated | truncated
    if frames is not None:
        import imageio

        os.makedirs(os.path.join(run.run_dir, "videos"), exist_ok=True)
        fps = envs.unwrapped.envs[0].metadata.get("render_fps") or 30
        imageio.mimsave(os.path.join(run.run_dir, "videos", f"{video_name}.mp4"), frames, fps=fps, macro_block_size=1)
    stats = {f"return_{k}": getattr(returns, k)() for k in ("mean", "std", "min", "max")}
    for name, value in {**stats, "length_mean": lengths.mean()}.items():
        run.writer.add_scalar(f"eval/{name}", float(value), run.global_step)
    return returns


# -------------------------------------------------------------------------------- Checkpoints
def rng_state(device: torch.device) -> dict:
    """The generators the run draws from: torch's (actions, minibatch order) and, on a GPU, CUDA's."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device, saved_on: str, path: str) -> None:
    """The checkpoint's generators; one line where the resumed run cannot repeat an uninterrupted one bit for bit."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if saved_on != device.type:
        note = f"note: {path} was written on {saved_on} and resumes on {device.type}: the same state, but the two devices"
        print(f"{note} round floating point differently, so the run will not repeat an uninterrupted one bit for bit")


def save_checkpoint(run: Run, kind: str) -> None:
    """``<script>_<kind>.pt`` with the run's state at ``run.global_step``; atomic: a temporary file renamed over it."""
    path = run.path(kind)
    ckpt = {"algo": SCRIPT, "args": dataclasses.asdict(run.args), "rng": rng_state(run.device), "device": run.device.type}
    ckpt |= {"eval_return": run.last_eval, "global_step": run.global_step, "iteration": run.iteration}
    ckpt |= {"agent": run.agent.state_dict(), "optimizer": run.optimizer.state_dict(), "obs_rms": run.obs_rms.state_dict()}
    buffer = io.BytesIO()  # written by Python, whose error names its cause (torch's own writer's does not)
    torch.save(ckpt, buffer)
    try:
        with open(f"{path}.tmp", "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(f"{path}.tmp", path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")
        raise


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
RUN_FIELDS += ["eval_interval", "eval_episodes", "checkpoint", "eval_only", "resume"]


def args_with_checkpoint(args: Args, ckpt: dict) -> Args:
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items() if k not in RUN_FIELDS}
    return dataclasses.replace(args, **saved)


# -------------------------------------------------------------------------------- Argument checks
def check_args(args: Args) -> None:
    """Reject bad input with one clear line before any heavy work."""

    def require(ok: bool, name: str, accepted: str) -> None:
        if not ok:
            raise ConfigError(f"--{name.replace('_', '-')} must be {accepted}, got {getattr(args, name)}")

    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        require(getattr(args, name) >= 1, name, "a positive integer")
    require(1 <= args.eval_episodes <= 1000, "eval_episodes", "in [1, 1000] (one env each)")
    require(0 <= args.seed < 2**32, "seed", "in [0, 2**32) (numpy's seeds)")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        require(getattr(args, name) > 0, name, "> 0")
    for name in ("ent_coef", "vf_coef"):
        require(getattr(args, name) >= 0, name, ">= 0")
    require(args.target_kl is None or args.target_kl > 0, "target_kl", "> 0 (or left unset)")
    for name in ("gamma", "gae_lambda"):
        require(0.0 <= getattr(args, name) <= 1.0, name, "in [0, 1]")
    for name in ("policy_hidden_sizes", "value_hidden_sizes"):
        require(min(getattr(args, name), default=0) >= 1, name, "one or more positive widths")
    require(args.eval_interval >= 0, "eval_interval", ">= 0 (0: only the final evaluation)")
    batch = args.num_envs * args.num_steps
    require(batch % args.num_minibatches == 0, "num_minibatches", f"a divisor of the batch num_envs * num_steps = {batch}")
    require(args.eval_only or args.total_timesteps >= batch, "total_timesteps", f"at least one batch of {batch} steps")
    with warnings.catch_warnings():  # gymnasium's on render modes, dm_control's on a missing display: noise beside one line
        warnings.simplefilter("ignore")
        with gym.make(resolve_env_id(args.env_id)) as env:  # one env is built and closed: its action space
            space = env.action_space
        if args.capture_video:  # one env renders one frame now, so an env that cannot render fails here, in one line
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame's frames need no display (the user's choice wins)
            try:
                with gym.make(resolve_env_id(args.env_id), render_mode="rgb_array") as env:
                    env.reset(seed=0)
                    frame = env.render()
                if not isinstance(frame, np.ndarray):
                    raise TypeError(f"render() returned {type(frame).__name__}, not an rgb frame")
            except Exception as e:  # a renderer that cannot start: name it, without a traceback
                reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                raise ConfigError(f"--capture-video: {args.env_id} cannot render ({reason})") from None
    if not isinstance(space, gym.spaces.Discrete):
        needs = f"{SCRIPT}.py needs Discrete actions: use ppo_continuous.py or vmpo_continuous.py"
        raise ConfigError(f"{args.env_id} has a {type(space).__name__} action space; {needs}")
    try:  # a real write of 1 MiB: root passes os.access where writes fail (/sys), and a full disk fails here, in one line
        os.makedirs(args.output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.output_dir) as probe:
            probe.write(bytes(2**20))
    except OSError as e:
        raise ConfigError(f"--output-dir {args.output_dir!r} cannot be created or written ({e.strerror or e})") from None


if __name__ == "__main__":
    # MKL's strict mode, read at its first call: products sum in one order on any thread count (importing sets nothing)
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    # A failed write (a full disk) is reported in one line by the loop: TensorBoard's writer thread need not print it too.
    threading.excepthook = lambda hook: None if issubclass(hook.exc_type, OSError) else threading.__excepthook__(hook)
    try:
        summary = train(tyro.cli(Args))
    except (ConfigError, TrainingDiverged, OSError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    s = summary
    returns = f"final eval return {s['final_eval_return']:.2f} ± {s['final_eval_std']:.2f} | best {s['best_eval_return']:.2f}"
    print(f"{returns} | {s['global_step']} steps | train SPS {s['train_sps']:.0f} | run dir {s['run_dir']}")

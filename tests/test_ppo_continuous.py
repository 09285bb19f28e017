"""Tests of ppo_continuous.py: its math against independent computations, learning on the
continuous probes, and its command line on real tasks (dm_control walker, MuJoCo, Pendulum)."""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_continuous as pc
from tests.helpers import ROOT, check_probe, read_scalars, run_cli, single_run_dir, start_interruptible, wait_for_iteration

SCRIPT = "ppo_continuous.py"


def tiny_args(tmp_path: Path, **overrides) -> pc.Args:
    """A run small enough for a unit test; eval-only at the end unless told otherwise."""
    base = dict(
        env_id="Pendulum-v1",
        total_timesteps=512,
        num_envs=2,
        num_steps=128,
        num_minibatches=4,
        update_epochs=2,
        eval_interval=0,
        eval_episodes=1,
        output_dir=str(tmp_path),
        cuda=False,
        policy="gaussian",
    )
    return pc.Args(**{**base, **overrides})


def load_agent(run_dir: Path, name: str = "ppo_continuous_last.pt"):
    ckpt = torch.load(run_dir / name, map_location="cpu", weights_only=True)
    a = ckpt["args"]
    with gym.make(pc.resolve_env_id(a["env_id"])) as env:
        space = env.action_space
    agent = pc.Agent(ckpt["obs_rms"]["mean"].numel(), space, a["policy"], a["policy_hidden_sizes"], a["value_hidden_sizes"])
    agent.load_state_dict(ckpt["agent"])
    return agent, ckpt


# ---------------------------------------------------------------------------------------------
# Math against independent computations (the families' shared math: tests/test_policy_families.py)
# ---------------------------------------------------------------------------------------------
BOX3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    head = pc.Agent(5, BOX3, "gaussian", (16,), (16,), init_log_std=-0.3).policy_head
    with torch.no_grad():
        head.log_std.copy_(torch.randn(3) * 0.5)
    mean = torch.randn(7, 3)
    u = mean + torch.randn(7, 3) * 2.0
    reference = torch.distributions.Normal(mean, head.log_std.exp().expand_as(mean))
    with torch.no_grad():
        torch.testing.assert_close(head.log_prob(mean, u), reference.log_prob(u).sum(-1))
        torch.testing.assert_close(head.entropy(mean), reference.entropy().sum(-1))


def test_rollout_policy_matches_the_agent_and_its_log_prob_is_of_the_returned_action():
    torch.manual_seed(0)
    np.random.seed(0)
    agent = pc.Agent(5, BOX3, "gaussian", (16, 8), (16,), init_log_std=-0.3)
    policy = pc.RolloutPolicy(agent)
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    u, logprob, value, env_action = policy.act(obs)
    np.testing.assert_array_equal(env_action, np.clip(u, -1.0, 1.0))  # the box of BOX3
    with torch.no_grad():
        mean = agent.policy(torch.from_numpy(obs))
        reference = torch.distributions.Normal(mean, agent.policy_head.log_std.exp().expand_as(mean))
        torch.testing.assert_close(torch.from_numpy(logprob), reference.log_prob(torch.from_numpy(u)).sum(-1))
        torch.testing.assert_close(torch.from_numpy(value), agent.critic(torch.from_numpy(obs)).squeeze(-1))
    assert np.abs(u - mean.numpy()).mean() > 0.1  # sampled, not the mean
    with torch.no_grad():  # a new snapshot picks up new weights
        agent.critic[0].bias.add_(1.0)
    policy = pc.RolloutPolicy(agent)
    torch.testing.assert_close(torch.from_numpy(policy.value(obs)), agent.critic(torch.from_numpy(obs)).squeeze(-1).detach())


def test_the_betas_numpy_rollout_sample_lies_in_the_unit_box_with_scipys_log_prob():
    """The rollout's numpy Beta: alpha = 1 + softplus of the head's first half, beta of its second; the sample lies in
    (0, 1) and its log-probability is scipy's at that sample."""
    from scipy import stats

    torch.manual_seed(0)
    np.random.seed(0)
    agent = pc.Agent(5, BOX3, "beta", (16, 8), (16,))
    with torch.no_grad():  # away from the near-zero start, so the concentrations differ
        agent.policy_head.bias.copy_(torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 4.0]))
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    u, logprob, _, env_action = pc.RolloutPolicy(agent).act(obs)
    np.testing.assert_allclose(env_action, 2.0 * u - 1.0, rtol=1e-6)  # [0, 1] onto [-1, 1]
    with torch.no_grad():
        logits = agent.policy_head.weight.numpy() @ agent.actor(torch.from_numpy(obs)).numpy().T
    logits = logits.T + np.array([2.0, -1.0, 0.5, -3.0, 1.0, 4.0])
    alpha, beta = 1 + np.log1p(np.exp(logits[:, :3])), 1 + np.log1p(np.exp(logits[:, 3:]))
    assert u.shape == (4, 3) and 0 < u.min() and u.max() < 1
    np.testing.assert_allclose(logprob, stats.beta.logpdf(u, alpha, beta).sum(-1), rtol=1e-4)


def brute_force_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """A_t = sum_k (gamma lam)^(k-t) delta_k up to the end of t's episode (or of the rollout)."""
    T, N = rewards.shape
    advantages = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            total = 0.0
            for k in range(t, T):
                successor = 0.0 if terminations[k, i] else next_values[k, i]
                delta = rewards[k, i] + gamma * successor - values[k, i]
                total += (gamma * lam) ** (k - t) * delta
                if dones[k, i]:
                    break
            advantages[t, i] = total
    return advantages


def test_gae_with_truncation_bootstrap_matches_brute_force():
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 12, 3, 0.9, 0.8
    rewards, values, next_values = rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.normal(size=(T, N))
    terminations = rng.random((T, N)) < 0.15
    truncations = (rng.random((T, N)) < 0.15) & ~terminations
    dones = terminations | truncations
    assert truncations.any() and terminations.any()

    def as_t(x):
        return torch.tensor(x, dtype=torch.float64)

    advantages, returns = pc.compute_gae(
        as_t(rewards), as_t(values), as_t(next_values), as_t(terminations), as_t(truncations), gamma, lam
    )
    expected = brute_force_gae(rewards, values, next_values, terminations, dones, gamma, lam)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=1e-10, atol=1e-10)

    # A truncated last step is bootstrapped from its final observation's value, a terminated one is not.
    def one(v):
        return as_t([[v]])

    trunc_adv, _ = pc.compute_gae(one(1.0), one(0.5), one(2.0), one(0.0), one(1.0), gamma, lam)
    term_adv, _ = pc.compute_gae(one(1.0), one(0.5), one(2.0), one(1.0), one(0.0), gamma, lam)
    assert trunc_adv.item() == pytest.approx(1.0 + gamma * 2.0 - 0.5)
    assert term_adv.item() == pytest.approx(1.0 - 0.5)


def test_value_loss_plain_and_clipped():
    new, old, returns, eps = (
        torch.tensor([0.0, 1.0, 3.0, -2.0]),
        torch.tensor([0.5, 0.0, 1.0, -1.9]),
        torch.tensor([1.0, 2.0, 0.0, -1.0]),
        0.2,
    )
    expected_plain = 0.5 * np.mean([(n - r) ** 2 for n, r in zip(new.tolist(), returns.tolist(), strict=True)])
    expected_clipped = 0.5 * np.mean(
        [
            max((n - r) ** 2, (o + min(max(n - o, -eps), eps) - r) ** 2)
            for n, o, r in zip(new.tolist(), old.tolist(), returns.tolist(), strict=True)
        ]
    )
    assert pc.value_loss(new, old, returns, eps, clip_vloss=False).item() == pytest.approx(expected_plain)
    assert pc.value_loss(new, old, returns, eps, clip_vloss=True).item() == pytest.approx(expected_clipped)
    assert expected_clipped != pytest.approx(expected_plain)


def test_clipped_surrogate_and_kl_estimators():
    logratio, adv, eps = torch.tensor([-0.5, 0.0, 0.1, 0.4]), torch.tensor([1.0, -2.0, -1.0, 3.0]), 0.2
    ratio = logratio.exp()
    expected = -np.mean(
        [min(r * a, min(max(r, 1 - eps), 1 + eps) * a) for r, a in zip(ratio.tolist(), adv.tolist(), strict=True)]
    )
    assert pc.clipped_surrogate_loss(ratio, adv, eps).item() == pytest.approx(expected, rel=1e-6)
    old_kl, kl = pc.approx_kl(logratio)
    assert old_kl.item() == pytest.approx(-logratio.mean().item())
    assert kl.item() == pytest.approx(np.mean([math.exp(x) - 1 - x for x in logratio.tolist()]), rel=1e-6)


def test_the_update_measures_the_policys_change_not_rpos_shift(tmp_path):
    """At learning rate 0 the policy never changes: approx_kl and clipfrac read 0 and --target-kl 0.02 stops no epoch,
    while the loss's ratio, under RPO's shift (alpha 0.5, 6 dimensions, std 1), is clipped on most samples."""
    torch.manual_seed(0)
    agent = pc.Agent(5, gym.spaces.Box(-1.0, 1.0, (6,), np.float32), "gaussian", (16,), (16,), init_log_std=0.0)
    args = tiny_args(tmp_path, learning_rate=0.0, rpo_alpha=0.5, target_kl=0.02, update_epochs=3)
    obs = torch.randn(512, 5)
    with torch.no_grad():
        params = agent.policy(obs)
        actions = agent.policy_head.sample(params)
        batch = {"obs": obs, "actions": actions, "logprobs": agent.policy_head.log_prob(params, actions)}
    batch |= {key: torch.randn(512) for key in ("advantages", "returns", "values")}
    stats = pc.ppo_update(agent, pc.make_optimizer(agent, args), batch, args)
    assert abs(stats["approx_kl"]) < 1e-6 and abs(stats["old_approx_kl"]) < 1e-6 and stats["clipfrac"] == 0.0
    assert stats["epochs"] == 3 and stats["rpo_clipfrac"] > 0.5


def test_running_mean_std_matches_numpy_over_all_batches():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 5, 17, 2)]
    rms = pc.RunningMeanStd((4,))
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-3)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# Learning: the continuous probes
# ---------------------------------------------------------------------------------------------

PROBE_GAMMA = {3: 0.9}  # a discount far enough from 1 that probe 3's V(0) = gamma is a real check


@pytest.mark.parametrize("policy", ["gaussian", "beta"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_learns_continuous_probe(tmp_path, k, policy):
    """Both families learn every continuous probe: probes 4 and 5 ask for a value inside the box (fine control),
    probe 6 for the bound (bang-bang)."""
    env_id, gamma = f"Probe{k}Continuous-v0", PROBE_GAMMA.get(k, 0.99)
    # Reward scaling off: the probe table states values in raw reward units.
    args = tiny_args(
        tmp_path,
        env_id=env_id,
        policy=policy,
        rpo_alpha=pc.RPO_ALPHA[policy],
        gamma=gamma,
        seed=k,
        total_timesteps=2048 if k < 4 else 8192,
        num_envs=8,
        num_steps=16,
        num_minibatches=2,
        update_epochs=10,
        learning_rate=3e-3,
        reward_scaling=False,
        eval_episodes=2,
    )
    summary = pc.train(args)
    agent, ckpt = load_agent(Path(summary["run_dir"]))
    head = agent.policy_head
    rms = pc.RunningMeanStd((1,))
    rms.load_state_dict(ckpt["obs_rms"])

    def normalize(obs):
        return torch.as_tensor(np.clip((obs - rms.mean) / np.sqrt(rms.var + 1e-8), -10, 10), dtype=torch.float32)

    def policy_return(obs: float) -> float:
        """E[1 - (a - a*)^2] over 200,000 of the policy's actions, played as the env plays them."""
        params = agent.policy(normalize(np.array([[obs]], np.float32)))
        params = params.expand(200_000, *params.shape[1:])
        actions = head.env_action(head.sample(params, torch.Generator().manual_seed(0))).numpy().reshape(-1)
        best = {4: 0.5, 5: 0.5 * obs, 6: obs}.get(k, 0.0)
        return float(np.mean(1.0 - (actions - best) ** 2))

    with torch.no_grad():
        check_probe(
            env_id,
            gamma,
            value_fn=lambda o: agent.value(normalize(o)).numpy(),
            action_fn=lambda o: head.mean_action(agent.policy(normalize(o))).numpy().reshape(-1),
            policy_return_fn=policy_return,
            value_tol=0.05,
            action_tol=0.1,
        )


# ---------------------------------------------------------------------------------------------
# The command line on real tasks
# ---------------------------------------------------------------------------------------------


def test_cli_walker_smoke_tensorboard_checkpoint_wandb_and_eval_only(tmp_path):
    out = tmp_path / "runs"
    result = run_cli(
        SCRIPT,
        [
            "--env-id",
            "dm_control/walker/walk",
            "--total-timesteps",
            "512",
            "--num-envs",
            "2",
            "--num-steps",
            "128",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "2",
            "--eval-interval",
            "256",
            "--eval-episodes",
            "1",
            "--output-dir",
            str(out),
            "--track",
            "--no-cuda",
        ],
        cwd=tmp_path,
        env={"WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 512/512 (100.0%)" in result.stdout
    run_dir = single_run_dir(out)
    scalars = read_scalars(run_dir)
    for tag in [
        "charts/SPS",
        "charts/learning_rate",
        "charts/actions_at_bounds",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/old_approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "eval/return_mean",
        "eval/return_std",
        "eval/return_min",
        "eval/return_max",
        "eval/length_mean",
        "eval/sampled_return_mean",
        "eval/episodes_below_100",
    ]:
        assert tag in scalars, f"missing TensorBoard tag {tag}; have {sorted(scalars)}"
    assert [s for s, _ in scalars["eval/return_mean"]] == [256, 512]  # periodic, then final at the last step
    assert [v for _, v in scalars["eval/length_mean"]] == [1000.0, 1000.0]  # dm_control truncates at 1000
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run written"

    agent, ckpt = load_agent(run_dir)  # weights_only=True
    assert ckpt["global_step"] == 512 and ckpt["iteration"] == 2 and ckpt["args"]["env_id"] == "dm_control/walker/walk"
    assert (run_dir / "ppo_continuous_best.pt").exists()
    obs_rms = ckpt["obs_rms"]
    assert obs_rms["mean"].shape == (24,) and obs_rms["count"] > 512 and obs_rms["var"].min() > 0
    assert set(ckpt["rng"]) == {"torch", "numpy"} and "state" in ckpt["optimizer"]

    # Evaluation only: same deterministic policy, same eval seeds and the restored normalizer give the same return.
    eval_out = tmp_path / "eval_runs"
    result = run_cli(
        SCRIPT,
        [
            "--eval-only",
            "--checkpoint",
            str(run_dir / "ppo_continuous_last.pt"),
            "--eval-episodes",
            "1",
            "--output-dir",
            str(eval_out),
            "--no-cuda",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ppo_continuous_last.pt" not in os.listdir(single_run_dir(eval_out))  # nothing trained, nothing saved
    eval_scalars = read_scalars(single_run_dir(eval_out))
    assert eval_scalars["eval/return_mean"] == [(512, pytest.approx(scalars["eval/return_mean"][-1][1], rel=1e-5))]


def test_capture_video_writes_mp4_with_frames(tmp_path):
    imageio = pytest.importorskip("imageio")
    result = run_cli(
        SCRIPT,
        [
            "--env-id",
            "InvertedPendulum-v5",
            "--total-timesteps",
            "128",
            "--num-envs",
            "1",
            "--num-steps",
            "128",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "2",
            "--capture-video",
            "--output-dir",
            str(tmp_path),
            "--no-cuda",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    videos = sorted((single_run_dir(tmp_path) / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-step-128.mp4"]
    frames = imageio.mimread(videos[0], memtest=False)
    assert len(frames) >= 2 and frames[0].ndim == 3 and frames[0].shape[2] == 3
    assert np.ptp(np.asarray(frames[0])) > 0, "blank frame"


BAD_INPUTS = [
    (dict(env_id="CartPole-v1"), "ppo_discrete.py"),
    (dict(env_id="dm_control/walker"), "dm_control/<domain>/<task> or dm_control/<domain>-<task>-v0"),
    (dict(env_id="dm_control/walker-walk"), "dm_control/<domain>/<task> or dm_control/<domain>-<task>-v0"),
    (dict(env_id="dm_control/walkerr/walk"), "valid domains: acrobot, ball_in_cup, cartpole"),
    (dict(env_id="dm_control/walker-fly-v0"), "valid tasks: run, stand, walk"),
    (dict(env_id="NoSuchEnv-v3"), "unknown env id 'NoSuchEnv-v3'"),
    (dict(num_minibatches=3), "--num-minibatches must be a divisor of the rollout of 256, got 3"),
    (dict(learning_rate=-1.0), "--learning-rate must be > 0"),
    (dict(gamma=1.5), "--gamma must be in [0, 1], got 1.5"),
    (dict(total_timesteps=100), "--total-timesteps must be >= num_envs * num_steps"),
    (dict(eval_only=True), "--eval-only needs --checkpoint"),
]


@pytest.mark.parametrize("overrides,message", BAD_INPUTS, ids=[f"{k}={v}" for o, _ in BAD_INPUTS for k, v in o.items()])
def test_bad_input_is_one_clear_line_before_heavy_work(tmp_path, overrides, message):
    out = tmp_path / "runs"
    with pytest.raises(pc.ConfigError) as info:
        pc.train(tiny_args(out, **overrides))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not out.exists(), "a run directory was created before the input was checked"


class NanRewardEnv(gym.Env):
    """A real (if broken) env: its reward turns NaN after a few hundred steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        reward = float("nan") if self.steps > 300 else float(action[0])
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), reward, False, self.steps % 50 == 0, {}


def test_nan_loss_stops_with_step_and_last_good_checkpoint(tmp_path):
    gym.register("NanRewardTest-v0", entry_point=NanRewardEnv)
    with pytest.raises(pc.TrainingDiverged) as info:
        pc.train(tiny_args(tmp_path, env_id="NanRewardTest-v0", total_timesteps=1024, num_envs=1, num_steps=128))
    message = str(info.value)
    last = single_run_dir(tmp_path) / "ppo_continuous_last.pt"
    assert "at global step 384" in message and str(last) in message  # reward NaN from step 301: third rollout
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 256 and all(torch.isfinite(v).all() for v in ckpt["agent"].values())


def test_ctrl_c_saves_checkpoint_and_resume_continues_like_an_uninterrupted_run(tmp_path):
    """SIGINT a real run, read its files back, resume it, compare with a run that was never stopped.

    Probe 4's episodes last one step, so every iteration starts from fresh episodes and the
    learner state in the checkpoint (weights, Adam moments, normalizer, reward scaler, RNGs,
    step counter, lr schedule) is all there is: the resumed run must match bit for bit.
    """
    flags = dict(
        env_id="Probe4Continuous-v0",
        policy="beta",  # what --policy auto trains there, on both sides of the comparison
        total_timesteps=9600,
        num_envs=4,
        num_steps=16,
        num_minibatches=2,
        update_epochs=2,
        eval_interval=3200,
        eval_episodes=1,
    )
    cli = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    out = tmp_path / "interrupted"
    proc = start_interruptible([sys.executable, str(ROOT / SCRIPT), *cli, "--output-dir", str(out), "--no-cuda"], cwd=tmp_path)
    wait_for_iteration(proc, out, "ppo_continuous", 10)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted; the last trained step's checkpoint is " in stdout and "Traceback" not in stderr
    run_dir = single_run_dir(out)
    ckpt = torch.load(run_dir / "ppo_continuous_last.pt", weights_only=True)
    assert 640 <= ckpt["global_step"] < 9600 and ckpt["global_step"] == 64 * ckpt["iteration"]
    assert [s for s, _ in read_scalars(run_dir)["charts/SPS"]][-1] >= ckpt["global_step"] - 64  # logged after saving

    resumed = pc.train(
        tiny_args(
            tmp_path / "resumed", resume=str(run_dir / "ppo_continuous_last.pt"), total_timesteps=flags["total_timesteps"]
        )
    )
    straight = pc.train(tiny_args(tmp_path / "straight", **flags))
    assert resumed["global_step"] == straight["global_step"] == 9600
    resumed_agent, resumed_ckpt = load_agent(Path(resumed["run_dir"]))
    straight_agent, straight_ckpt = load_agent(Path(straight["run_dir"]))
    for key, value in straight_agent.state_dict().items():
        assert torch.equal(value, resumed_agent.state_dict()[key]), key
    assert resumed_ckpt["optimizer"]["param_groups"][0]["lr"] == straight_ckpt["optimizer"]["param_groups"][0]["lr"]
    torch.testing.assert_close(resumed_ckpt["reward_rms"], straight_ckpt["reward_rms"], rtol=0, atol=0)


OPTIONS = [
    dict(clip_vloss=True),
    dict(target_kl=1e-7),
    dict(ent_coef=0.01),
    dict(reward_scaling=False),
    dict(norm_obs=False),
    dict(norm_adv=False),
    dict(anneal_lr=False),
    dict(rpo_alpha=0.0),
]


@pytest.mark.parametrize("option", OPTIONS, ids=[",".join(f"{k}={v}" for k, v in o.items()) for o in OPTIONS])
def test_every_option_trains_with_finite_losses(option, tmp_path):
    out = pc.train(tiny_args(tmp_path, **option))
    scalars = read_scalars(out["run_dir"])
    assert out["global_step"] == 512 and math.isfinite(out["final_eval_return"])
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl"):
        assert len(scalars[tag]) == 2 and all(math.isfinite(v) for _, v in scalars[tag]), (tag, scalars[tag])
    if "target_kl" in option:  # a tiny target stops every update after its first epoch
        assert [v for _, v in scalars["losses/epochs"]] == [1.0, 1.0]
    saved = torch.load(single_run_dir(tmp_path) / "ppo_continuous_last.pt", weights_only=True)["args"]
    assert all(saved[k] == v for k, v in option.items())


def test_rpo_perturbation_is_uniform_noise_around_the_mean_and_off_at_zero():
    torch.manual_seed(0)
    mean = torch.randn(20_000, 3, requires_grad=True)
    assert pc.rpo_perturbation(mean, 0.0) is mean
    shifted = pc.rpo_perturbation(mean, 0.5)
    noise = (shifted - mean).detach().numpy()
    assert noise.min() >= -0.5 and noise.max() <= 0.5 and noise.min() < -0.49 and noise.max() > 0.49
    # Uniform(-a, a): mean 0, variance a^2 / 3, independent between dimensions.
    np.testing.assert_allclose(noise.mean(0), 0.0, atol=0.01)
    np.testing.assert_allclose(noise.var(0), 0.25 / 3, rtol=0.03)
    assert abs(np.corrcoef(noise.T)[0, 1]) < 0.03
    assert not torch.equal(pc.rpo_perturbation(mean, 0.5), shifted)  # fresh noise every call
    shifted.sum().backward()  # the noise carries no gradient: d(shifted)/d(mean) = 1
    assert torch.equal(mean.grad, torch.ones_like(mean))


def test_a_checkpoint_with_the_earlier_weight_names_is_one_clear_error(tmp_path):
    """Before the families held their output layers, the policy's last layer was `actor.4` and its log-std
    `policy.log_std`: such a checkpoint is refused in one line, not with torch's state-dict traceback."""
    summary = pc.train(tiny_args(tmp_path / "run", env_id="Pendulum-v1"))
    ckpt = torch.load(Path(summary["run_dir"]) / "ppo_continuous_last.pt", weights_only=True)
    renamed = {
        "policy_head.weight": "actor.4.weight",
        "policy_head.bias": "actor.4.bias",
        "policy_head.log_std": "policy.log_std",
    }
    ckpt["agent"] = {renamed.get(k, k): v for k, v in ckpt["agent"].items()}
    torch.save(ckpt, tmp_path / "earlier.pt")
    with pytest.raises(
        pc.ConfigError, match=r"was written by an earlier ppo_continuous\.py, whose weights are named otherwise"
    ):
        pc.set_up(pc.Args(eval_only=True, checkpoint=str(tmp_path / "earlier.pt"), output_dir=str(tmp_path), cuda=False))

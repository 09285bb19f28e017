"""Tests of ppo_discrete.py: the math against independent computations, learning on every
discrete probe, the real command line on CartPole-v1, checkpoints, determinism, bad input."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import ppo_discrete as pd
from tests.helpers import check_probe, read_scalars, run_cli, single_run_dir

SCRIPT = "ppo_discrete.py"
# A tiny CartPole configuration for the command-line runs: 4 iterations of 2 envs x 64 steps.
TINY_CLI = [
    "--total-timesteps",
    "512",
    "--num-envs",
    "2",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--eval-interval",
    "256",
    "--eval-episodes",
    "2",
]


def tiny_args(tmp_path: Path, **overrides) -> pd.Args:
    base = dict(
        total_timesteps=512,
        num_envs=2,
        num_steps=64,
        num_minibatches=2,
        update_epochs=2,
        eval_interval=256,
        eval_episodes=2,
        output_dir=str(tmp_path / "runs"),
        cuda=False,
    )
    return pd.Args(**{**base, **overrides})


def load_agent(checkpoint: Path) -> tuple[pd.Agent, dict]:
    ckpt = torch.load(checkpoint, weights_only=True)
    args = ckpt["args"]
    obs_dim = ckpt["obs_rms"]["mean"].numel()  # the normalizer is in every checkpoint, with or without --norm-obs
    num_actions = [v for k, v in ckpt["agent"].items() if k.startswith("actor.")][-1].numel()  # the logits' bias
    agent = pd.Agent(obs_dim, num_actions, args["policy_hidden_sizes"], args["value_hidden_sizes"])
    agent.load_state_dict(ckpt["agent"])
    return agent.eval(), ckpt


# ---------------------------------------------------------------------------------------
# Math against independent computations
# ---------------------------------------------------------------------------------------
def test_categorical_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(32, 5) * 3
    actions = torch.randint(0, 5, (32,))
    log_prob, entropy = pd.categorical_log_prob_entropy(logits, actions)
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(log_prob, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())


def brute_force_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Advantages as explicit sums A_t = sum_k (gamma lam)^k delta_{t+k} up to the episode end
    (or the rollout end), with delta_j = r_j + gamma (1 - term_j) V(s_{j+1}) - V(s_j)."""
    T, N = len(rewards), len(rewards[0])
    advantages = [[0.0] * N for _ in range(T)]
    for env in range(N):
        for t in range(T):
            total = 0.0
            for k, j in enumerate(range(t, T)):
                successor = 0.0 if terminated[j][env] else next_values[j][env]
                delta = rewards[j][env] + gamma * successor - values[j][env]
                total += (gamma * lam) ** k * delta
                if terminated[j][env] or truncated[j][env]:
                    break
            advantages[t][env] = total
    returns = [[advantages[t][e] + values[t][e] for e in range(N)] for t in range(T)]
    return advantages, returns


def brute_force_lambda_one_returns(rewards, next_values, terminated, truncated, gamma):
    """With lambda = 1 the target is the discounted reward sum to the episode end, plus the
    discounted bootstrap V(final obs) at a truncation or at the rollout end; 0 at a termination."""
    T, N = len(rewards), len(rewards[0])
    out = [[0.0] * N for _ in range(T)]
    for env in range(N):
        for t in range(T):
            ret, discount = 0.0, 1.0
            for j in range(t, T):
                ret += discount * rewards[j][env]
                discount *= gamma
                if terminated[j][env]:
                    break
                if truncated[j][env] or j == T - 1:
                    ret += discount * next_values[j][env]
                    break
            out[t][env] = ret
    return out


def gae_case():
    """4 envs, 6 steps: a termination, a truncation, both in one env, and an env with no end."""
    rng = np.random.default_rng(3)
    T, N = 6, 4
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    terminated = np.zeros((T, N), dtype=bool)
    truncated = np.zeros((T, N), dtype=bool)
    terminated[2, 0] = True  # env 0: termination mid-rollout
    truncated[3, 1] = True  # env 1: truncation mid-rollout
    terminated[1, 2], truncated[4, 2] = True, True  # env 2: both, in two episodes
    terminated[5, 3] = True  # env 3: termination at the last step
    # As in a real rollout, V(s_{t+1}) is the next stored value except where an episode ended
    # (there it is the value of the final observation) and after the last step.
    continues = ~(terminated | truncated)[:-1]
    next_values[:-1][continues] = values[1:][continues]
    return rewards, values, next_values, terminated, truncated


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (0.8, 1.0)])
def test_gae_matches_brute_force(gamma, lam):
    rewards, values, next_values, terminated, truncated = gae_case()
    adv, ret = pd.compute_gae(*(torch.as_tensor(x) for x in (rewards, values, next_values, terminated, truncated)), gamma, lam)
    ref_adv, ref_ret = brute_force_gae(
        rewards.tolist(), values.tolist(), next_values.tolist(), terminated.tolist(), truncated.tolist(), gamma, lam
    )
    np.testing.assert_allclose(adv.numpy(), np.array(ref_adv), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), np.array(ref_ret), rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_gives_bootstrapped_discounted_returns():
    rewards, values, next_values, terminated, truncated = gae_case()
    _, ret = pd.compute_gae(*(torch.as_tensor(x) for x in (rewards, values, next_values, terminated, truncated)), 0.9, 1.0)
    expected = brute_force_lambda_one_returns(
        rewards.tolist(), next_values.tolist(), terminated.tolist(), truncated.tolist(), 0.9
    )
    np.testing.assert_allclose(ret.numpy(), np.array(expected), rtol=1e-5, atol=1e-5)


def test_gae_truncation_bootstraps_and_termination_does_not():
    # One env, one step. Terminated: target r; truncated: target r + gamma * V(final obs).
    r, v, v_final, g = torch.tensor([[1.0]]), torch.tensor([[0.25]]), torch.tensor([[2.0]]), 0.5
    yes, no = torch.tensor([[True]]), torch.tensor([[False]])
    _, ret_term = pd.compute_gae(r, v, v_final, yes, no, g, 0.95)
    _, ret_trunc = pd.compute_gae(r, v, v_final, no, yes, g, 0.95)
    assert ret_term.item() == pytest.approx(1.0)
    assert ret_trunc.item() == pytest.approx(1.0 + 0.5 * 2.0)


def test_clipped_surrogate_loss_matches_transcription():
    log_ratio = torch.tensor([0.5, -0.5, 0.05, -0.05, 0.3, -0.3, 0.0])
    advantages = torch.tensor([1.0, 1.0, -2.0, 0.5, -1.0, -1.0, 3.0])
    eps = 0.2
    terms = []
    for lr, a in zip(log_ratio.tolist(), advantages.tolist(), strict=True):
        ratio = math.exp(lr)
        clipped_ratio = min(max(ratio, 1 - eps), 1 + eps)
        terms.append(min(ratio * a, clipped_ratio * a))  # L^CLIP: the pessimistic of the two
    expected = -sum(terms) / len(terms)
    assert pd.clipped_surrogate_loss(log_ratio.exp(), advantages, eps).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("clip_vloss", [False, True])
def test_value_loss_matches_transcription(clip_vloss):
    new = torch.tensor([1.0, 0.0, 2.5, -1.0, 0.3])
    old = torch.tensor([0.5, 0.5, 2.0, -0.5, 0.25])
    returns = torch.tensor([2.0, -1.0, 2.2, 0.0, 0.3])
    eps = 0.2
    terms = []
    for n, o, r in zip(new.tolist(), old.tolist(), returns.tolist(), strict=True):
        unclipped = (n - r) ** 2
        if clip_vloss:
            v_clip = o + min(max(n - o, -eps), eps)
            terms.append(max(unclipped, (v_clip - r) ** 2))
        else:
            terms.append(unclipped)
    expected = 0.5 * sum(terms) / len(terms)
    assert pd.value_loss(new, old, returns, eps, clip_vloss).item() == pytest.approx(expected, rel=1e-5)


def test_kl_diagnostics_match_transcription_and_exact_kl():
    log_ratio = torch.tensor([0.1, -0.2, 0.3, 0.0])
    diag = pd.kl_diagnostics(log_ratio, 0.2)
    rs = [math.exp(x) for x in log_ratio.tolist()]
    assert diag["old_approx_kl"].item() == pytest.approx(sum(-x for x in log_ratio.tolist()) / 4, rel=1e-5)
    assert diag["approx_kl"].item() == pytest.approx(sum(r - 1 - math.log(r) for r in rs) / 4, rel=1e-5)
    assert diag["approx_kl_reverse"].item() == pytest.approx(sum(r * math.log(r) - r + 1 for r in rs) / 4, rel=1e-5)
    assert diag["clipfrac"].item() == pytest.approx(0.25)  # only exp(0.3) = 1.35 is outside [0.8, 1.2]
    # Averaged under the old policy, the estimators approach the exact KLs in both directions.
    old = torch.distributions.Categorical(probs=torch.tensor([0.2, 0.5, 0.3]))
    new = torch.distributions.Categorical(probs=torch.tensor([0.3, 0.4, 0.3]))
    torch.manual_seed(0)
    a = old.sample((200_000,))
    diag = pd.kl_diagnostics(new.log_prob(a) - old.log_prob(a), 0.2)
    assert diag["approx_kl"].item() == pytest.approx(torch.distributions.kl_divergence(old, new).item(), abs=2e-3)
    assert diag["approx_kl_reverse"].item() == pytest.approx(torch.distributions.kl_divergence(new, old).item(), abs=2e-3)


def test_normalize_advantages_matches_transcription():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0])
    mean = sum(x.tolist()) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in x.tolist()) / 3)  # unbiased, as torch.std
    np.testing.assert_allclose(pd.normalize_advantages(x).numpy(), [(v - mean) / (std + 1e-8) for v in x.tolist()], rtol=1e-6)


def test_explained_variance_matches_numpy_with_population_variances():
    rng = np.random.default_rng(0)
    returns = rng.normal(size=7)  # few samples: a sample variance (ddof=1) would differ visibly
    values = returns + rng.normal(scale=0.7, size=7)
    expected = 1.0 - np.var(returns - values, ddof=0) / np.var(returns, ddof=0)
    as_t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    assert pd.explained_variance(as_t(values), as_t(returns)) == pytest.approx(expected, rel=1e-5)
    assert pd.explained_variance(as_t(returns), as_t(returns)) == pytest.approx(1.0)
    assert math.isnan(pd.explained_variance(as_t(values), torch.full((7,), 2.5)))  # constant returns: undefined


def probe3_vector_env(num_envs: int, max_episode_steps=None):
    import gymnasium as gym

    import probe_envs  # noqa: F401

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("Probe3Discrete-v0", max_episode_steps=max_episode_steps) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


@pytest.mark.parametrize("time_limit", [None, 1])
def test_rollout_stores_real_successors_and_no_reset_steps(time_limit):
    """Probe 3 goes obs 0 -> obs 1 -> terminated. With a 1-step time limit every episode is
    truncated at obs 1 and the env resets to obs 0 within the same step: next_values must be
    V(1) from infos["final_obs"], never V(0) of the reset observation."""
    torch.manual_seed(0)
    agent = pd.Agent(1, 2, (8,))
    v0, v1 = (agent.get_value(torch.tensor([[x]])).item() for x in (0.0, 1.0))
    assert abs(v0 - v1) > 1e-3
    envs = probe3_vector_env(2, time_limit)
    raw_obs, _ = envs.reset(seed=0)
    buf = pd.Rollout.empty(4, envs)
    no_norm = pd.RunningMeanStd((1,), enabled=False)
    raw_obs, episodes = pd.collect_rollout(agent, envs, raw_obs, no_norm, torch.device("cpu"), buf)
    envs.close()
    if time_limit == 1:
        expected_obs, expected_next = [0.0, 0.0, 0.0, 0.0], [v1, v1, v1, v1]
        expected_term, expected_trunc = [False] * 4, [True] * 4
        expected_episodes = [(2 * (t + 1), 0.0, 1) for t in range(4) for _ in range(2)]
    else:
        expected_obs, expected_next = [0.0, 1.0, 0.0, 1.0], [v1, v0, v1, v0]  # V(0) after a termination is masked
        expected_term, expected_trunc = [False, True, False, True], [False] * 4
        expected_episodes = [(2 * t, 1.0, 2) for t in (2, 4) for _ in range(2)]
    for env in range(2):
        np.testing.assert_allclose(buf.obs[:, env, 0], expected_obs)
        np.testing.assert_allclose(buf.next_values[:, env], expected_next, rtol=1e-6)
        np.testing.assert_allclose(buf.values[:, env], [v0 if o == 0 else v1 for o in expected_obs], rtol=1e-6)
        assert buf.terminated[:, env].tolist() == expected_term and buf.truncated[:, env].tolist() == expected_trunc
    assert episodes == expected_episodes
    # Stored log-probabilities are those of the stored actions under the policy that chose them.
    logits = agent.actor(torch.as_tensor(buf.obs.reshape(-1, 1)))
    reference = torch.distributions.Categorical(logits=logits).log_prob(torch.as_tensor(buf.actions.reshape(-1)))
    np.testing.assert_allclose(buf.logprobs.reshape(-1), reference.detach().numpy(), rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Probes: real training runs, checked through the saved checkpoint
# ---------------------------------------------------------------------------------------
PROBE_ARGS = dict(
    num_envs=4,
    num_steps=16,
    num_minibatches=2,
    update_epochs=4,
    learning_rate=3e-3,
    gae_lambda=0.95,
    ent_coef=0.0,
    eval_interval=0,
    eval_episodes=2,
    policy_hidden_sizes=(32, 32),
    value_hidden_sizes=(32, 32),
)
PROBES = {  # env id -> (gamma, total_timesteps); at 40% of these budgets the errors were < 0.005 for seeds 1-3
    "Probe1Discrete-v0": (0.99, 1024),
    "Probe2Discrete-v0": (0.99, 1024),
    "Probe3Discrete-v0": (0.9, 1280),
    "Probe4Discrete-v0": (0.99, 1280),
    "Probe5Discrete-v0": (0.99, 1536),
}
VALUE_TOL = 0.05


@pytest.mark.parametrize("env_id", list(PROBES))
def test_learns_probe(env_id, tmp_path):
    gamma, steps = PROBES[env_id]
    result = pd.train(
        pd.Args(env_id=env_id, gamma=gamma, total_timesteps=steps, seed=1, cuda=False, output_dir=str(tmp_path), **PROBE_ARGS)
    )
    agent, _ = load_agent(Path(result["run_dir"]) / "ppo_discrete_last.pt")

    def probs(obs):
        with torch.no_grad():
            return torch.softmax(agent.actor(torch.as_tensor(obs, dtype=torch.float32)), -1).numpy()

    def value_fn(obs):
        with torch.no_grad():
            return agent.get_value(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    def policy_return_fn(obs_value):
        # Discrete probes 4/5: reward +1 for the best action, -1 otherwise.
        best = 1 if env_id.startswith("Probe4") or obs_value > 0 else 0
        p_best = float(probs(np.array([[obs_value]], dtype=np.float32))[0, best])
        return p_best * 1.0 + (1.0 - p_best) * -1.0

    check_probe(
        env_id, gamma, value_fn, lambda obs: probs(obs).argmax(-1), policy_return_fn, value_tol=VALUE_TOL, action_tol=0
    )
    if env_id[5] in "45":  # the policy has become (nearly) deterministic, and greedy eval is perfect
        assert policy_return_fn(1.0) > 0.9
        assert result["final_eval_return"] == 1.0


# ---------------------------------------------------------------------------------------
# The real command line on CartPole-v1
# ---------------------------------------------------------------------------------------
EXPECTED_TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/approx_kl_reverse",
    "losses/clipfrac",
    "losses/explained_variance",
    "eval/return_mean",
    "eval/return_std",
    "eval/return_min",
    "eval/return_max",
    "eval/length_mean",
}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "runs"
    proc = run_cli(SCRIPT, [*TINY_CLI, "--output-dir", str(out), "--seed", "3"])
    assert proc.returncode == 0, proc.stderr
    return proc, single_run_dir(out)


def test_cli_smoke_logs_tags_and_writes_reloadable_checkpoints(cli_run):
    proc, run_dir = cli_run
    assert "step 512/512 (100.0%)" in proc.stdout and "ETA" in proc.stdout
    assert run_dir.name.startswith("CartPole-v1__ppo_discrete__3__")
    scalars = read_scalars(run_dir)
    assert EXPECTED_TAGS <= set(scalars), EXPECTED_TAGS - set(scalars)
    assert [step for step, _ in scalars["eval/return_mean"]] == [256, 512]  # periodic, then final at the last step
    lrs = [v for _, v in scalars["charts/learning_rate"]]
    assert lrs[0] == pytest.approx(pd.Args.learning_rate) and lrs == sorted(lrs, reverse=True)  # linear annealing
    for name in ("ppo_discrete_last.pt", "ppo_discrete_best.pt"):
        agent, ckpt = load_agent(run_dir / name)
        assert ckpt["global_step"] in (256, 512) and ckpt["args"]["env_id"] == "CartPole-v1"
        assert {"agent", "optimizer", "obs_rms", "rng", "iteration"} <= set(ckpt)
        assert agent.actor(torch.zeros(1, 4)).shape == (1, 2)
    _, last = load_agent(run_dir / "ppo_discrete_last.pt")
    assert (last["global_step"], last["iteration"]) == (512, 4)
    assert not list(run_dir.glob("*.tmp"))  # atomic writes leave no temporaries


def test_eval_only_on_saved_checkpoint(cli_run, tmp_path):
    _, run_dir = cli_run
    ckpt = run_dir / "ppo_discrete_best.pt"
    proc = run_cli(SCRIPT, ["--eval-only", "--checkpoint", str(ckpt), "--eval-episodes", "3", "--output-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    assert f"eval of {ckpt}: return" in proc.stdout and "over 3 episodes" in proc.stdout
    scalars = read_scalars(single_run_dir(tmp_path))
    assert len(scalars["eval/return_mean"]) == 1 and "losses/policy_loss" not in scalars
    assert not list(single_run_dir(tmp_path).glob("*.pt"))  # evaluating writes no checkpoint


def test_eval_only_takes_the_env_from_the_checkpoint(cli_run, tmp_path):
    _, run_dir = cli_run
    result = pd.train(
        tiny_args(tmp_path, env_id="Acrobot-v1", eval_only=True, checkpoint=str(run_dir / "ppo_discrete_last.pt"))
    )
    assert Path(result["run_dir"]).name.startswith("CartPole-v1__")  # the saved env, not --env-id


# ---------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------
def test_resume_continues_schedule_and_step_counter(tmp_path):
    first = pd.train(tiny_args(tmp_path / "a", total_timesteps=256, eval_interval=0))
    last = Path(first["run_dir"]) / "ppo_discrete_last.pt"
    saved = torch.load(last, weights_only=True)
    assert (saved["global_step"], saved["iteration"]) == (256, 2)
    resumed = pd.train(tiny_args(tmp_path / "b", total_timesteps=512, eval_interval=0, resume=str(last)))
    assert resumed["global_step"] == 512
    scalars = read_scalars(resumed["run_dir"])
    # Two more iterations of four, logged at steps 384 and 512, lr continuing the 4-iteration schedule.
    assert [s for s, _ in scalars["charts/learning_rate"]] == [384, 512]
    assert [v for _, v in scalars["charts/learning_rate"]] == pytest.approx([1e-3 * 2 / 4, 1e-3 * 1 / 4])
    after = torch.load(Path(resumed["run_dir"]) / "ppo_discrete_last.pt", weights_only=True)
    # Adam's step count carried on from the first run's optimizer state.
    steps = lambda ckpt: float(next(iter(ckpt["optimizer"]["state"].values()))["step"])  # noqa: E731
    assert steps(after) == steps(saved) + 2 * 2 * 2  # 2 iterations x 2 epochs x 2 minibatches
    assert after["iteration"] == 4


# ---------------------------------------------------------------------------------------
# Bad input: one clear line, checked message
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(env_id="NoSuchEnv-v9"), "unknown env id 'NoSuchEnv-v9'"),
        (
            dict(env_id="Pendulum-v1"),
            "Pendulum-v1 has a Box action space; ppo_discrete.py needs Discrete actions: use ppo_con",
        ),
        (
            dict(num_envs=3, num_steps=5, num_minibatches=4),
            "--num-minibatches must be a divisor of the batch num_envs * num_steps = 15, got 4",
        ),
        (dict(gamma=1.5), "--gamma must be in [0, 1], got 1.5"),
        (dict(gae_lambda=-0.1), "--gae-lambda must be in [0, 1], got -0.1"),
        (dict(total_timesteps=0), "--total-timesteps must be a positive integer, got 0"),
        (dict(total_timesteps=-100), "--total-timesteps must be a positive integer, got -100"),
        (dict(eval_only=True), "--eval-only needs --checkpoint"),
        (dict(eval_only=True, checkpoint="missing.pt"), "--checkpoint 'missing.pt': no such file"),
    ],
)
def test_bad_input_raises_config_error(overrides, message, tmp_path):
    with pytest.raises(pd.ConfigError) as err:
        pd.train(tiny_args(tmp_path, **overrides))
    assert message in str(err.value)
    assert not (tmp_path / "runs").exists()  # rejected before any work


def test_non_finite_loss_stops_with_step_and_last_good_checkpoint(tmp_path):
    # A huge learning rate sends the weights to inf after the first Adam steps; the loss turns NaN.
    with pytest.raises(pd.TrainingDiverged) as err:
        pd.train(tiny_args(tmp_path, learning_rate=1e38, total_timesteps=1024, eval_interval=0))
    message = str(err.value)
    assert message.startswith("non-finite ") and "at global step" in message
    assert "Last good checkpoint: " in message and "ppo_discrete_last.pt (step 0)" in message


def synthetic_batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 3, generator=g)
    return {
        "obs": obs,
        "actions": torch.randint(0, 2, (n,), generator=g),
        "values": torch.zeros(n),
        "advantages": torch.randn(n, generator=g),
        "returns": torch.randn(n, generator=g),
    }


@pytest.mark.parametrize("target_kl,expected_epochs", [(None, 3), (1e-9, 1)])
def test_update_step_count_and_target_kl_early_stop(target_kl, expected_epochs):
    torch.manual_seed(0)
    agent = pd.Agent(3, 2, (16,))
    args = pd.Args(update_epochs=3, num_minibatches=2, target_kl=target_kl, learning_rate=1e-2)
    optimizer = pd.make_optimizer(agent, args)
    batch = synthetic_batch()
    with torch.no_grad():
        batch["logprobs"], _ = pd.categorical_log_prob_entropy(agent.actor(batch["obs"]), batch["actions"])
    stats = pd.ppo_update(agent, optimizer, batch, args)
    # The stored log-probs are those of the policy before the update, so the first minibatch has
    # KL 0; the epoch's second minibatch moves it, so the epoch's mean KL exceeds 1e-9 and the update stops
    # after that first epoch (checked once per epoch, as in CleanRL).
    assert float(next(iter(optimizer.state.values()))["step"]) == expected_epochs * 2  # 2 minibatches per epoch
    assert stats["epochs"] == expected_epochs
    assert {"policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clipfrac"} <= set(stats)


def test_the_acting_copy_synced_after_an_update_collects_the_trained_agents_rollout():
    """Training on a GPU, train() acts with a deep copy of the agent and syncs it by load_state_dict after every
    update. Synced, the copy must collect exactly the rollout of the updated agent (it would not if some of the
    agent's state lived outside its state_dict); stale, it must not. Without a GPU here, train()'s own GPU branch
    is not run by the suite."""
    torch.manual_seed(0)
    agent = pd.Agent(1, 2, (16,))
    acting_agent = copy.deepcopy(agent)
    envs = probe3_vector_env(2)

    def rollout_of(policy: pd.Agent) -> pd.Rollout:
        torch.manual_seed(1)
        raw_obs, _ = envs.reset(seed=2)
        buf = pd.Rollout.empty(8, envs)
        pd.collect_rollout(policy, envs, raw_obs, pd.RunningMeanStd((1,), enabled=False), torch.device("cpu"), buf)
        return buf

    args = pd.Args(update_epochs=3, num_minibatches=2, learning_rate=1e-2)
    batch = {k: torch.as_tensor(v).flatten(0, 1) for k, v in vars(rollout_of(agent)).items()}
    batch |= {"advantages": torch.randn(16), "returns": torch.randn(16)}
    pd.ppo_update(agent, pd.make_optimizer(agent, args), batch, args)
    trained, stale = rollout_of(agent), rollout_of(acting_agent)
    assert not np.array_equal(trained.logprobs, stale.logprobs)
    acting_agent.load_state_dict(agent.state_dict())
    synced = rollout_of(acting_agent)
    envs.close()
    for field in ("obs", "actions", "logprobs", "values", "next_values", "rewards"):
        np.testing.assert_array_equal(getattr(synced, field), getattr(trained, field), err_msg=field)


@pytest.mark.parametrize(
    "env_id,gym_id",
    [
        ("CartPole-v1", "CartPole-v1"),
        ("Probe1Discrete-v0", "Probe1Discrete-v0"),
        ("dm_control/walker/walk", "dm_control/walker-walk-v0"),
        ("dm_control/walker-walk-v0", "dm_control/walker-walk-v0"),
    ],
)
def test_resolve_env_id_maps_accepted_ids(env_id, gym_id):
    assert pd.resolve_env_id(env_id) == gym_id


@pytest.mark.parametrize(
    "env_id,message",
    [
        ("dm_control/walker", "malformed dm_control id 'dm_control/walker'; accepted forms: dm_control/<domain>/<task> or"),
        (
            "dm_control/nowhere/walk",
            "unknown dm_control domain 'nowhere' in 'dm_control/nowhere/walk'; valid domains: acrobot,",
        ),
        ("dm_control/walker/fly", "unknown task 'fly' for dm_control domain 'walker'; valid tasks: run, stand, walk"),
        ("NoSuchEnv-v0", "unknown env id 'NoSuchEnv-v0'; accepted: a registered gymnasium id, dm_control/<domain>/<task>"),
    ],
)
def test_resolve_env_id_rejects_other_ids_with_what_is_accepted(env_id, message):
    with pytest.raises(pd.ConfigError) as err:
        pd.resolve_env_id(env_id)
    assert str(err.value).startswith(message), str(err.value)


# ---------------------------------------------------------------------------------------
# Every option trains: a tiny CartPole run with each, finite losses in TensorBoard
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option",
    [
        dict(clip_vloss=True),
        dict(target_kl=0.01),
        dict(anneal_lr=False),
        dict(norm_obs=True),
        dict(norm_adv=False),
        dict(ent_coef=0.01),
        dict(torch_deterministic=False),
    ],
    ids=lambda option: "-".join(f"{k}={v}" for k, v in option.items()),
)
def test_trains_with_option(option, tmp_path):
    result = pd.train(tiny_args(tmp_path, total_timesteps=256, eval_interval=0, **option))
    assert result["global_step"] == 256 and math.isfinite(result["final_eval_return"])
    scalars = read_scalars(result["run_dir"])
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/loss", "losses/approx_kl"):
        assert [step for step, _ in scalars[tag]] == [128, 256], tag
        assert all(math.isfinite(value) for _, value in scalars[tag]), tag
    ckpt = torch.load(Path(result["run_dir"]) / "ppo_discrete_last.pt", weights_only=True)
    assert all(ckpt["args"][k] == v for k, v in option.items())
    if option == dict(anneal_lr=False):
        assert [v for _, v in scalars["charts/learning_rate"]] == pytest.approx([pd.Args.learning_rate] * 2)
    if option == dict(norm_obs=True):
        assert ckpt["obs_rms"]["count"] > 256  # every observation the training envs returned

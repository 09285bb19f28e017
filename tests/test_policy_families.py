"""The policy families of the two continuous scripts: one interface, checked once for both.

Each script's `GaussianPolicy` and `BetaPolicy` have the same methods with the same parameter names (PPO's numpy `act`
and V-MPO's `decoupled_kl` aside), and mean the same thing by them; the Beta's math is checked against scipy, the env's
mapping and the share at the bounds against values worked out by hand, and an unbounded box against NaN.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.helpers import ROOT

CONTINUOUS = ["ppo_continuous", "vmpo_continuous"]
ONLY_IN = {"ppo_continuous": {"act"}, "vmpo_continuous": {"decoupled_kl"}}
BOX = gym.spaces.Box(np.array([-1.0, 0.0, -4.0], np.float32), np.array([1.0, 2.0, 4.0], np.float32))


def family(name: str, policy: str, space: gym.spaces.Box = BOX):
    """The family of a fresh agent on `space` (both scripts' Agent take the same first arguments)."""
    return importlib.import_module(name).Agent(2, space, policy, (8,), (8,)).policy_head


def beta_params(alpha: np.ndarray, beta: np.ndarray) -> torch.Tensor:
    """The logits that map to these concentrations (each above 1), stacked as `params` (..., 2, act_dim)."""
    logit = lambda c: torch.as_tensor(np.log(np.expm1(np.asarray(c, np.float64) - 1.0)), dtype=torch.float32)  # noqa: E731
    return torch.stack([logit(alpha), logit(beta)], -2)


def test_both_scripts_families_have_the_same_methods_and_parameter_names():
    def methods(name: str) -> dict[str, dict[str, tuple[str, ...]]]:
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        classes = [
            node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in ("GaussianPolicy", "BetaPolicy")
        ]
        return {
            c.name: {f.name: tuple(a.arg for a in f.args.args) for f in c.body if isinstance(f, ast.FunctionDef)}
            for c in classes
        }

    ppo, vmpo = methods("ppo_continuous"), methods("vmpo_continuous")
    assert set(ppo) == set(vmpo) == {"GaussianPolicy", "BetaPolicy"}
    for cls in ppo:
        shared = lambda m, own: {k: v for k, v in m.items() if k not in own | {"__init__"}}  # noqa: E731
        assert shared(ppo[cls], ONLY_IN["ppo_continuous"]) == shared(vmpo[cls], ONLY_IN["vmpo_continuous"]), cls
        assert set(ppo[cls]) - set(vmpo[cls]) == ONLY_IN["ppo_continuous"], cls
        assert set(vmpo[cls]) - set(ppo[cls]) == ONLY_IN["vmpo_continuous"], cls


def test_the_three_scripts_have_the_same_section_headers():
    headers = {}
    for name in ("ppo_discrete", "ppo_continuous", "vmpo_continuous"):
        text = (ROOT / f"{name}.py").read_text()
        headers[name] = re.findall(r"^# -{80} (.+)$", text, re.M)
    assert headers["ppo_discrete"] == headers["ppo_continuous"] == headers["vmpo_continuous"], headers
    assert headers["ppo_discrete"][:2] == ["Arguments", "Network"]


@pytest.mark.parametrize("name", CONTINUOUS)
def test_the_betas_log_prob_entropy_and_mean_action_match_scipy(name):
    from scipy import stats

    alpha, beta = np.array([[1.5, 3.0, 7.0], [1.1, 2.0, 1.3]]), np.array([[4.0, 1.2, 7.0], [1.1, 5.0, 2.2]])
    u = np.array([[0.1, 0.8, 0.5], [0.97, 0.3, 0.02]])
    head, params = family(name, "beta"), beta_params(alpha, beta)
    with torch.no_grad():
        log_prob = head.log_prob(params, torch.as_tensor(u, dtype=torch.float32)).numpy()
        entropy, mean = head.entropy(params).numpy(), head.mean_action(params).numpy()
    np.testing.assert_allclose(log_prob, stats.beta.logpdf(u, alpha, beta).sum(-1), rtol=1e-4)
    np.testing.assert_allclose(entropy, stats.beta.entropy(alpha, beta).sum(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, BOX.low + (BOX.high - BOX.low) * stats.beta.mean(alpha, beta), rtol=1e-5)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_the_env_action_and_the_share_at_the_bounds_are_the_known_values(name):
    """On the box [-1, 1] x [0, 2] x [-4, 4]: the Gaussian's sample is clipped, the Beta's in [0, 1] scaled onto the
    box; an action within 1% of a dimension's width from a bound is at it."""
    gaussian, beta = family(name, "gaussian"), family(name, "beta")
    u = torch.tensor([[-3.0, 0.5, 5.0], [0.25, 2.5, -3.5]])
    assert gaussian.env_action(u).tolist() == [[-1.0, 0.5, 4.0], [0.25, 2.0, -3.5]]
    assert beta.env_action(torch.tensor([[0.25, 0.5, 1.0], [0.0, 0.75, 0.375]])).tolist() == [
        [-0.5, 1.0, 4.0],
        [-1.0, 1.5, -1.0],
    ]
    at = torch.tensor([[-0.995, 1.0, 3.97], [0.5, 1.979, -3.93]])
    for head in (gaussian, beta):  # one rule, on the env's action, whatever the family
        assert head.at_bounds(at).tolist() == [[True, False, True], [False, False, True]]
    with torch.no_grad():  # the Gaussian's evaluated action lies inside the box whatever its mean
        mean = torch.tensor([[-3.0, 0.5, 9.0]])
        params = mean if name == "ppo_continuous" else torch.stack([mean, torch.full_like(mean, -4.0)], -2)
        played = gaussian.mean_action(params)
    np.testing.assert_allclose(played.numpy(), [[-1.0, 0.5, 4.0]], atol=1e-4)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_beta_samples_lie_inside_the_box_and_a_generator_leaves_the_global_rng_alone(name):
    from scipy import stats

    head = family(name, "beta", gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    params = beta_params(np.array([[1.5, 3.0]]), np.array([[4.0, 1.2]])).expand(50_000, 2, 2)
    state = torch.get_rng_state()
    u = head.sample(params, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(u, head.sample(params, generator=torch.Generator().manual_seed(0)))
    assert float(u.min()) >= 1e-6 and float(u.max()) <= 1 - 1e-6
    for j, (a, b) in enumerate([(1.5, 4.0), (3.0, 1.2)]):
        assert stats.kstest(u[:, j].numpy(), stats.beta(a, b).cdf).pvalue > 0.01


@pytest.mark.parametrize("name", CONTINUOUS)
def test_on_an_unbounded_box_the_gaussian_does_not_clip_and_stays_finite(name):
    """An infinite bound stands at +-1e6: no sample reaches it, and the log-probability, the evaluated action and their
    gradients stay finite (V-MPO's clipped likelihood evaluates the mass beyond a bound in every branch)."""
    space = gym.spaces.Box(np.array([-np.inf, -1.0], np.float32), np.array([np.inf, np.inf], np.float32))
    head = family(name, "gaussian", space)
    torch.manual_seed(0)
    mean = (torch.randn(64, 2) * 50).requires_grad_()
    params = mean if name == "ppo_continuous" else torch.stack([mean, torch.zeros_like(mean)], -2)
    with torch.no_grad():
        u = head.sample(params)
    np.testing.assert_array_equal(head.env_action(u)[:, 0].numpy(), u[:, 0].numpy())  # no clip where unbounded
    assert float(head.env_action(u)[:, 1].min()) == -1.0  # the finite bound still clips
    (head.log_prob(params, u).sum() + head.mean_action(params).sum()).backward()
    assert torch.isfinite(mean.grad).all() and torch.isfinite(head.log_prob(params, u)).all()
    assert not head.at_bounds(head.env_action(u))[:, 0].any()


@pytest.mark.parametrize("name", CONTINUOUS)
def test_each_family_method_says_what_it_returns_in_the_env_or_the_familys_units(name):
    """`mean_action` and `env_action` return the env's action, `sample` the family's own sample u: a Beta's u lies in
    [0, 1] while its env action spans the box."""
    head = family(name, "beta", gym.spaces.Box(-10.0, 10.0, (1,), np.float32))
    params = beta_params(np.array([[1.2]]), np.array([[1.2]])).expand(4000, 2, 1)
    u = head.sample(params, generator=torch.Generator().manual_seed(1))
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert float(head.env_action(u).min()) < -8.0 and float(head.env_action(u).max()) > 8.0
    assert math.isclose(float(head.mean_action(params[:1])), 0.0, abs_tol=1e-5)
    assert "params" in inspect.signature(head.log_prob).parameters

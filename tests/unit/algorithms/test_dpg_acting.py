"""Ape-X DPG on the actor's side (algorithms/dpg/acting.py, exploration.py): the policy and critic rebuilt from the
published weights equal the learner's networks (numpy for vectors, torch for images), initial priorities are the
n-step TD error of the stored action, the per-actor noise scales, Gaussian noise per dimension's half range,
clipping to asymmetric bounds, noise correlated over time, uniformly random warm-up steps, and a greedy
evaluator."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from apexrl.algorithms.dpg.acting import GaussianNoise, NumpyDPGPolicy, make_explorer, make_policy
from apexrl.algorithms.dpg.exploration import SIGMA_MAX, SIGMA_MIN, UnitNoise, apex_noise_scale
from apexrl.algorithms.dpg.networks import build_networks
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces

SPACES = EnvSpaces.box((3,), (-1.0, 0.0), (3.0, 1.0))
IMAGES = EnvSpaces((4, 10, 10), "uint8", 0, (-2.0,), (0.5,))  # a small frame stack, one asymmetric action


def networks(spaces: EnvSpaces, network: str = "auto"):
    torch.manual_seed(0)
    _, _, policy, (critic,) = build_networks(network, spaces, None, critics=1)
    with torch.no_grad():  # larger output weights, so that some actions sit near the bounds
        policy.out.weight.mul_(20)
    weights = {**state_dict_to_numpy(policy, "policy."), **state_dict_to_numpy(critic, "critic.")}
    return policy, critic, weights


def columns(spaces: EnvSpaces, rows: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if spaces.obs_dtype == "uint8":
        obs = rng.integers(0, 256, (rows, *spaces.obs_shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (rows, *spaces.obs_shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(rows, *spaces.obs_shape)).astype(np.float32)
        next_obs = rng.normal(size=(rows, *spaces.obs_shape)).astype(np.float32)
    return {
        "obs": obs,
        "next_obs": next_obs,
        "action": rng.uniform(spaces.action_low, spaces.action_high, (rows, spaces.action_dim)).astype(
            np.float32
        ),
        "reward": rng.normal(size=rows).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], rows).astype(np.float32),
    }


@pytest.mark.parametrize("spaces", [SPACES, IMAGES], ids=["vector-numpy", "image-torch"])
def test_the_actors_policy_and_critic_equal_the_learners_networks(spaces):
    policy, critic, weights = networks(spaces)
    acting = make_policy(weights, spaces)
    assert isinstance(acting, NumpyDPGPolicy) == (spaces is SPACES)
    cols = columns(spaces)
    with torch.no_grad():
        want_actions = policy(torch.as_tensor(cols["obs"])).numpy()
        want_q = critic(torch.as_tensor(cols["obs"]), torch.as_tensor(cols["action"])).numpy()
        next_q = critic(torch.as_tensor(cols["next_obs"]), policy(torch.as_tensor(cols["next_obs"]))).numpy()
    np.testing.assert_allclose(acting.greedy(cols["obs"]), want_actions, rtol=1e-4, atol=1e-5)
    assert (want_actions >= np.array(spaces.action_low) - 1e-6).all()
    assert (want_actions <= np.array(spaces.action_high) + 1e-6).all()
    np.testing.assert_allclose(acting.q(cols["obs"], cols["action"]), want_q, rtol=1e-4, atol=1e-4)
    # Initial priorities: |R + discount * Q(s', pi(s')) - Q(s, a_stored)|, this copy as online and target.
    want = np.abs(cols["reward"] + cols["discount"] * next_q - want_q)
    np.testing.assert_allclose(acting.initial_priorities(cols), want, rtol=1e-4, atol=1e-4)
    moved = dict(cols, action=acting.greedy(cols["obs"]))  # another action: another priority
    assert not np.allclose(acting.initial_priorities(moved), want, atol=1e-3)


def test_weights_that_are_not_a_dpg_policy_are_refused():
    _, _, weights = networks(SPACES)
    with pytest.raises(ValueError, match="missing 'critic.out.weight'"):
        make_policy({k: v for k, v in weights.items() if k != "critic.out.weight"}, SPACES)


def test_noise_scales_spread_geometrically_from_sigma_max_to_sigma_min():
    scales = [apex_noise_scale(i, 8) for i in range(8)]
    assert scales[0] == pytest.approx(SIGMA_MAX) and scales[-1] == pytest.approx(SIGMA_MIN)
    ratios = np.array(scales[1:]) / np.array(scales[:-1])
    np.testing.assert_allclose(ratios, (SIGMA_MIN / SIGMA_MAX) ** (1 / 7))  # geometric, as Ape-X's epsilons
    assert apex_noise_scale(0, 1) == pytest.approx(np.sqrt(SIGMA_MAX * SIGMA_MIN))
    assert sum(s > 0.2 for s in scales) == 3  # a few explore hard, most stay near the policy
    for bad in ((-1, 4), (4, 4), (0, 0)):
        with pytest.raises(ValueError):
            apex_noise_scale(*bad)


class Constant:
    """A policy whose greedy action is fixed."""

    def __init__(self, action) -> None:
        self.action = np.asarray(action, np.float32)

    def greedy(self, obs):
        return np.tile(self.action, (len(obs), 1))


def test_gaussian_noise_is_scaled_per_dimension_to_half_its_range_and_clipped_to_the_bounds():
    rng = np.random.default_rng(0)
    explorer = GaussianNoise(0.1, np.array([-1.0, 0.0]), np.array([3.0, 1.0]), rng)
    centre = Constant([1.0, 0.5])
    actions = explorer.actions(centre, np.zeros((20_000, 3)))
    assert actions.dtype == np.float32 and actions.shape == (20_000, 2)
    np.testing.assert_allclose(actions.mean(axis=0), [1.0, 0.5], atol=0.01)
    np.testing.assert_allclose(actions.std(axis=0), [0.1 * 2.0, 0.1 * 0.5], rtol=0.03)  # sigma x half range
    edge = explorer.actions(Constant([3.0, 0.0]), np.zeros((20_000, 3)))
    assert edge[:, 0].max() == 3.0 and edge[:, 1].min() == 0.0  # clipped onto the bounds, never beyond
    assert (edge[:, 0] < 3.0).mean() == pytest.approx(0.5, abs=0.02)  # half the draws pushed back inside


def lag_one_correlation(draws: np.ndarray) -> np.ndarray:
    """Per column of each row's series [steps, rows, dims]: corr(z_t, z_{t+1}), pooled over rows."""
    a, b = draws[:-1].reshape(-1, draws.shape[-1]), draws[1:].reshape(-1, draws.shape[-1])
    return np.array([np.corrcoef(a[:, d], b[:, d])[0, 1] for d in range(draws.shape[-1])])


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_unit_noise_keeps_rho_of_its_last_draw_and_stays_standard_normal(rho):
    noise = UnitNoise(rho, np.random.default_rng(1))
    draws = np.stack(
        [noise.draw((200, 2)) for _ in range(400)]
    )  # 400 steps of 200 environments, 2 dimensions
    np.testing.assert_allclose(draws.reshape(-1, 2).mean(axis=0), 0.0, atol=0.05)
    np.testing.assert_allclose(draws.reshape(-1, 2).std(axis=0), 1.0, rtol=0.03)  # sigma keeps its meaning
    np.testing.assert_allclose(lag_one_correlation(draws), rho, atol=0.02)
    rows = draws[:, :, 0].T  # environments are independent processes
    assert abs(np.corrcoef(rows[0], rows[1])[0, 1]) < 0.3


def test_unit_noise_starts_afresh_when_the_batch_changes_shape():
    noise = UnitNoise(0.99, np.random.default_rng(2))
    noise.draw((3, 2))
    assert noise.draw((5, 2)).shape == (5, 2)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_unit_noise_refuses_a_correlation_outside_zero_to_one(bad):
    with pytest.raises(ValueError, match=r"noise correlation .* must be in \[0, 1\)"):
        UnitNoise(bad, np.random.default_rng(0))


def test_correlated_gaussian_noise_keeps_the_scale_per_dimension_and_pushes_one_way_for_a_while():
    explorer = GaussianNoise(
        0.1, np.array([-1.0, 0.0]), np.array([3.0, 1.0]), np.random.default_rng(3), correlation=0.9
    )
    centre = Constant([1.0, 0.5])
    actions = np.stack([explorer.actions(centre, np.zeros((100, 3))) for _ in range(500)])
    np.testing.assert_allclose(actions.reshape(-1, 2).std(axis=0), [0.1 * 2.0, 0.1 * 0.5], rtol=0.05)
    np.testing.assert_allclose(lag_one_correlation(actions), 0.9, atol=0.02)
    white = GaussianNoise(0.1, np.array([-1.0, 0.0]), np.array([3.0, 1.0]), np.random.default_rng(3))
    fresh = np.stack([white.actions(centre, np.zeros((100, 3))) for _ in range(500)])
    np.testing.assert_allclose(lag_one_correlation(fresh), 0.0, atol=0.02)


def test_random_warm_up_steps_then_the_noisy_policy():
    explorer = GaussianNoise(
        0.0, np.array([-1.0, 0.0]), np.array([3.0, 1.0]), np.random.default_rng(0), random_steps=1000
    )
    centre = Constant([1.0, 0.5])
    warm = np.concatenate([explorer.actions(centre, np.zeros((100, 3))) for _ in range(10)])
    assert (
        (warm[:, 0] >= -1).all()
        and (warm[:, 0] <= 3).all()
        and (warm[:, 1] >= 0).all()
        and (warm[:, 1] <= 1).all()
    )
    np.testing.assert_allclose(warm.mean(axis=0), [1.0, 0.5], atol=0.1)
    np.testing.assert_allclose(warm.std(axis=0), [4 / np.sqrt(12), 1 / np.sqrt(12)], rtol=0.1)  # uniform
    np.testing.assert_array_equal(explorer.actions(centre, np.zeros((5, 3))), centre.greedy(np.zeros((5, 3))))


def actor_settings(**changes):
    values = {
        "actor_index": 0,
        "num_actors": 4,
        "evaluate": False,
        "epsilon": None,
        "noise_scale": None,
        "noise_correlation": None,
        "random_steps": 500,
        **changes,
    }
    return SimpleNamespace(**values)


def test_each_actor_gets_its_own_scale_and_the_evaluator_plays_greedily():
    rng = np.random.default_rng(0)
    assert [
        make_explorer(actor_settings(actor_index=i), SPACES, rng).scale for i in range(4)
    ] == pytest.approx([apex_noise_scale(i, 4) for i in range(4)])
    fixed = make_explorer(actor_settings(actor_index=3, noise_scale=0.3), SPACES, rng)
    assert fixed.scale == 0.3 and fixed.random_steps == 500 and fixed.noise.correlation == 0.0
    correlated = make_explorer(actor_settings(actor_index=1, noise_correlation=0.9), SPACES, rng)
    assert correlated.scale == pytest.approx(apex_noise_scale(1, 4)) and correlated.noise.correlation == 0.9
    evaluator = make_explorer(actor_settings(evaluate=True), SPACES, rng)
    assert evaluator.scale == 0.0 and evaluator.random_steps == 0
    policy = Constant([0.25, 0.75])
    np.testing.assert_array_equal(
        evaluator.actions(policy, np.zeros((7, 3))), policy.greedy(np.zeros((7, 3)))
    )


def test_the_start_up_line_names_scale_correlation_and_warm_up():
    rng = np.random.default_rng(0)
    fixed = make_explorer(actor_settings(noise_scale=0.3), SPACES, rng)
    assert fixed.describe() == "noise scale 0.3000, 500 uniformly random steps first"
    correlated = make_explorer(
        actor_settings(noise_scale=0.1, noise_correlation=0.9, random_steps=0), SPACES, rng
    )
    assert correlated.describe() == "noise scale 0.1000, correlation 0.9"
    assert make_explorer(actor_settings(evaluate=True), SPACES, rng).describe() == "noise scale 0.0000"

"""Ape-X DPG's maths against hand computations (algorithms/dpg/losses.py, learning.py): the n-step critic target
with the target policy and the smaller of two target critics, target-policy smoothing inside the bounds, the
importance-weighted critic loss, the policy loss, priorities of the stored action, delayed policy updates and
Polyak-averaged targets."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from apexrl.algorithms.dpg.learning import DPGLearning
from apexrl.algorithms.dpg.losses import critic_loss, critic_target, policy_loss
from apexrl.algorithms.dpg.networks import Critic, DeterministicPolicy
from apexrl.algorithms.registry import get, with_defaults
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.config import LearnerConfig

SPACES = EnvSpaces.box((2,), (-1.0, 0.0), (3.0, 1.0))  # asymmetric bounds on purpose


class FixedPolicy(nn.Module):
    """pi(s) = the given actions, whatever s (with the bounds a policy carries)."""

    def __init__(self, actions: list[list[float]], low: list[float], high: list[float]) -> None:
        super().__init__()
        self.actions = torch.tensor(actions)
        self.register_buffer("action_low", torch.tensor(low))
        self.register_buffer("action_high", torch.tensor(high))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actions[: len(obs)]


class LinearCritic(nn.Module):
    """Q(s, a) = w_s . s + w_a . a + b."""

    def __init__(self, w_s: list[float], w_a: list[float], b: float) -> None:
        super().__init__()
        self.w_s, self.w_a, self.b = torch.tensor(w_s), torch.tensor(w_a), b

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return obs @ self.w_s + action @ self.w_a + self.b


def test_the_critic_target_bootstraps_with_the_target_policy_and_the_smaller_target_critic():
    next_obs = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    policy = FixedPolicy([[0.5, 1.0], [2.0, 0.0]], [-1, 0], [3, 1])
    q1 = LinearCritic([1.0, 0.0], [1.0, 1.0], 0.0)  # row 0: 1 + 1.5 = 2.5; row 1: 0 + 2 = 2
    q2 = LinearCritic([0.0, 1.0], [0.0, 2.0], 1.0)  # row 0: 2 + 2 + 1 = 5; row 1: -1 + 0 + 1 = 0
    reward, discount = torch.tensor([1.0, -2.0]), torch.tensor([0.9, 0.0])
    y = critic_target(policy, [q1, q2], reward, discount, next_obs)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 2.5, -2.0 + 0.0 * 0.0]))
    y_one = critic_target(policy, [q2], reward, discount, next_obs)  # plain DPG: its only critic
    torch.testing.assert_close(y_one, torch.tensor([1.0 + 0.9 * 5.0, -2.0]))


def test_target_policy_smoothing_stays_inside_the_bounds_and_within_the_clip():
    torch.manual_seed(0)
    low, high = [-1.0, 0.0], [3.0, 1.0]
    centre = [[1.0, 0.5]] * 4096
    policy = FixedPolicy(centre, low, high)
    seen = []
    critic = LinearCritic([0.0], [1.0, 0.0], 0.0)  # Q = first action dimension: y reveals the noisy action

    def spy(obs, action):
        seen.append(action.clone())
        return critic(obs, action)

    critic_target(
        policy,
        [spy],
        torch.zeros(4096),
        torch.ones(4096),
        torch.zeros(4096, 1),
        target_noise=5.0,
        noise_clip=0.25,
    )
    noisy = seen[0]
    half = torch.tensor([2.0, 0.5])
    offset = noisy - torch.tensor(centre)
    assert (offset.abs() <= 0.25 * half + 1e-6).all()  # clipped to +-noise_clip half ranges, per dimension
    assert (offset.abs().amax(dim=0) > 0.24 * half).all()  # and the clip is reached (noise 5 >> clip)
    edge = FixedPolicy([[3.0, 1.0]] * 4096, low, high)  # at the upper bounds: noise can only push it back in
    seen.clear()
    critic_target(edge, [spy], torch.zeros(4096), torch.ones(4096), torch.zeros(4096, 1), target_noise=1.0)
    assert (seen[0] <= torch.tensor(high)).all() and (seen[0] >= torch.tensor(low)).all()


def test_the_critic_loss_is_importance_weighted_and_priorities_are_the_first_critics_td_error():
    obs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    action = torch.tensor([[0.5, 0.5], [1.0, 0.0], [2.0, 1.0]])
    q1 = LinearCritic([1.0, 1.0], [1.0, 0.0], 0.0)  # 1.5, 2, 4
    q2 = LinearCritic([0.0, 0.0], [0.0, 1.0], 0.0)  # 0.5, 0, 1
    y = torch.tensor([2.0, 0.0, 4.5])
    w = torch.tensor([1.0, 0.5, 2.0])
    loss, td_abs = critic_loss([q1, q2], obs, action, y, w)
    want = np.mean([1 * 0.25, 0.5 * 4, 2 * 0.25]) + np.mean([1 * 2.25, 0.5 * 0, 2 * 12.25])
    assert loss.item() == pytest.approx(want)
    torch.testing.assert_close(td_abs, torch.tensor([0.5, 2.0, 0.5]))


def test_the_policy_loss_is_minus_the_critics_value_of_the_policys_action():
    obs = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    policy = FixedPolicy([[0.5, 1.0], [2.0, 0.0]], [-1, 0], [3, 1])
    q = LinearCritic([1.0, 0.0], [1.0, 1.0], 0.5)  # 1 + 1.5 + .5 = 3; 3 + 2 + .5 = 5.5
    assert policy_loss(policy, q, obs).item() == pytest.approx(-(3.0 + 5.5) / 2)


def test_the_policy_is_squashed_onto_asymmetric_bounds_and_the_critic_reads_actions_rescaled():
    torch.manual_seed(0)
    policy = DeterministicPolicy("mlp", SPACES, (8,))
    with torch.no_grad():
        policy.out.bias.copy_(torch.tensor([100.0, -100.0]))  # saturate tanh: +1 then -1
        policy.out.weight.zero_()
    torch.testing.assert_close(policy(torch.zeros(3, 2)), torch.tensor([[3.0, 0.0]] * 3))
    with torch.no_grad():
        policy.out.bias.zero_()
    torch.testing.assert_close(policy(torch.zeros(1, 2)), torch.tensor([[1.0, 0.5]]))  # tanh 0: the centre
    critic = Critic("mlp", SPACES, (4,))
    seen = []
    critic.torso.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    critic(torch.tensor([[7.0, 8.0]]), torch.tensor([[3.0, 0.25]]))
    torch.testing.assert_close(seen[0], torch.tensor([[7.0, 8.0, 1.0, -0.5]]))  # [low, high] -> [-1, 1]


def settings(**changes) -> LearnerConfig:
    config = LearnerConfig(
        replay=("fake:1",), env="Fake-v0", algorithm="dpg", hidden_sizes=(16,), device="cpu", **changes
    )
    return with_defaults(config, get("dpg"), "learner")


def batch(rows: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {
        "obs": torch.as_tensor(rng.normal(size=(rows, 2)), dtype=torch.float32),
        "action": torch.as_tensor(
            rng.uniform(SPACES.action_low, SPACES.action_high, (rows, 2)), dtype=torch.float32
        ),
        "reward": torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        "discount": torch.as_tensor(rng.choice([0.0, 0.97], rows), dtype=torch.float32),
        "next_obs": torch.as_tensor(rng.normal(size=(rows, 2)), dtype=torch.float32),
    }


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def test_an_update_returns_the_td_error_of_the_stored_action_before_it_steps():
    torch.manual_seed(0)
    learning = DPGLearning(settings(target_noise=0.0), SPACES, torch.device("cpu"))
    b = batch()
    critics, target_policy = copy.deepcopy(learning.critics), copy.deepcopy(learning.target_policy)
    target_critics = copy.deepcopy(learning.target_critics)
    y = b["reward"] + b["discount"] * torch.minimum(
        *(c(b["next_obs"], target_policy(b["next_obs"])) for c in target_critics)
    )
    want = (y - critics[0](b["obs"], b["action"])).abs().detach()
    result = learning.update(b, torch.ones(16), step=1)
    torch.testing.assert_close(result.td_abs, want)
    # The stored action, not the policy's: the same rows with other actions give other priorities.
    other = dict(b, action=learning.policy(b["obs"]).detach())
    assert not torch.allclose(learning.update(other, torch.ones(16), step=2).td_abs, want, atol=1e-3)


def test_the_policy_moves_every_policy_delay_updates_and_targets_follow_by_polyak_averaging():
    torch.manual_seed(0)
    learning = DPGLearning(
        settings(policy_delay=2, target_tau=0.25, target_update_period=1), SPACES, torch.device("cpu")
    )
    policy_before = params(learning.policy)
    target_before, online_before = params(learning.target_critics[0]), params(learning.critics[0])
    learning.update(batch(seed=1), torch.ones(16), step=1)
    assert all(torch.equal(a, b) for a, b in zip(policy_before, params(learning.policy), strict=True))
    online_after = params(learning.critics[0])
    assert not all(torch.equal(a, b) for a, b in zip(online_before, online_after, strict=True))
    for t0, o1, t1 in zip(target_before, online_after, params(learning.target_critics[0]), strict=True):
        torch.testing.assert_close(t1, 0.75 * t0 + 0.25 * o1)
    learning.update(batch(seed=2), torch.ones(16), step=2)
    assert not all(torch.equal(a, b) for a, b in zip(policy_before, params(learning.policy), strict=True))


def test_hard_copies_every_k_updates_and_one_critic_without_td3():
    torch.manual_seed(0)
    learning = DPGLearning(
        settings(
            twin_critics=False, policy_delay=1, target_noise=0.0, target_tau=1.0, target_update_period=3
        ),
        SPACES,
        torch.device("cpu"),
    )
    assert len(learning.critics) == 1
    initial = params(learning.target_policy)
    for step in (1, 2):
        learning.update(batch(seed=step), torch.ones(16), step=step)
        assert all(torch.equal(a, b) for a, b in zip(initial, params(learning.target_policy), strict=True))
    learning.update(batch(seed=3), torch.ones(16), step=3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(params(learning.policy), params(learning.target_policy), strict=True)
    )


def test_importance_weights_scale_the_critic_loss():
    torch.manual_seed(0)
    plain = DPGLearning(settings(), SPACES, torch.device("cpu"))
    heavy = copy.deepcopy(plain)
    b = batch()
    torch.manual_seed(1)
    one = plain.update(b, torch.ones(16), step=1).loss.item()
    torch.manual_seed(1)  # the same target-smoothing noise
    three = heavy.update(b, torch.full((16,), 3.0), step=1).loss.item()
    assert three == pytest.approx(3 * one, rel=1e-5)


def test_dqn_settings_are_refused_for_a_dpg_run_and_dpg_settings_for_a_dqn_run():
    config = LearnerConfig(replay=("fake:1",), twin_critics=False)
    with pytest.raises(
        ValueError, match="twin_critics: a setting of algorithm dpg, but this run's algorithm is dqn"
    ):
        with_defaults(config, get("dqn"), "learner")
    filled = with_defaults(dataclasses.replace(config, twin_critics=None), get("dpg"), "learner")
    assert (filled.twin_critics, filled.policy_delay, filled.target_tau, filled.target_update_period) == (
        True,
        2,
        0.005,
        1,
    )

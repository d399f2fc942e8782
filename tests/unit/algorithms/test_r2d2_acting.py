"""R2D2's actor half (apexrl.algorithms.r2d2.acting): the numpy and torch policies rebuilt from published weights
step exactly as the learner's network unrolls, the state is carried and reset per environment, and a window's
initial priority is the learner's own priority when the actor's network is the learner's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.r2d2.acting import NumpyRecurrentPolicy, RecurrentActing, window_priority
from apexrl.algorithms.r2d2.losses import SequenceBatch, r2d2_loss
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork
from apexrl.algorithms.r2d2.torch_policy import TorchRecurrentPolicy
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces

VECTOR = EnvSpaces.vector(4, 3)
MINATAR = EnvSpaces((10, 10, 4), "bool", 3)


@pytest.mark.parametrize(
    ("spaces", "policy_class"), [(VECTOR, NumpyRecurrentPolicy), (MINATAR, TorchRecurrentPolicy)]
)
def test_a_policy_from_the_weights_steps_as_the_network_unrolls(spaces, policy_class) -> None:
    torch.manual_seed(0)
    net = RecurrentQNetwork(spaces, core_size=12)
    weights = state_dict_to_numpy(net)
    policy = (
        NumpyRecurrentPolicy(weights)
        if policy_class is NumpyRecurrentPolicy
        else TorchRecurrentPolicy(weights, spaces.layout, spaces.input_scale)
    )
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(5, 6, *spaces.obs_shape)).astype(np.float32)
    if spaces is MINATAR:
        obs = obs > 0
    acting = RecurrentActing(epsilon=0.0)
    state = acting.initial_state(5, policy.core_size)
    rewards = rng.normal(size=(5, 6)).astype(np.float32)
    actions, qs = [], []
    for t in range(6):
        action, state = acting.greedy(policy, obs[:, t], state)
        qs.append(acting.last_q)
        actions.append(action)
        state = acting.observe(state, rewards[:, t])
    action = np.stack(actions, axis=1)
    prev_action = np.concatenate([np.zeros((5, 1), np.int64), action[:, :-1]], axis=1)
    prev_reward = np.concatenate([np.zeros((5, 1), np.float32), rewards[:, :-1]], axis=1)
    with torch.no_grad():
        q, _ = net.unroll(
            torch.as_tensor(obs),
            torch.as_tensor(prev_action),
            torch.as_tensor(prev_reward),
            net.initial_state(5),
        )
    np.testing.assert_allclose(np.stack(qs, axis=1), q.numpy(), rtol=1e-4, atol=1e-5)


def test_the_state_of_an_ended_episode_starts_again_from_zeros() -> None:
    acting = RecurrentActing(epsilon=0.0)
    policy = NumpyRecurrentPolicy(state_dict_to_numpy(RecurrentQNetwork(VECTOR, core_size=6)))
    state = acting.initial_state(3, 6)
    _, state = acting.act(policy, np.ones((3, 4), np.float32), state)
    state = acting.observe(state, np.array([1.0, 2.0, 3.0]))
    state = acting.reset(state, np.array([False, True, False]))
    assert np.abs(state.h[1]).sum() == 0 and state.prev_reward[1] == 0 and state.prev_action[1] == 0
    assert np.abs(state.h[0]).sum() > 0 and state.prev_reward[2] == 3.0
    fields = state.item_fields(np.array([0, 2]))
    assert fields["state"].shape == (2, 2, 6)


@pytest.mark.parametrize("terminal", [True, False])
def test_a_windows_initial_priority_is_the_learners_with_the_same_network(terminal: bool) -> None:
    torch.manual_seed(1)
    net = RecurrentQNetwork(VECTOR, core_size=8)
    policy = NumpyRecurrentPolicy(state_dict_to_numpy(net))
    acting = RecurrentActing(epsilon=0.0)
    rng = np.random.default_rng(2)
    length = 7
    obs = rng.normal(size=(length, 4)).astype(np.float32)
    action = rng.integers(0, 3, length)
    reward = rng.normal(size=length).astype(np.float32)
    discount = np.full(length, 0.97, np.float32)
    if terminal:
        discount[-1] = 0.0
    state, qs = acting.initial_state(1, 8), []
    for t in range(length):
        policy_q, h, c = policy.step(obs[t : t + 1], state)
        qs.append(policy_q[0])
        state = acting.observe(state.__class__(h, c, action[t : t + 1], state.prev_reward), reward[t : t + 1])
    priority = window_priority(np.stack(qs), action, reward, discount, n_step=3, eta=0.9, terminal=terminal)
    batch = SequenceBatch(
        obs=torch.as_tensor(obs)[None],
        action=torch.as_tensor(action)[None],
        reward=torch.as_tensor(reward)[None],
        discount=torch.as_tensor(discount)[None],
        lengths=torch.tensor([length]),
        state=torch.zeros(1, 2, 8),
        prev_action=torch.zeros(1, dtype=torch.long),
        prev_reward=torch.zeros(1),
        episode_start=torch.ones(1, dtype=torch.bool),
    )
    _, learner_priority, _ = r2d2_loss(net, net, batch, torch.ones(1), n_step=3, burn_in=0, eta=0.9)
    assert priority == pytest.approx(float(learner_priority[0]), rel=1e-4)

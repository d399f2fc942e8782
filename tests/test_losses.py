"""The double DQN loss on table-like networks whose Q-values are set by hand; the dueling network's weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from apexrl.learner.losses import double_dqn_loss, double_q_target, td_error_abs
from apexrl.learner.networks import DuelingQNetwork, load_numpy_state_dict, state_dict_to_numpy


def _table_net(q_table: list[list[float]]) -> nn.Linear:
    """Q(s) = q_table[s] for one-hot observations: a bias-free linear layer with weight = q_table^T."""
    table = torch.tensor(q_table, dtype=torch.float32)
    net = nn.Linear(table.shape[0], table.shape[1], bias=False)
    with torch.no_grad():
        net.weight.copy_(table.T)
    return net


# 3 states (one-hot), 2 actions. Online and target disagree on the best next action, so double Q differs from
# both "max over target" and "max over online".
ONLINE = [[1.0, 2.0], [5.0, 3.0], [0.0, 10.0]]
TARGET = [[7.0, 7.0], [4.0, 8.0], [6.0, -2.0]]


def _batch() -> dict[str, torch.Tensor]:
    eye = torch.eye(3)
    return {
        "obs": eye[[0, 1, 2]],
        "action": torch.tensor([1, 0, 1]),
        "reward": torch.tensor([1.0, 2.0, 0.5]),
        "discount": torch.tensor([0.5, 0.25, 0.0]),  # the last transition terminated
        "next_obs": eye[[1, 2, 0]],
    }


def test_double_q_target_by_hand() -> None:
    b = _batch()
    y = double_q_target(_table_net(ONLINE), _table_net(TARGET), b["reward"], b["discount"], b["next_obs"])
    # item 0: argmax online(s1) = 0, target(s1, 0) = 4     -> 1 + 0.5 * 4 = 3      (max over target would give 5)
    # item 1: argmax online(s2) = 1, target(s2, 1) = -2    -> 2 + 0.25 * -2 = 1.5  (max over target would give 3.5)
    # item 2: discount 0                                   -> 0.5
    torch.testing.assert_close(y, torch.tensor([3.0, 1.5, 0.5]))


def test_loss_td_and_gradient_by_hand() -> None:
    online, target = _table_net(ONLINE), _table_net(TARGET)
    b = _batch()
    weights = torch.tensor([1.0, 0.5, 0.2])
    loss, td_abs = double_dqn_loss(online, target, **b, weights=weights)
    # q = online(s, a) = [2, 5, 10]; td = y - q = [1, -3.5, -9.5]; Huber(delta=1) = [0.5, 3.0, 9.0]
    torch.testing.assert_close(td_abs, torch.tensor([1.0, 3.5, 9.5]))
    assert not td_abs.requires_grad
    assert loss.item() == pytest.approx((1.0 * 0.5 + 0.5 * 3.0 + 0.2 * 9.0) / 3)
    loss.backward()
    # dLoss/dq_i = w_i * clip(q_i - y_i, -1, 1) / B lands on weight[action_i, state_i]; the target gets nothing.
    expected = torch.zeros(2, 3)
    expected[1, 0] = 1.0 * -1.0 / 3
    expected[0, 1] = 0.5 * 1.0 / 3
    expected[1, 2] = 0.2 * 1.0 / 3
    torch.testing.assert_close(online.weight.grad, expected)
    assert target.weight.grad is None


def test_huber_delta_and_actor_priorities() -> None:
    online, target = _table_net(ONLINE), _table_net(TARGET)
    b = _batch()
    loss, _ = double_dqn_loss(online, target, **b, weights=torch.ones(3), huber_delta=10.0)
    assert loss.item() == pytest.approx((0.5 * 1.0 + 0.5 * 3.5**2 + 0.5 * 9.5**2) / 3)  # all quadratic
    # An actor has one network, both online and target: y = [1 + 0.5 * 5, 2 + 0.25 * 10, 0.5], q = [2, 5, 10].
    torch.testing.assert_close(td_error_abs(online, online, **b), torch.tensor([1.5, 0.5, 9.5]))


def test_dueling_head_by_hand() -> None:
    net = DuelingQNetwork(obs_dim=4, num_actions=3, hidden_sizes=(8,))
    with torch.no_grad():
        net.value.weight.zero_()
        net.value.bias.fill_(3.0)
        net.advantage.weight.zero_()
        net.advantage.bias.copy_(torch.tensor([1.0, 2.0, 6.0]))
    # Q = V + A - mean(A) = 3 + [1, 2, 6] - 3
    torch.testing.assert_close(net(torch.randn(5, 4)), torch.tensor([[1.0, 2.0, 6.0]] * 5))


def test_dueling_advantages_average_to_zero() -> None:
    torch.manual_seed(0)
    net = DuelingQNetwork(obs_dim=4, num_actions=5, hidden_sizes=(16, 16))
    obs = torch.randn(7, 4)
    q = net(obs)
    assert q.shape == (7, 5)
    value = net.value(net.torso(obs)).squeeze(1)
    torch.testing.assert_close(q.mean(dim=1), value)  # mean over actions of (A - mean A) is 0
    with pytest.raises(ValueError, match="hidden_sizes"):
        DuelingQNetwork(4, 2, hidden_sizes=())


def test_state_dict_round_trip() -> None:
    torch.manual_seed(0)
    source, dest = DuelingQNetwork(4, 2, (32, 16)), DuelingQNetwork(4, 2, (32, 16))
    weights = state_dict_to_numpy(source)
    assert set(weights) == {
        "torso.0.weight",
        "torso.0.bias",
        "torso.2.weight",
        "torso.2.bias",
        "value.weight",
        "value.bias",
        "advantage.weight",
        "advantage.bias",
    }
    assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in weights.values())
    assert weights["torso.0.weight"].shape == (32, 4)
    obs = torch.randn(3, 4)
    assert not torch.equal(source(obs), dest(obs))
    load_numpy_state_dict(dest, weights)
    torch.testing.assert_close(dest(obs), source(obs), rtol=0, atol=0)
    # The exported arrays are copies: training the source later does not change what was published.
    before = weights["value.bias"].copy()
    with torch.no_grad():
        source.value.bias.add_(1.0)
    np.testing.assert_array_equal(weights["value.bias"], before)
    # float64 arrays are accepted and cast.
    load_numpy_state_dict(dest, {k: v.astype(np.float64) for k, v in weights.items()})
    assert dest.value.bias.dtype == torch.float32


def test_state_dict_mismatch_names_the_difference() -> None:
    dest = DuelingQNetwork(4, 2, (32, 16))
    snapshot = state_dict_to_numpy(dest)
    other = state_dict_to_numpy(DuelingQNetwork(4, 2, (32, 8)))
    with pytest.raises(ValueError, match=r"torso\.2\.weight: shape \(8, 32\) != expected \(16, 32\)"):
        load_numpy_state_dict(dest, other)
    missing = dict(snapshot)
    del missing["value.bias"]
    missing["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"missing \['value.bias'\]; unexpected \['extra.weight'\]"):
        load_numpy_state_dict(dest, missing)
    # Nothing was half-loaded.
    for name, value in state_dict_to_numpy(dest).items():
        np.testing.assert_array_equal(value, snapshot[name])

"""The n-step double DQN loss (learner/losses.py) on table-like networks whose Q-values are set by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from apexrl.algorithms.dqn.losses import double_dqn_loss, double_q_target, td_error_abs


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

"""The dueling Q-network (learner/networks.py) and its language-neutral weight format (named numpy arrays)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.algorithms.torsos import state_dict_to_numpy
from tests.support.numpy_weights import load_numpy_state_dict


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

"""The actor's numpy forward pass is the learner's torch network, weight for weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.acting import NumpyDuelingPolicy
from apexrl.algorithms.dqn.losses import td_error_abs
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.algorithms.torsos import state_dict_to_numpy


@pytest.mark.parametrize("hidden", [(16,), (64, 32), (32, 32, 32)])
def test_numpy_policy_matches_torch_network(hidden):
    torch.manual_seed(0)
    net = DuelingQNetwork(6, 3, hidden)
    policy = NumpyDuelingPolicy(state_dict_to_numpy(net))
    obs = np.random.default_rng(1).normal(size=(50, 6)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.q_values(obs), want, rtol=1e-5, atol=1e-6)
    assert (policy.obs_dim, policy.num_actions) == (6, 3)


def test_initial_priorities_are_the_td_error_of_the_actor_network():
    torch.manual_seed(2)
    net = DuelingQNetwork(4, 2, (32, 32))
    rng = np.random.default_rng(3)
    columns = {
        "obs": rng.normal(size=(40, 4)).astype(np.float32),
        "action": rng.integers(0, 2, 40),
        "reward": rng.normal(size=40).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], 40).astype(np.float32),
        "next_obs": rng.normal(size=(40, 4)).astype(np.float32),
    }
    want = td_error_abs(
        net, net, *(torch.as_tensor(columns[k]) for k in ("obs", "action", "reward", "discount", "next_obs"))
    ).numpy()
    np.testing.assert_allclose(
        NumpyDuelingPolicy(state_dict_to_numpy(net)).initial_priorities(columns), want, rtol=1e-4, atol=1e-5
    )


def test_weights_of_another_network_are_refused():
    with pytest.raises(ValueError, match="missing 'value.weight'"):
        NumpyDuelingPolicy({"torso.0.weight": np.zeros((4, 4)), "torso.0.bias": np.zeros(4)})

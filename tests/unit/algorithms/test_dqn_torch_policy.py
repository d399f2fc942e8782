"""The actor's torch policy (actor/torch_policy.py) is the learner's network on the same published weights, and
`make_policy` keeps the numpy path for MLPs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.dqn.acting import NumpyDuelingPolicy, make_policy
from apexrl.algorithms.dqn.losses import td_error_abs
from apexrl.algorithms.dqn.networks import build_network
from apexrl.algorithms.dqn.torch_policy import TorchDuelingPolicy
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.environments import EnvSpaces

ATARI = EnvSpaces((4, 84, 84), "uint8", 6)
MINATAR = EnvSpaces((10, 10, 4), "bool", 3)
CARTPOLE = EnvSpaces.vector(4, 2)


def observations(spaces: EnvSpaces, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spaces.obs_dtype == "bool":
        return rng.random((rows, *spaces.obs_shape)) < 0.2
    if spaces.obs_dtype == "uint8":
        return rng.integers(0, 256, (rows, *spaces.obs_shape), dtype=np.uint8)
    return rng.normal(size=(rows, *spaces.obs_shape)).astype(np.float32)


@pytest.mark.parametrize(
    ("spaces", "network"),
    [(ATARI, "nature"), (MINATAR, "minatar"), (ATARI, "minatar"), (MINATAR, "mlp"), (CARTPOLE, "mlp")],
)
def test_torch_policy_equals_the_learners_network_on_the_same_weights(spaces, network):
    torch.manual_seed(0)
    net = build_network(network, spaces)
    policy = TorchDuelingPolicy(
        state_dict_to_numpy(net), layout=spaces.layout, input_scale=spaces.input_scale
    )
    obs = observations(spaces, 7, seed=1)
    with torch.no_grad():
        want = net(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(policy.q_values(obs), want, rtol=1e-5, atol=1e-5)
    assert policy.num_actions == spaces.num_actions


@pytest.mark.parametrize("spaces", [ATARI, MINATAR])
def test_torch_policy_priorities_are_the_learners_td_errors(spaces):
    torch.manual_seed(4)
    net = build_network("auto", spaces)
    rng = np.random.default_rng(5)
    columns = {
        "obs": observations(spaces, 9, seed=6),
        "action": rng.integers(0, spaces.num_actions, 9),
        "reward": rng.normal(size=9).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], 9).astype(np.float32),
        "next_obs": observations(spaces, 9, seed=7),
    }
    want = td_error_abs(
        net, net, *(torch.as_tensor(columns[k]) for k in ("obs", "action", "reward", "discount", "next_obs"))
    ).numpy()
    policy = make_policy(state_dict_to_numpy(net), spaces)
    np.testing.assert_allclose(policy.initial_priorities(columns), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spaces", [CARTPOLE, ATARI])
def test_numpy_and_torch_agree_on_an_mlp(spaces):
    torch.manual_seed(8)
    weights = state_dict_to_numpy(build_network("mlp", spaces, hidden_sizes=(64, 32)))
    numpy_policy = NumpyDuelingPolicy(weights, input_scale=spaces.input_scale)
    torch_policy = TorchDuelingPolicy(weights, layout="vector", input_scale=spaces.input_scale)
    obs = observations(spaces, 16, seed=9)
    np.testing.assert_allclose(numpy_policy.q_values(obs), torch_policy.q_values(obs), rtol=1e-4, atol=1e-5)


def test_make_policy_uses_numpy_for_an_mlp_and_torch_for_convolutions():
    assert isinstance(
        make_policy(state_dict_to_numpy(build_network("auto", CARTPOLE)), CARTPOLE), NumpyDuelingPolicy
    )
    assert isinstance(
        make_policy(state_dict_to_numpy(build_network("mlp", MINATAR)), MINATAR), NumpyDuelingPolicy
    )
    assert isinstance(
        make_policy(state_dict_to_numpy(build_network("auto", MINATAR)), MINATAR), TorchDuelingPolicy
    )


def test_inconsistent_weights_are_refused():
    weights = state_dict_to_numpy(build_network("nature", ATARI))
    with pytest.raises(ValueError, match="conv_strides has 2 strides for 3 convolutions"):
        TorchDuelingPolicy({**weights, "conv_strides": np.array([4, 2])})
    without = {k: v for k, v in weights.items() if k != "conv_strides"}
    with pytest.raises(ValueError, match="missing 'conv_strides'"):
        TorchDuelingPolicy(without)
    with pytest.raises(ValueError, match="cannot read vector observations"):
        TorchDuelingPolicy(weights, layout="vector")
    with pytest.raises(ValueError, match="convolutional network: use make_policy"):
        NumpyDuelingPolicy(weights)

"""The learner's fused LSTM unroll (apexrl.algorithms.r2d2.networks.fused_core) against stepping the LSTMCell from
Python (stepwise_core, the code it replaced): the same Q-values, final state and gradients on random inputs, with the
burn-in's gradient stopped for some, all or none of the items and not at all, and the same R2D2 loss gradients."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from apexrl.algorithms.r2d2.losses import r2d2_loss
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork, fused_core, stepwise_core
from apexrl.common.spaces import EnvSpaces
from tests.unit.algorithms.test_r2d2_learning import random_batch

SPACES = EnvSpaces.vector(3, 2)
BATCH, STEPS, BURN_IN = 9, 12, 4
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def networks(seed: int) -> tuple[RecurrentQNetwork, RecurrentQNetwork]:
    """The same network twice, one unrolled by each core."""
    torch.manual_seed(seed)
    fused = RecurrentQNetwork(SPACES, hidden_sizes=(16,), core_size=8)
    stepwise = copy.deepcopy(fused)
    stepwise.core_unroll = stepwise_core
    assert RecurrentQNetwork.core_unroll is fused_core
    return fused, stepwise


def inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(BATCH, STEPS, 3, generator=g)
    prev_action = torch.randint(0, 2, (BATCH, STEPS), generator=g)
    prev_reward = torch.randn(BATCH, STEPS, generator=g)
    state = torch.tanh(torch.randn(2, BATCH, 8, generator=g))
    return obs, prev_action, prev_reward, state


STOPS = {
    "some": torch.tensor([True, False, True, True, False, True, True, True, False]),
    "all": torch.ones(BATCH, dtype=torch.bool),
    "none": torch.zeros(BATCH, dtype=torch.bool),
    "no stop": None,
}


def unroll_gradients(net: RecurrentQNetwork, stop: torch.Tensor | None, burn_in: int, seed: int):
    """Q-values, final state, and the gradients (parameters, observations, initial state) of a random loss on the
    steps a loss trains: every step, except the burn-in of the items whose gradient stops there."""
    obs, prev_action, prev_reward, state = inputs(seed)
    obs.requires_grad_(True)
    state.requires_grad_(True)
    q, (h, c) = net.unroll(obs, prev_action, prev_reward, (state[0], state[1]), burn_in, stop)
    trained = torch.ones(BATCH, STEPS, 1, dtype=torch.bool)
    if stop is not None:
        trained[stop, :burn_in] = False
    g = torch.Generator().manual_seed(seed + 1)
    loss = (torch.randn(q.shape, generator=g) * q * trained).sum() + (h * c).sum()
    net.zero_grad(set_to_none=True)
    loss.backward()
    grads = {name: p.grad for name, p in net.named_parameters()}
    state_grad = torch.zeros_like(state) if state.grad is None else state.grad  # None: nothing reached it
    return q.detach(), (h.detach(), c.detach()), grads, obs.grad, state_grad


@pytest.mark.parametrize("stop", list(STOPS), ids=list(STOPS))
@pytest.mark.parametrize("burn_in", [0, BURN_IN, STEPS, STEPS + 3])
def test_the_fused_unroll_equals_the_cell_loop(stop: str, burn_in: int) -> None:
    fused, stepwise = networks(0)
    got = unroll_gradients(fused, STOPS[stop], burn_in, seed=burn_in)
    want = unroll_gradients(stepwise, STOPS[stop], burn_in, seed=burn_in)
    torch.testing.assert_close(got[0], want[0], **TOLERANCE)
    torch.testing.assert_close(got[1], want[1], **TOLERANCE)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **TOLERANCE, msg=name)
    torch.testing.assert_close(got[3], want[3], **TOLERANCE)
    torch.testing.assert_close(got[4], want[4], **TOLERANCE)
    if STOPS[stop] is not None and 0 < burn_in < STEPS:  # no gradient reaches a stopped item's burn-in
        stopped = STOPS[stop]
        assert got[3][stopped, :burn_in].abs().sum().item() == 0.0
        assert got[4][:, stopped].abs().sum().item() == 0.0
        assert (got[3][~stopped, :burn_in].abs().sum().item() > 0) == bool((~stopped).any())


@pytest.mark.parametrize("stop_burn_in_gradient", [True, False])
def test_the_r2d2_loss_and_its_gradients_are_unchanged(stop_burn_in_gradient: bool) -> None:
    fused, stepwise = networks(1)
    target = RecurrentQNetwork(SPACES, hidden_sizes=(16,), core_size=8)
    stepwise_target = copy.deepcopy(target)
    stepwise_target.core_unroll = stepwise_core
    batch = random_batch(np.random.default_rng(3), 16, STEPS, core=8)
    weights = torch.rand(16, generator=torch.Generator().manual_seed(4))
    results = []
    for online, tgt in ((fused, target), (stepwise, stepwise_target)):
        loss, priorities, stats = r2d2_loss(
            online,
            tgt,
            batch,
            weights,
            n_step=3,
            burn_in=BURN_IN,
            stop_burn_in_gradient=stop_burn_in_gradient,
        )
        online.zero_grad(set_to_none=True)
        loss.backward()
        results.append((loss.detach(), priorities, stats, {n: p.grad for n, p in online.named_parameters()}))
    (loss, priorities, stats, grads), (want_loss, want_priorities, want_stats, want_grads) = results
    torch.testing.assert_close(loss, want_loss, **TOLERANCE)
    torch.testing.assert_close(priorities, want_priorities, **TOLERANCE)
    assert stats["trained_steps"] == want_stats["trained_steps"]
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], **TOLERANCE, msg=name)


def test_the_published_names_are_the_cells() -> None:
    names = set(RecurrentQNetwork(SPACES).state_dict())
    assert {"core.weight_ih", "core.weight_hh", "core.bias_ih", "core.bias_hh"} <= names

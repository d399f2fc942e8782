"""R2D2's learner half (apexrl.algorithms.r2d2): the value rescaling and its inverse, n-step targets inside a
sequence against a step-by-step reference, the burn-in's gradient stop, eta-mixed priorities, and a recurrent
learner that learns what a feed-forward one cannot: to act at a sequence's end on a cue it saw only at its start."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from apexrl.algorithms.r2d2.learning import R2D2Learning
from apexrl.algorithms.r2d2.losses import SequenceBatch, n_step_targets, r2d2_loss
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork
from apexrl.algorithms.r2d2.rescaling import rescale, unscale
from apexrl.common.spaces import EnvSpaces

SPACES = EnvSpaces.vector(3, 2)


def test_rescaling_is_inverted_on_numpy_and_torch() -> None:
    x = np.array([-1e6, -1234.5, -1.0, -1e-6, 0.0, 1e-6, 0.5, 3.0, 99.0, 1e6])
    np.testing.assert_allclose(unscale(rescale(x)), x, rtol=1e-9, atol=1e-9)
    t = torch.tensor(x, dtype=torch.float64)
    torch.testing.assert_close(unscale(rescale(t)), t, rtol=1e-9, atol=1e-9)
    assert rescale(np.array(3.0)) == pytest.approx(1.0 + 3e-3)  # sqrt(4) - 1 + eps * 3
    assert rescale(np.array(0.0)) == 0.0


def random_batch(rng: np.random.Generator, batch: int, steps: int, core: int = 8) -> SequenceBatch:
    lengths = rng.integers(1, steps + 1, batch)
    discount = np.full((batch, steps), 0.9, np.float32)
    terminal = rng.random(batch) < 0.5
    discount[np.arange(batch)[terminal], lengths[terminal] - 1] = 0.0
    return SequenceBatch(
        obs=torch.tensor(rng.normal(size=(batch, steps, 3)), dtype=torch.float32),
        action=torch.tensor(rng.integers(0, 2, (batch, steps))),
        reward=torch.tensor(rng.normal(size=(batch, steps)), dtype=torch.float32),
        discount=torch.tensor(discount),
        lengths=torch.tensor(lengths),
        state=torch.zeros(batch, 2, core),
        prev_action=torch.zeros(batch, dtype=torch.long),
        prev_reward=torch.zeros(batch),
        episode_start=torch.tensor(rng.random(batch) < 0.3),
    )


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_targets_match_a_step_by_step_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    batch = random_batch(rng, 16, 9)
    bootstrap = torch.tensor(rng.normal(size=(16, 9)), dtype=torch.float32)
    targets, valid = n_step_targets(batch, bootstrap, n)
    r, d, b = batch.reward.numpy(), batch.discount.numpy(), bootstrap.numpy()
    for i, length in enumerate(batch.lengths.tolist()):
        last = length - 1
        for t in range(9):
            terminal_last = t == last and d[i, last] == 0
            assert bool(valid[i, t]) == (t < last or terminal_last), (i, t)
            if t < last:
                k = min(n, last - t)
                expected, scale = 0.0, 1.0
                for j in range(k):
                    expected += scale * r[i, t + j]
                    scale *= d[i, t + j]
                expected += scale * b[i, t + k]
                assert targets[i, t].item() == pytest.approx(expected, rel=1e-5, abs=1e-5), (i, t)
            elif terminal_last:
                assert targets[i, t].item() == pytest.approx(r[i, t])


@pytest.mark.parametrize("stop", [True, False])
def test_the_burn_in_passes_no_gradient_when_stopped(stop: bool) -> None:
    torch.manual_seed(0)
    net, target = RecurrentQNetwork(SPACES, core_size=8), RecurrentQNetwork(SPACES, core_size=8)
    batch = random_batch(np.random.default_rng(1), 8, 10)
    batch = SequenceBatch(
        **{
            **batch.__dict__,
            "lengths": torch.full((8,), 10),
            "episode_start": torch.zeros(8, dtype=torch.bool),
        }
    )
    obs = batch.obs.clone().requires_grad_(True)
    batch = SequenceBatch(**{**batch.__dict__, "obs": obs})
    loss, _, _ = r2d2_loss(net, target, batch, torch.ones(8), n_step=2, burn_in=4, stop_burn_in_gradient=stop)
    loss.backward()
    burn_in_gradient = obs.grad[:, :4].abs().sum().item()
    assert (burn_in_gradient == 0.0) == stop
    assert obs.grad[:, 4:].abs().sum().item() > 0


def test_priorities_mix_the_largest_and_the_mean_error() -> None:
    torch.manual_seed(0)
    net, target = RecurrentQNetwork(SPACES, core_size=8), RecurrentQNetwork(SPACES, core_size=8)
    batch = random_batch(np.random.default_rng(2), 6, 7)
    _, eta_0, _ = r2d2_loss(net, target, batch, torch.ones(6), n_step=2, burn_in=0, eta=0.0)
    _, eta_1, _ = r2d2_loss(net, target, batch, torch.ones(6), n_step=2, burn_in=0, eta=1.0)
    _, eta_9, _ = r2d2_loss(net, target, batch, torch.ones(6), n_step=2, burn_in=0, eta=0.9)
    torch.testing.assert_close(eta_9, 0.9 * eta_1 + 0.1 * eta_0)
    assert (eta_1 >= eta_0 - 1e-7).all()  # the max is at least the mean


def cue_batch(rng: np.random.Generator, batch: int, steps: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """Sequences whose first observation shows a cue (+1 or -1) and later ones show nothing; at the last step,
    action 1 pays +1 when the cue was +1 and action 0 when it was -1 (the other -1); then the episode ends."""
    cue = rng.choice([-1.0, 1.0], batch)
    obs = np.zeros((batch, steps, 3), np.float32)
    obs[:, 0, 0] = cue
    obs[:, :, 2] = np.linspace(0, 1, steps)  # a clock, so the last step can be told apart
    action = rng.integers(0, 2, (batch, steps))
    reward = np.zeros((batch, steps), np.float32)
    right = (action[:, -1] == 1) == (cue > 0)
    reward[:, -1] = np.where(right, 1.0, -1.0)
    discount = np.full((batch, steps), 0.99, np.float32)
    discount[:, -1] = 0.0
    columns = {
        "obs": torch.tensor(obs),
        "action": torch.tensor(action),
        "reward": torch.tensor(reward),
        "discount": torch.tensor(discount),
        "lengths": torch.full((batch,), steps),
        "state": torch.zeros(batch, 2, 16),
        "prev_action": torch.zeros(batch, dtype=torch.long),
        "prev_reward": torch.zeros(batch),
        "episode_start": torch.ones(batch, dtype=torch.bool),
    }
    return columns, cue


def test_the_recurrent_learner_remembers_a_cue_across_a_sequence() -> None:
    torch.manual_seed(0)
    settings = types.SimpleNamespace(
        network="mlp",
        hidden_sizes=(32,),
        lstm_size=16,
        learning_rate=3e-3,
        target_update_period=50,
        sequence_burn_in=0,
        sequence_n_step=3,
    )
    learning = R2D2Learning(settings, SPACES, torch.device("cpu"))
    rng = np.random.default_rng(0)
    for step in range(1, 401):
        columns, _ = cue_batch(rng, 32, 6)
        result = learning.update(columns, torch.ones(32), step)
    assert result.td_abs.shape == (32,)
    columns, cue = cue_batch(np.random.default_rng(99), 200, 6)
    with torch.no_grad():
        b = columns
        prev_action = torch.cat([b["prev_action"].unsqueeze(1), b["action"][:, :-1]], dim=1)
        prev_reward = torch.cat([b["prev_reward"].unsqueeze(1), b["reward"][:, :-1]], dim=1)
        q, _ = learning.online.unroll(b["obs"], prev_action, prev_reward, learning.online.initial_state(200))
    chosen = q[:, -1].argmax(dim=1).numpy()
    accuracy = float(((chosen == 1) == (cue > 0)).mean())
    assert accuracy > 0.95, accuracy  # a network without memory is right half the time

"""R2D2's loss on a batch of sequence items: double-Q n-step targets inside each sequence, on the rescaled value
(rescaling.py), after a burn-in from the stored recurrent state, and the items' new priorities.

A sampled item of length L holds steps t = 0 .. L - 1 (padded to T past L):
    obs[t], action[t], reward[t] (after action[t]), discount[t] (gamma, or 0 when the episode terminated at t),
and its own fields: `state` (h, c) before step 0, and the previous action and reward before step 0 (the core's
inputs at step 0; later steps take them from the sequence). For step t the target looks k = min(n, L - 1 - t) steps
ahead, bootstrapping from the target network at step t + k with the online network's greedy action there (double
Q-learning) on the original scale:
    y_t = h( sum_{j<k} (prod_{i<j} discount[t+i]) reward[t+j]  +  (prod_{i<k} discount[t+i]) h^-1(Q_tgt(t+k, a*)) )
The last step has no step ahead: it is trained only when the episode terminated there (y = reward). Steps of the
burn-in (the first `burn_in`, except in an item that starts an episode, whose stored state is exact) only warm the
state up. The loss is 0.5 * delta^2 averaged over an item's trained steps, weighted by the item's importance weight;
its priority is eta * max|delta| + (1 - eta) * mean|delta| over them (eta = 0.9 in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from apexrl.algorithms.r2d2.networks import RecurrentQNetwork
from apexrl.algorithms.r2d2.rescaling import rescale, unscale


@dataclass(frozen=True)
class SequenceBatch:
    """Sequence items as the learner hands them over: steps [B, T, ...], the items' own fields [B, ...]."""

    obs: torch.Tensor
    action: torch.Tensor  # int64 [B, T]
    reward: torch.Tensor  # float32 [B, T]
    discount: torch.Tensor  # float32 [B, T]
    lengths: torch.Tensor  # int64 [B]
    state: torch.Tensor  # float32 [B, 2, core]: (h, c) before step 0
    prev_action: torch.Tensor  # int64 [B]
    prev_reward: torch.Tensor  # float32 [B]
    episode_start: torch.Tensor  # bool [B]: the item's first step starts an episode (no burn-in needed)

    def core_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The previous action and reward at every step [B, T]."""
        prev_action = torch.cat([self.prev_action.unsqueeze(1), self.action[:, :-1]], dim=1)
        prev_reward = torch.cat([self.prev_reward.unsqueeze(1), self.reward[:, :-1]], dim=1)
        return prev_action, prev_reward


def n_step_targets(
    batch: SequenceBatch, bootstrap: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets y_t on the original scale [B, T], which steps have one [B, T] bool) from `bootstrap` [B, T]: the
    value on the original scale to bootstrap from at each step (h^-1(Q_tgt(t, a*)))."""
    steps = batch.reward.shape[1]
    t = torch.arange(steps, device=batch.reward.device).unsqueeze(0)
    last = (batch.lengths - 1).unsqueeze(1)
    ahead = torch.clamp(torch.minimum(torch.full_like(t, n), last - t), min=0)  # k per step
    returns = torch.zeros_like(batch.reward)
    scale = torch.ones_like(batch.reward)
    for j in range(n):
        active = j < ahead
        reward = _shifted(batch.reward, j)
        discount = _shifted(batch.discount, j)
        returns = returns + torch.where(active, scale * reward, torch.zeros_like(reward))
        scale = torch.where(active, scale * discount, scale)
    index = torch.clamp(t + ahead, max=steps - 1).expand_as(returns)
    targets = returns + scale * bootstrap.gather(1, index)
    terminal_last = (t == last) & (batch.discount.gather(1, last.clamp(min=0)) == 0)
    targets = torch.where(terminal_last, batch.reward, targets)
    valid = ((t < last) | terminal_last) & (t <= last)
    return targets, valid


def _shifted(x: torch.Tensor, j: int) -> torch.Tensor:
    """x[:, t + j] at t (zeros past the end)."""
    if j == 0:
        return x
    return torch.cat([x[:, j:], torch.zeros_like(x[:, :j])], dim=1)


def r2d2_loss(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    batch: SequenceBatch,
    weights: torch.Tensor,
    *,
    n_step: int,
    burn_in: int,
    eta: float = 0.9,
    stop_burn_in_gradient: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(loss, new priorities [B] detached, stats) of one batch of sequence items (see the module docstring)."""
    prev_action, prev_reward = batch.core_inputs()
    state = (batch.state[:, 0], batch.state[:, 1])
    burning = ~batch.episode_start  # an item that starts an episode needs no burn-in
    stop = burning if stop_burn_in_gradient else None
    q_online, _ = online.unroll(batch.obs, prev_action, prev_reward, state, burn_in, stop)
    with torch.no_grad():
        q_target, _ = target.unroll(batch.obs, prev_action, prev_reward, state)
        greedy = q_online.argmax(dim=2, keepdim=True)
        bootstrap = unscale(q_target.gather(2, greedy).squeeze(2))
        targets, valid = n_step_targets(batch, bootstrap, n_step)
        targets = rescale(targets)
    steps = torch.arange(batch.action.shape[1], device=batch.action.device).unsqueeze(0)
    trained = valid & ((steps >= burn_in) | ~burning.unsqueeze(1))
    taken = q_online.gather(2, batch.action.unsqueeze(2)).squeeze(2)
    delta = torch.where(trained, targets - taken, torch.zeros_like(taken))
    count = trained.sum(dim=1).clamp(min=1)
    per_item = (0.5 * delta * delta).sum(dim=1) / count
    loss = (weights * per_item).mean()
    with torch.no_grad():
        magnitude = delta.abs()
        mean = magnitude.sum(dim=1) / count
        priorities = eta * magnitude.max(dim=1).values + (1.0 - eta) * mean
        stats = {
            "trained_steps": float(trained.sum()),
            "mean_q": float(taken[trained].mean()) if trained.any() else 0.0,
        }
    return loss, priorities, stats

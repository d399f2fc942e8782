"""The n-step double DQN loss with importance weights (Ape-X; van Hasselt et al., 2016; Schaul et al., 2016).

Each sampled transition carries what the actor computed (see `apexrl.algorithms.nstep`):
    obs       s_t
    action    a_t
    reward    R = r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1},  k = min(n, steps left in the episode)
    discount  gamma^k, or 0 when the episode terminated within those k steps
    next_obs  s_{t+k} (any finite observation when discount is 0; it is multiplied away)
so the target needs no gamma, no n and no done flag:
    y = R + discount * Q_target(s_{t+k}, argmax_a Q_online(s_{t+k}, a))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def double_q_target(
    online: nn.Module, target: nn.Module, reward: torch.Tensor, discount: torch.Tensor, next_obs: torch.Tensor
) -> torch.Tensor:
    """y = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a)), without gradient."""
    with torch.no_grad():
        next_action = online(next_obs).argmax(dim=1, keepdim=True)
        next_q = target(next_obs).gather(1, next_action).squeeze(1)
        return reward + discount * next_q


def double_dqn_loss(
    online: nn.Module,
    target: nn.Module,
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_obs: torch.Tensor,
    weights: torch.Tensor,
    huber_delta: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-weighted Huber loss on the TD error, and |TD error| (detached) for the new priorities.

    Shapes: obs/next_obs `[B, obs_dim]` float32, action `[B]` int64, reward/discount/weights `[B]` float32.
    """
    td_target = double_q_target(online, target, reward, discount, next_obs)
    q = online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    loss = (weights * F.huber_loss(q, td_target, reduction="none", delta=huber_delta)).mean()
    return loss, (td_target - q).detach().abs()


def td_error_abs(
    online: nn.Module,
    target: nn.Module,
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_obs: torch.Tensor,
) -> torch.Tensor:
    """|y - Q_online(obs, action)| without gradient: an actor's initial priorities (pass its net as both)."""
    with torch.no_grad():
        q = online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        return (double_q_target(online, target, reward, discount, next_obs) - q).abs()

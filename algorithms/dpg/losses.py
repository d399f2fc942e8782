"""Ape-X DPG's losses (Horgan et al., 2018; Lillicrap et al., 2016), with TD3's options (Fujimoto et al., 2018).

Each sampled transition carries what the actor computed (`apexrl.algorithms.nstep`): obs s_t, action a_t (as taken,
in the environment's units), reward R (the discounted k-step return), discount (gamma^k, or 0 when the episode
terminated) and next_obs s_{t+k}. Then
    a'  = pi_target(s_{t+k})  [+ clip(N(0, target_noise), -noise_clip, noise_clip) per dimension, in units of half
                               the action range, then clipped to the bounds: target-policy smoothing]
    y   = R + discount * min_j Q_target_j(s_{t+k}, a')           (one critic: plain DPG; two: clipped double-Q)
    L_Q = mean_i w_i * sum_j (Q_j(s_t, a_t) - y_i)^2             (w: importance weights of prioritized replay)
    L_pi = -mean_i Q_1(s_t, pi(s_t))                             (the policy ascends the first critic)
and the new priority of row i is |y_i - Q_1(s_t, a_t)|: the TD error of the stored action.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def critic_target(
    target_policy: nn.Module,
    target_critics: Sequence[nn.Module],
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_obs: torch.Tensor,
    *,
    target_noise: float = 0.0,
    noise_clip: float = 0.5,
) -> torch.Tensor:
    """y = reward + discount * min_j Q_target_j(next_obs, a'), without gradient (see the module docstring)."""
    with torch.no_grad():
        next_action = target_policy(next_obs)
        if target_noise > 0:
            low, high = target_policy.action_low, target_policy.action_high
            half_range = (high - low) * 0.5
            noise = (torch.randn_like(next_action) * target_noise).clamp(-noise_clip, noise_clip) * half_range
            next_action = torch.maximum(torch.minimum(next_action + noise, high), low)
        next_q = torch.stack([critic(next_obs, next_action) for critic in target_critics]).min(dim=0).values
        return reward + discount * next_q


def critic_loss(
    critics: Sequence[nn.Module],
    obs: torch.Tensor,
    action: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The importance-weighted squared TD error summed over the critics, and |TD error| of the first critic
    (detached): the rows' new priorities."""
    q = [critic(obs, action) for critic in critics]
    loss = sum((weights * (q_j - target).pow(2)).mean() for q_j in q)
    return loss, (target - q[0]).detach().abs()


def policy_loss(policy: nn.Module, critic: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """-mean Q(s, pi(s)): minimising it ascends the critic along the policy's actions."""
    return -critic(obs, policy(obs)).mean()

"""Ape-X DPG on the learner's side: the policy, its critic(s), their target networks and optimisers, and the update
of `apexrl.algorithms.dpg.losses`: the critic every update, the policy every `policy_delay` updates, the targets
moved every `target_update_period` updates by Polyak averaging with `target_tau` (1: a hard copy)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.base import UpdateResult
from apexrl.algorithms.dpg.losses import critic_loss, critic_target, policy_loss
from apexrl.algorithms.dpg.networks import build_networks
from apexrl.algorithms.torsos import move_targets, state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces


class DPGLearning:
    """See `apexrl.algorithms.base.Learning`. `settings` is the learner's configuration with the algorithm's
    defaults filled in (`apexrl.algorithms.registry.with_defaults`)."""

    def __init__(self, settings: Any, spaces: EnvSpaces, device: torch.device) -> None:
        self.settings = s = settings
        critics = 2 if s.twin_critics else 1
        self.network, self.hidden_sizes, policy, critic_nets = build_networks(
            s.network, spaces, s.hidden_sizes, critics
        )
        self.policy = policy.to(device)
        self.critics = [c.to(device) for c in critic_nets]
        self.target_policy = copy.deepcopy(self.policy)
        self.target_critics = [copy.deepcopy(c) for c in self.critics]
        for net in (self.target_policy, *self.target_critics):
            net.requires_grad_(False)
        fused = device.type in ("cpu", "cuda")
        self.learning_rate = s.learning_rate
        self.policy_learning_rate = s.policy_learning_rate or s.learning_rate
        self.critic_optimizer = torch.optim.Adam(
            [p for c in self.critics for p in c.parameters()], lr=self.learning_rate, fused=fused
        )
        self.policy_optimizer = torch.optim.Adam(
            self.policy.parameters(), lr=self.policy_learning_rate, fused=fused
        )
        self._policy_loss = torch.zeros((), device=device)
        self.architecture = {
            "network": self.network,
            "hidden_sizes": list(self.hidden_sizes),
            "critics": critics,
            "obs_shape": list(spaces.obs_shape),
            "action_low": list(spaces.action_low),
            "action_high": list(spaces.action_high),
        }

    def update(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor, step: int) -> UpdateResult:
        s = self.settings
        obs = batch["obs"]
        target = critic_target(
            self.target_policy,
            self.target_critics,
            batch["reward"],
            batch["discount"],
            batch["next_obs"],
            target_noise=s.target_noise,
            noise_clip=s.target_noise_clip,
        )
        loss, td_abs = critic_loss(self.critics, obs, batch["action"], target, weights)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for critic in self.critics:
            torch.nn.utils.clip_grad_norm_(critic.parameters(), s.max_grad_norm)
        self.critic_optimizer.step()
        if step % s.policy_delay == 0:
            self.critics[0].requires_grad_(
                False
            )  # the policy's gradient flows through the critic, not into it
            try:
                actor_loss = policy_loss(self.policy, self.critics[0], obs)
                self.policy_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
            finally:
                self.critics[0].requires_grad_(True)
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), s.max_grad_norm)
            self.policy_optimizer.step()
            self._policy_loss = actor_loss.detach()
        if step % s.target_update_period == 0:
            move_targets(
                [self.target_policy, *self.target_critics], [self.policy, *self.critics], s.target_tau
            )
        return UpdateResult(td_abs=td_abs, loss=loss.detach(), stats={"policy_loss": self._policy_loss})

    def acting_weights(self) -> dict[str, np.ndarray]:
        """The policy (to act) and the first critic (for the initial priorities of the actors' transitions)."""
        return {
            **state_dict_to_numpy(self.policy, "policy."),
            **state_dict_to_numpy(self.critics[0], "critic."),
        }

    @torch.no_grad()
    def batch_stats(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """mean Q(s, pi(s)) on the batch, and the mean and standard deviation of pi(s) per action dimension."""
        actions = self.policy(batch["obs"])
        return {
            "mean_q": float(self.critics[0](batch["obs"], actions).mean()),
            "action_mean": actions.mean(dim=0).tolist(),
            "action_std": actions.std(dim=0).tolist(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "target_policy": self.target_policy.state_dict(),
            "critics": [c.state_dict() for c in self.critics],
            "target_critics": [c.state_dict() for c in self.target_critics],
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target_policy.load_state_dict(state["target_policy"])
        for nets, key in ((self.critics, "critics"), (self.target_critics, "target_critics")):
            for net, saved in zip(nets, state[key], strict=True):
                net.load_state_dict(saved)
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])

    def describe(self) -> str:
        s = self.settings
        td3 = [
            name
            for name, on in (
                ("clipped double-Q", s.twin_critics),
                ("target smoothing", s.target_noise > 0),
                (f"policy delay {s.policy_delay}", s.policy_delay > 1),
            )
            if on
        ]
        targets = "hard copy" if s.target_tau >= 1 else f"Polyak tau {s.target_tau:g}"
        return (
            f"DPG{' (' + ', '.join(td3) + ')' if td3 else ''}, {self.network} torso, hidden {self.hidden_sizes}, "
            f"lr critic {self.learning_rate:g} policy {self.policy_learning_rate:g}, targets {targets} every "
            f"{s.target_update_period}"
        )


def make_learning(settings: Any, spaces: EnvSpaces, device: torch.device) -> DPGLearning:
    return DPGLearning(settings, spaces, device)

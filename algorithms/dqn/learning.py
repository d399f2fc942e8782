"""Ape-X DQN on the learner's side: a dueling double DQN trained on n-step targets with importance weights
(`apexrl.algorithms.dqn.losses`), Adam, gradient clipping, and target networks moved every
`target_update_period` updates (a hard copy with the default target_tau 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.base import UpdateResult
from apexrl.algorithms.dqn.losses import double_dqn_loss
from apexrl.algorithms.dqn.networks import DEFAULT_HIDDEN, DEFAULT_LEARNING_RATE, build_network
from apexrl.algorithms.torso_specs import resolve_network
from apexrl.algorithms.torsos import move_targets, state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces


class DQNLearning:
    """The online and target Q-networks and their optimiser (see `apexrl.algorithms.base.Learning`)."""

    def __init__(self, settings: Any, spaces: EnvSpaces, device: torch.device) -> None:
        self.settings = settings
        self.network = resolve_network(settings.network, spaces)
        self.hidden_sizes = tuple(settings.hidden_sizes or DEFAULT_HIDDEN[self.network])
        self.online = build_network(self.network, spaces, self.hidden_sizes).to(device)
        self.target = build_network(self.network, spaces, self.hidden_sizes).to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.learning_rate = settings.learning_rate or DEFAULT_LEARNING_RATE[self.network]
        # Fused: one kernel for every parameter's update (0.59 -> 0.25 ms of a 4.3 ms CartPole update on a CPU).
        self.optimizer = torch.optim.Adam(
            self.online.parameters(), lr=self.learning_rate, fused=device.type in ("cpu", "cuda")
        )
        self.architecture = {
            "network": self.network,
            "hidden_sizes": list(self.hidden_sizes),
            "obs_dim": spaces.obs_dim,
            "num_actions": spaces.num_actions,
        }

    def update(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor, step: int) -> UpdateResult:
        s = self.settings
        loss, td_abs = double_dqn_loss(
            self.online,
            self.target,
            batch["obs"],
            batch["action"],
            batch["reward"],
            batch["discount"],
            batch["next_obs"],
            weights,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), s.max_grad_norm)
        self.optimizer.step()
        if step % s.target_update_period == 0:
            move_targets([self.target], [self.online], s.target_tau)
        return UpdateResult(td_abs=td_abs, loss=loss.detach())

    def acting_weights(self) -> dict[str, np.ndarray]:
        return state_dict_to_numpy(self.online)

    @torch.no_grad()
    def batch_stats(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        return {"mean_q": float(self.online(batch["obs"]).mean())}

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def describe(self) -> str:
        return (
            f"dueling double DQN, {self.network} torso, hidden {self.hidden_sizes}, lr {self.learning_rate:g}"
        )


def make_learning(settings: Any, spaces: EnvSpaces, device: torch.device) -> DQNLearning:
    return DQNLearning(settings, spaces, device)

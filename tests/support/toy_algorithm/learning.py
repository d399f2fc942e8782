"""The linear Q-learner's learning half: one torch Linear trained on n-step targets (a bootstrap from its own
detached values), importance-weighted Huber loss, Adam."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.base import UpdateResult
from apexrl.common.spaces import EnvSpaces


class LinearLearning:
    def __init__(self, settings: Any, spaces: EnvSpaces, device: torch.device) -> None:
        self.q = torch.nn.Linear(spaces.obs_dim, spaces.num_actions).to(device)
        self.learning_rate = settings.linear_learning_rate
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.learning_rate)
        self.architecture = {"obs_dim": spaces.obs_dim, "num_actions": spaces.num_actions}

    def update(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor, step: int) -> UpdateResult:
        obs, next_obs = batch["obs"].float(), batch["next_obs"].float()
        taken = self.q(obs).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            target = batch["reward"] + batch["discount"] * self.q(next_obs).max(dim=1).values
        td = target - taken
        loss = (weights * torch.nn.functional.huber_loss(taken, target, reduction="none")).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return UpdateResult(td_abs=td.detach().abs(), loss=loss.detach())

    def acting_weights(self) -> dict[str, np.ndarray]:
        return {name: value.detach().cpu().numpy() for name, value in self.q.state_dict().items()}

    @torch.no_grad()
    def batch_stats(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        return {"mean_q": float(self.q(batch["obs"].float()).mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.optimizer.load_state_dict(state["optimizer"])

    def describe(self) -> str:
        return f"linear Q-learning, lr {self.learning_rate:g}"


def make_learning(settings: Any, spaces: EnvSpaces, device: torch.device) -> LinearLearning:
    return LinearLearning(settings, spaces, device)

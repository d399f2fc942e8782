"""R2D2 on the learner's side: the recurrent online and target Q-networks, Adam, gradient clipping and target copies,
trained on batches of sequence items (losses.py).

A batch arrives as replay columns: the steps' fields [B, T, ...] (`obs`, `action`, `reward`, `discount`), each
item's `lengths` [B], and its own fields: `state` [B, 2, core] (the LSTM's (h, c) before its first step),
`prev_action` and `prev_reward` [B] (the core's inputs at that step) and `episode_start` [B] (whether that step
starts an episode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.base import UpdateResult
from apexrl.algorithms.r2d2.defaults import (
    DEFAULT_GEOMETRY,
    DEFAULT_HIDDEN,
    DEFAULT_LEARNING_RATE,
    DEFAULT_N_STEP,
    DEFAULT_TARGET_UPDATE_PERIOD,
)
from apexrl.algorithms.r2d2.losses import SequenceBatch, r2d2_loss
from apexrl.algorithms.r2d2.networks import RecurrentQNetwork
from apexrl.algorithms.torso_specs import resolve_network
from apexrl.algorithms.torsos import move_targets, state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces


@dataclass(frozen=True)
class R2D2Options:
    """R2D2's learning settings with their defaults filled in (the paper's, scaled down for vector tasks)."""

    n_step: int = DEFAULT_N_STEP
    burn_in: int = DEFAULT_GEOMETRY[False][0]
    priority_eta: float = 0.9
    stop_burn_in_gradient: bool = True
    core_size: int | None = None  # None: the torso's default (networks.DEFAULT_CORE_SIZE)
    learning_rate: float = DEFAULT_LEARNING_RATE[False]
    target_update_period: int = DEFAULT_TARGET_UPDATE_PERIOD
    max_grad_norm: float = 40.0

    @classmethod
    def from_settings(cls, settings: Any, images: bool = False) -> R2D2Options:
        """The options a learner config gives (its settings left at None take the defaults above; the burn-in the
        torso's, writing.DEFAULT_GEOMETRY)."""
        given = {
            "n_step": getattr(settings, "sequence_n_step", None),
            "burn_in": _given(getattr(settings, "sequence_burn_in", None), DEFAULT_GEOMETRY[images][0]),
            "priority_eta": getattr(settings, "priority_eta", None),
            "stop_burn_in_gradient": getattr(settings, "stop_burn_in_gradient", None),
            "core_size": getattr(settings, "lstm_size", None),
            "learning_rate": _given(getattr(settings, "learning_rate", None), DEFAULT_LEARNING_RATE[images]),
            "target_update_period": getattr(settings, "target_update_period", None),
            "max_grad_norm": getattr(settings, "max_grad_norm", None),
        }
        return cls(**{name: value for name, value in given.items() if value is not None})


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def sequence_batch(columns: Mapping[str, torch.Tensor]) -> SequenceBatch:
    """The learner's columns of a batch of sequence items as a SequenceBatch."""
    return SequenceBatch(
        obs=columns["obs"],
        action=columns["action"].long(),
        reward=columns["reward"].float(),
        discount=columns["discount"].float(),
        lengths=columns["lengths"].long(),
        state=columns["state"].float(),
        prev_action=columns["prev_action"].long(),
        prev_reward=columns["prev_reward"].float(),
        episode_start=columns["episode_start"].bool(),
    )


class R2D2Learning:
    """The online and target recurrent Q-networks and their optimiser (see `apexrl.algorithms.base.Learning`)."""

    def __init__(self, settings: Any, spaces: EnvSpaces, device: torch.device) -> None:
        self.network = resolve_network(getattr(settings, "network", "auto"), spaces)
        self.options = options = R2D2Options.from_settings(settings, images=self.network != "mlp")
        hidden = getattr(settings, "hidden_sizes", None)
        self.hidden_sizes = tuple(hidden or DEFAULT_HIDDEN[self.network])
        build = lambda: RecurrentQNetwork(spaces, self.network, self.hidden_sizes, options.core_size)  # noqa: E731
        self.online = build().to(device)
        self.target = build().to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=options.learning_rate)
        self.architecture = {
            "network": self.network,
            "hidden_sizes": list(self.hidden_sizes),
            "core_size": self.online.core_size,
            "obs_dim": spaces.obs_dim,
            "num_actions": spaces.num_actions,
        }

    def update(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor, step: int) -> UpdateResult:
        o = self.options
        loss, priorities, stats = r2d2_loss(
            self.online,
            self.target,
            sequence_batch(batch),
            weights,
            n_step=o.n_step,
            burn_in=o.burn_in,
            eta=o.priority_eta,
            stop_burn_in_gradient=o.stop_burn_in_gradient,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), o.max_grad_norm)
        self.optimizer.step()
        if step % o.target_update_period == 0:
            move_targets([self.target], [self.online], 1.0)
        return UpdateResult(td_abs=priorities, loss=loss.detach(), stats=stats)

    def acting_weights(self) -> dict[str, np.ndarray]:
        return state_dict_to_numpy(self.online)

    @torch.no_grad()
    def batch_stats(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Mean Q of the first step of each item, from its stored state (a cheap look at the value scale)."""
        if "state" not in batch:
            return {"mean_q": 0.0}
        b = sequence_batch(batch)
        q, _ = self.online(b.obs[:, 0], b.prev_action, b.prev_reward, (b.state[:, 0], b.state[:, 1]))
        return {"mean_q": float(q.mean())}

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
        o = self.options
        return (
            f"R2D2: {self.network} torso, hidden {self.hidden_sizes}, LSTM {self.online.core_size}, burn-in "
            f"{o.burn_in}{' (no gradient)' if o.stop_burn_in_gradient else ''}, {o.n_step}-step rescaled double Q, "
            f"eta {o.priority_eta:g}, lr {o.learning_rate:g}"
        )


def make_learning(settings: Any, spaces: EnvSpaces, device: torch.device) -> R2D2Learning:
    return R2D2Learning(settings, spaces, device)

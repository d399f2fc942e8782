"""How an exploring actor turns its steps into replay data, whichever kind its algorithm writes (its writing module
says): n-step transitions gathered from every environment into batches (DQN, DPG: `TransitionRecorder`), or each
environment's windows as its own trajectory of a sequence table (R2D2: `SequenceRecorder`). The actor's loop hands
each step of all its environments to `record` and calls `flush` after it; it never asks which it has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Step:
    """One step of every environment of an actor."""

    before: Any  # the acting state the actions were chosen in
    obs: np.ndarray  # the observations acted on
    actions: np.ndarray
    rewards: np.ndarray  # as trained on (clipped where the environment says so)
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict
    version: int  # the weights version acting


class TransitionRecorder:
    """Each environment's n-step transitions (its item writer), gathered into batches of `batch_size` rows sent by
    `send(rows, versions, stop)` (which takes the rows it sends off the lists)."""

    def __init__(
        self,
        item_writers: Sequence[Any],
        batch_size: int,
        send: Callable[[list, list, threading.Event], None],
    ) -> None:
        self.item_writers = list(item_writers)
        self.batch_size = batch_size
        self._send = send
        self.outbox: list = []  # transitions not sent yet
        self.versions: list[int] = []  # the weights version acting when each was completed

    def stop_on(self, stop: threading.Event) -> None:
        """Nothing to bind: `flush` and `send` take the run's stop each time."""

    def record(self, step: Step) -> None:
        for i, writer in enumerate(self.item_writers):
            done = step.terminated[i] or step.truncated[i]
            last_obs = step.info["final_obs"][i] if done else step.next_obs[i]
            completed = writer.push(
                step.obs[i], step.actions[i], step.rewards[i], last_obs, step.terminated[i], step.truncated[i]
            )
            self.outbox += completed
            self.versions += [step.version] * len(completed)

    def flush(self, stop: threading.Event) -> bool:
        """Send the full batches; whether any was sent."""
        if len(self.outbox) < self.batch_size:
            return False
        self._send(self.outbox, self.versions, stop)
        return True


class SequenceRecorder:
    """Each environment's windows (the writing module's ActorWindows, over the SDK's SequenceWriter per environment),
    with the Q-values the stepping acted on for their initial priorities. Windows go out as they complete."""

    def __init__(self, windows: Any, stepping: Any) -> None:
        self.windows = windows
        self._stepping = stepping

    def stop_on(self, stop: threading.Event) -> None:
        """The run's stop ends a window's wait for room on a shard (back pressure) or for a shard to be known."""
        for writer in self.windows.writers:
            writer.stop = stop

    def record(self, step: Step) -> None:
        self.windows.record(
            step.before,
            step.obs,
            step.actions,
            step.rewards,
            step.terminated,
            step.truncated,
            getattr(self._stepping, "last_q", None),
            step.version,
        )

    def flush(self, stop: threading.Event) -> bool:
        return False

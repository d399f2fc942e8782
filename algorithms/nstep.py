"""The replay items of Ape-X DQN and DPG: n-step transitions, computed on the actor (pure numpy; no torch, no gRPC).
This is their writing half (`Algorithm.writing()`): `make_writer` gives each environment its `NStepWriter`,
`item_columns` stacks the items into the columns of an insert, `replay_signature` is the table signature that
follows (what the launcher pins on the shards).

For the step taken at time t, with k = min(n, steps from t to the end of the episode), the actor sends
    obs       s_t
    action    a_t
    reward    r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}     (the discounted k-step return)
    discount  0        if the episode terminated at step t+k-1 (s_{t+k} is terminal: nothing to bootstrap)
              gamma^k  otherwise: k = n in mid-episode, k < n when the episode was truncated (time limit)
    next_obs  s_{t+k}  (on truncation, the real last observation, not the one the next episode starts from)
and the learner's target is `reward + discount * Q(next_obs, .)` with no other knowledge of n, gamma or
episode ends (see `apexrl.learner.losses`). Observations keep their dtype (uint8 pixels, bool MinAtar planes:
one byte each in replay), except floats, which become float32.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from apexrl.common.compression import is_image
from apexrl.common.signature import ROW_VERSION_COLUMN, Signature
from apexrl.common.spaces import EnvSpaces

if TYPE_CHECKING:
    from apexrl.algorithms.base import WriterSettings


class Transition(NamedTuple):
    """One n-step transition as the actor sends it (semantics in the module docstring). `action` is an int for
    a Discrete space, a float32 array for a Box (as taken: noise included, inside the bounds)."""

    obs: np.ndarray
    action: int | np.ndarray
    reward: float
    discount: float
    next_obs: np.ndarray


class NStepWriter:
    """Turns one environment's steps into n-step transitions (an `ItemWriter`: algorithms/base.py).

    Call `push` after every environment step, in order, with the observation the action was taken in and the
    one the step returned. It returns the transitions that became complete: none for the first n-1 steps of an
    episode, then one per step, and at the episode's end (terminated or truncated) all remaining ones.
    When an episode is abandoned without a terminal step (e.g. the actor restarts), call `reset`.
    """

    def __init__(self, n: int, gamma: float) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n ({n!r}) must be a positive integer")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma ({gamma!r}) must be in [0, 1]")
        self.n = n
        self.gamma = float(gamma)
        self._powers = self.gamma ** np.arange(n + 1)  # gamma^0 .. gamma^n
        self._pending: deque[tuple[np.ndarray, int | np.ndarray, float]] = deque()

    def __len__(self) -> int:
        """The number of steps still waiting for their n-step return."""
        return len(self._pending)

    def reset(self) -> None:
        """Drop the steps of an abandoned episode."""
        self._pending.clear()

    def push(
        self,
        obs: np.ndarray,
        action: int | np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> list[Transition]:
        """Record one step; return the transitions it completed, oldest first."""
        self._pending.append((stored_obs(obs), stored_action(action), float(reward)))
        episode_over = bool(terminated) or bool(truncated)
        if len(self._pending) < self.n and not episode_over:
            return []
        last_obs = stored_obs(next_obs)
        done: list[Transition] = []
        while self._pending and (episode_over or len(self._pending) == self.n):
            k = len(self._pending)
            rewards = np.fromiter((step[2] for step in self._pending), dtype=np.float64, count=k)
            ret = float(np.dot(self._powers[:k], rewards))
            discount = 0.0 if terminated else float(self._powers[k])
            first_obs, first_action, _ = self._pending.popleft()
            done.append(Transition(first_obs, first_action, ret, discount, last_obs))
        return done


def stored_obs(obs: np.ndarray) -> np.ndarray:
    """A copy of an observation as replay stores it: float32 for floats, its own dtype otherwise."""
    array = np.asarray(obs)
    return np.array(array, dtype=np.float32 if array.dtype.kind == "f" else array.dtype)


def stored_action(action: int | np.ndarray) -> int | np.ndarray:
    """An action as replay stores it: an int (Discrete) or a float32 copy (a Box)."""
    array = np.asarray(action)
    if array.ndim == 0 and array.dtype.kind in "iub":
        return int(array)
    return np.array(array, dtype=np.float32)


def make_writer(settings: WriterSettings, spaces: EnvSpaces) -> NStepWriter:
    """One environment's writer: n-step returns with the actor's `n_step` and `gamma`."""
    return NStepWriter(settings.n_step, settings.gamma)


def item_columns(transitions: Sequence[Transition]) -> dict[str, np.ndarray]:
    """Columns for a replay insert: obs/next_obs [B, *obs_shape] (float32, or the observations' own dtype: uint8
    pixels stay uint8), action int64[B] (Discrete) or float32[B, action_dim] (Box), reward/discount float32[B]."""
    if not transitions:
        raise ValueError("cannot stack an empty list of transitions")
    first = transitions[0].action
    if isinstance(first, np.ndarray):
        actions = np.stack([t.action for t in transitions]).astype(np.float32, copy=False)
    else:
        actions = np.fromiter((t.action for t in transitions), dtype=np.int64, count=len(transitions))
    return {
        "obs": _stacked([t.obs for t in transitions]),
        "action": actions,
        "reward": np.fromiter((t.reward for t in transitions), dtype=np.float32, count=len(transitions)),
        "discount": np.fromiter((t.discount for t in transitions), dtype=np.float32, count=len(transitions)),
        "next_obs": _stacked([t.next_obs for t in transitions]),
    }


def replay_signature(spaces: EnvSpaces, compression: str | None) -> Signature:
    """The table signature of what the built-in actor writes for an environment of `spaces` (item_columns, the
    weight_version column, common/compression.compress_image_columns): what the launcher and the Kubernetes
    manifests pin with `--signature`, so that no writer has to fix a table's columns by its first insert."""
    obs_dtype = np.dtype(spaces.obs_dtype)
    obs_dtype = np.dtype(np.float32) if obs_dtype.kind == "f" else obs_dtype
    obs = f"{obs_dtype.name}[{','.join(map(str, spaces.obs_shape))}]"
    if compression not in (None, "none") and is_image(obs_dtype, spaces.obs_shape):
        obs += f"@{compression}"
    action = "int64[]" if spaces.num_actions else f"float32[{spaces.action_dim}]"
    return Signature.parse(
        f"obs:{obs},action:{action},reward:float32[],discount:float32[],next_obs:{obs},"
        f"{ROW_VERSION_COLUMN}:int64[]"
    )


def _stacked(observations: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(observations)
    return stacked.astype(np.float32, copy=False) if stacked.dtype.kind == "f" else stacked

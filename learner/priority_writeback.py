"""New priorities back to the shards that own the rows (ARCHITECTURE §3, step 4): one StreamUpdatePriorities
stream per shard, asynchronous, with a shard's updates coalesced until `coalesce_rows` are waiting (a call costs
about the same whatever its size). Updates are never raised on: a lost one only delays a row's re-weighting, so
failures are counted instead."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from apexrl.learner.prioritized_batch import PrioritizedBatch
from apexrl.learner.shard_view import PrioritySink

log = logging.getLogger(__name__)


class PriorityWriteback:
    """The priority streams of a sampler's shards, by shard id, and what is buffered for each.

    `retired(s)` says whether shard s has left the fleet (its updates are dropped and counted)."""

    def __init__(self, coalesce_rows: int, timeout: float, retired: Callable[[int], bool]) -> None:
        self.coalesce_rows = coalesce_rows
        self.timeout = timeout
        self._retired = retired
        self._unsent = 0
        self.streams: list[PrioritySink] = []
        # Per shard: buffered (keys, priorities) pieces with their incarnation, waiting to be sent together.
        self._buffered: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self._buffered_incarnation: list[int] = []

    # ---------------------------------------------------------------------------------------- membership
    def add(self, stream: PrioritySink) -> None:
        """The stream of the next shard id."""
        self._buffered.append([])
        self._buffered_incarnation.append(0)
        self.streams.append(stream)

    def replace(self, s: int, stream: PrioritySink) -> None:
        """Shard s came back on a new connection."""
        self.streams[s] = stream

    def retire(self, s: int) -> None:
        """Shard s left: drop (and count) what was buffered for it and close its stream at once."""
        self._unsent += sum(len(k) for k, _ in self._buffered[s])
        self._buffered[s] = []
        self.streams[s].close(wait=0)

    # ---------------------------------------------------------------------------------------------- send
    def update(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
        """Buffer new raw priorities of a sampled batch per owning shard; send a shard's buffer once it holds
        `coalesce_rows` rows (or at once when the shard restarted since the buffered keys were drawn)."""
        priorities = np.asarray(priorities, dtype=np.float64)
        if priorities.shape != batch.keys.shape:
            raise ValueError(
                f"priorities {list(priorities.shape)} must match the batch {list(batch.keys.shape)}"
            )
        for s in np.unique(batch.shard_ids):
            mask = batch.shard_ids == s
            if self._retired(s):
                self._unsent += int(mask.sum())  # the shard left the fleet: its rows are gone with it
                continue
            incarnation = batch.incarnations[s]
            if self._buffered[s] and incarnation != self._buffered_incarnation[s]:
                self._send_buffered(s)  # the shard restarted: keys of two incarnations never share a message
            self._buffered[s].append((batch.keys[mask], priorities[mask]))
            self._buffered_incarnation[s] = incarnation
            if sum(len(k) for k, _ in self._buffered[s]) >= self.coalesce_rows:
                self._send_buffered(s)

    def zero(self, batch: PrioritizedBatch, rows: np.ndarray) -> None:
        """Priority 0 for rows `rows` of a sampled batch, straight to each shard's stream (thread-safe: past the
        buffer)."""
        rows = np.asarray(rows)
        for s in np.unique(batch.shard_ids[rows]):
            picked = rows[batch.shard_ids[rows] == s]
            if self._retired(s) or not self.streams[s].send(
                batch.keys[picked], np.zeros(len(picked)), batch.incarnations[s], timeout=self.timeout
            ):
                self._unsent += len(picked)

    def _send_buffered(self, s: int) -> None:
        """Send shard s's buffered updates as one message (later pieces last, so a repeated key's newest value
        wins on the shard)."""
        pieces, self._buffered[s] = self._buffered[s], []
        if not pieces:
            return
        keys = np.concatenate([k for k, _ in pieces])
        priorities = np.concatenate([p for _, p in pieces])
        if not self.streams[s].send(keys, priorities, self._buffered_incarnation[s], timeout=self.timeout):
            log.warning(
                "priority updates to %s backed up for %.0fs; dropping %d",
                self.streams[s].address,
                self.timeout,
                len(keys),
            )
            self._unsent += len(keys)

    def flush(self, timeout: float) -> None:
        """Send what is buffered, then wait until every update was answered (or dropped); TimeoutError
        otherwise."""
        for s in range(len(self.streams)):
            self._send_buffered(s)
        deadline = time.monotonic() + timeout
        for stream in self.streams:
            if not stream.flush(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"priority updates to {stream.address} still in flight at the deadline")

    # ------------------------------------------------------------------------------------------ counters
    @property
    def outstanding(self) -> int:
        return sum(stream.outstanding for stream in self.streams)

    @property
    def applied(self) -> int:
        return sum(stream.applied for stream in self.streams)

    @property
    def stale(self) -> int:
        return sum(stream.stale for stream in self.streams)

    @property
    def dropped(self) -> int:
        return self._unsent + sum(stream.dropped for stream in self.streams)

    @property
    def failures(self) -> int:
        return sum(stream.failures for stream in self.streams)

"""What the cross-shard sampler holds per shard: the `Shard` seam it calls (a ReplayClient, or any object with
the same calls), and its `ShardView`: totals as last reported and when, the shard's limits, its backoff.

A view is plain state with no lock: the client decides who touches it (a priority stream's thread calls `observe`
too, which replaces the totals whole)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from apexrl.replay_server.core.types import SampledBatch, ShardInfo, ShardTotals

T_co = TypeVar("T_co", covariant=True)

NO_TOTALS = ShardTotals(total_priority=0.0, size=0, min_priority=0.0, incarnation=0)


@dataclass
class ShardView:
    """The sampler's knowledge of one shard: totals as last reported (and when), its limits, its backoff."""

    totals: ShardTotals = NO_TOTALS
    observed_at: float = -math.inf  # monotonic time of the answer that brought `totals`
    min_size: int = 1
    max_batch: int = 0  # largest Sample the shard accepts; 0 until its Info arrived
    down_until: float = 0.0
    backoff: float = 0.0
    retired: bool = False  # its address no longer resolves: never sampled, refreshed or counted

    @property
    def size(self) -> int:
        return self.totals.size

    def observe(self, totals: ShardTotals, now: float) -> None:
        if totals.incarnation != self.totals.incarnation and self.totals.incarnation:
            self.max_batch = 0  # a restarted shard may run with other limits: ask its Info again
        self.totals = totals
        self.observed_at = now
        self.backoff = 0.0
        self.down_until = 0.0

    def fail(self, now: float, max_backoff: float) -> float:
        """Take the shard out of sampling for a doubling backoff; return the backoff in seconds."""
        self.backoff = min(max_backoff, max(0.25, self.backoff * 2))
        self.down_until = now + self.backoff
        return self.backoff

    def up(self, now: float) -> bool:
        return not self.retired and self.down_until <= now

    def sampleable(self, now: float) -> bool:
        return self.up(now) and self.max_batch > 0 and self.size >= max(1, self.min_size)


class Shard(Protocol):
    """What the sampler needs of one shard: a ReplayClient, or any object with the same calls (the learner
    benchmark passes in-process tables through this seam)."""

    address: str

    def sample_future(
        self, batch_size: int, *, timeout: float | None = None, batch_rows: Sequence[int] = ()
    ) -> ResultFuture[SampledBatch]: ...

    def info_future(self, *, timeout: float | None = None) -> ResultFuture[ShardInfo]: ...

    def priority_stream(
        self, max_in_flight: int, on_totals: Callable[[ShardTotals], None] | None = None
    ) -> PrioritySink: ...

    def close(self) -> None: ...


class ResultFuture(Protocol[T_co]):
    def result(self, timeout: float | None = None) -> T_co: ...


class PrioritySink(Protocol):
    """Where a shard's priority updates go: `send` queues (False when it could not within `timeout`)."""

    address: str
    applied: int
    stale: int
    dropped: int
    failures: int
    outstanding: int

    def send(
        self, keys: np.ndarray, priorities: np.ndarray, incarnation: int, timeout: float = 10.0
    ) -> bool: ...

    def flush(self, timeout: float) -> bool: ...

    def close(self, wait: float = 5.0) -> None: ...

"""In-process replay shards: a ReplayTable behind the `Shard` protocol of `apexrl.learner.sharded_client`.

Handed to the real `ShardedReplayClient` instead of addresses, so the learner benchmark's in-process mode runs
the production allocation across shards, importance weights and priority coalescing; only the transport
differs. A Sample "call" runs `ReplayTable.sample` at once in the caller's thread (one shard after the
other, where the gRPC client waits for the shards in parallel), and priority updates run
`ReplayTable.update_priorities` synchronously in the sender's thread (the train thread) instead of queueing
on a stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

from apexrl.common.errors import ApexError
from apexrl.replay_server.core.admission import NotReadyError
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.types import SampledBatch, ShardInfo, ShardTotals

T = TypeVar("T")


class Completed(Generic[T]):
    """A call that already ran: `result()` returns its value or raises its apexrl error, like the SDK's
    CallFuture."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: ApexError | None = None
        try:
            self._value = call()
        except ApexError as err:
            self._error = err

    def result(self, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class TableSink:
    """A PrioritySink that applies each update to the table at once; it never drops one."""

    def __init__(
        self, table: ReplayTable, address: str, on_totals: Callable[[ShardTotals], None] | None = None
    ) -> None:
        self.table = table
        self.address = address
        self._on_totals = on_totals
        self.applied = 0
        self.stale = 0
        self.dropped = 0
        self.failures = 0
        self.outstanding = 0  # applied at once: never any queued

    def send(self, keys: np.ndarray, priorities: np.ndarray, incarnation: int, timeout: float = 10.0) -> bool:
        result = self.table.update_priorities(
            np.asarray(keys, dtype=np.uint64), np.asarray(priorities, dtype=np.float64), incarnation
        )
        self.applied += result.applied
        self.stale += result.stale
        if self._on_totals is not None:
            self._on_totals(result.totals)
        return True

    def flush(self, timeout: float) -> bool:
        return True

    def close(self, wait: float = 5.0) -> None:
        return None


def sample_when_ready(
    table: ReplayTable, batch_size: int, timeout: float | None, batch_rows: Sequence[int] = ()
) -> SampledBatch:
    """table.sample, tried again while the table holds it back (NotReadyError) until `timeout`: the blocking wait a
    shard's server does on its event loop (waits.py), by polling, for in-process benchmarks."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return table.sample(batch_size, batch_rows=batch_rows)
        except NotReadyError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class TableShard:
    """One in-process shard: the `Shard` calls answered by a ReplayTable."""

    def __init__(
        self, table: ReplayTable, address: str, on_totals: Callable[[ShardTotals], None] | None = None
    ) -> None:
        self.table = table
        self.address = address
        self._on_totals = on_totals

    def sample_future(
        self, batch_size: int, *, timeout: float | None = None, batch_rows: Sequence[int] = ()
    ) -> Completed[SampledBatch]:
        return Completed(lambda: sample_when_ready(self.table, batch_size, timeout, batch_rows))

    def info_future(self, *, timeout: float | None = None) -> Completed[ShardInfo]:
        return Completed(self.table.info)

    def priority_stream(
        self, max_in_flight: int, on_totals: Callable[[ShardTotals], None] | None = None
    ) -> TableSink:
        return TableSink(self.table, self.address, on_totals)

    def close(self) -> None:
        return None

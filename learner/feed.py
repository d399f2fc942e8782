"""The learner's one feed interface: where its batches come from and where their new priorities go, whichever
process samples them. `SamplerProcess` (learner/sampler_process.py: a child process fills shared-memory slots, the
default) and `ThreadFeed` (a Prefetcher thread of this process over a ShardedReplayClient, or over in-process shards
in a benchmark) both are one; the learner loop reads only this surface and never asks which it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from apexrl.learner.prefetch import Prefetcher


class Batch(Protocol):
    """What the learner reads of a batch, whichever feed gave it: replay columns, importance weights, the rows the
    fleet held when it was drawn. It goes back to the feed with its new priorities."""

    columns: Mapping[str, Any]
    weights: np.ndarray
    fleet_size: int


class Feed(Protocol):
    """A source of prioritized batches (see the module docstring). `start(beta)` once, then `get` batches and send
    back each one's priorities; `stop` ends the sampling, `close` the connections."""

    def start(self, beta: Callable[[], float]) -> Feed: ...

    def get(self, timeout: float) -> Batch | None:
        """The next batch, or None when none came within `timeout` seconds."""
        ...

    def update_priorities(self, batch: Batch, priorities: np.ndarray) -> None: ...

    def flush_updates(self, timeout: float | None = None) -> None:
        """Wait until the priority updates sent are acknowledged; TimeoutError if they were not in time."""
        ...

    @property
    def depth(self) -> int:
        """Batches ready and waiting for the train step."""
        ...

    @property
    def rows_rejected(self) -> int:
        """Sampled rows whose compressed frames did not decompress (never trained on)."""
        ...

    @property
    def updates_outstanding(self) -> int: ...

    @property
    def updates_stale(self) -> int: ...

    @property
    def updates_dropped(self) -> int: ...

    def stop(self, wait: bool = True) -> None: ...

    def close(self) -> None: ...


class ThreadFeed:
    """A Feed sampled by a Prefetcher thread of this process from `sampler` (a ShardedReplayClient, or anything
    with its sample / update_priorities surface: in-process shards, a test's fake), with the learner's batch size,
    prefetch depth, minimum replay size, batches per call and seed from `config`."""

    def __init__(self, sampler: Any, config: Any) -> None:
        self.sampler = sampler
        self._config = config
        self._prefetcher: Prefetcher | None = None

    def start(self, beta: Callable[[], float]) -> ThreadFeed:
        from apexrl.learner.prefetch import Prefetcher

        c = self._config
        self._prefetcher = Prefetcher(
            self.sampler,
            c.batch_size,
            beta,
            c.prefetch_depth,
            c.min_replay_size,
            c.sample_batches_per_call,
            c.seed,
        ).start()
        return self

    def get(self, timeout: float) -> Batch | None:
        return self._prefetcher.get(timeout)

    def update_priorities(self, batch: Batch, priorities: np.ndarray) -> None:
        self.sampler.update_priorities(batch, priorities)

    def flush_updates(self, timeout: float | None = None) -> None:
        self.sampler.flush_updates(timeout=timeout)

    @property
    def depth(self) -> int:
        return 0 if self._prefetcher is None else self._prefetcher.depth

    @property
    def rows_rejected(self) -> int:
        decompressor = None if self._prefetcher is None else self._prefetcher.decompressor
        return 0 if decompressor is None else decompressor.rows_rejected

    @property
    def updates_outstanding(self) -> int:
        return self.sampler.updates_outstanding

    @property
    def updates_stale(self) -> int:
        return self.sampler.updates_stale

    @property
    def updates_dropped(self) -> int:
        return self.sampler.updates_dropped

    def stop(self, wait: bool = True) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop(wait=wait)

    def close(self) -> None:
        self.sampler.close()

"""ShardedReplayClient: one prioritized batch drawn across many replay shards (ARCHITECTURE §3).

Shard s holds total priority T_s; with T = sum_s T_s the client allocates the batch as k_s ~ Multinomial(B, T_s/T)
from its latest view of the shards, asks every shard with k_s > 0 for k_s stratified samples in parallel, and
so draws row i of shard s with probability P(i) = (T_s/T) * (p_i / T_s') where T_s' is the shard's total when
it answered (T_s' = T_s when nothing changed in between). Every Sample answer refreshes the view for free.

Importance weights follow PER/Ape-X: w_i = (N * P(i))^-beta / max_j w_j, N the fleet's size, and the maximum
taken over the whole fleet through each shard's minimum priority, so weights are comparable across batches.

A shard that fails is skipped (its mass leaves T) and retried after a backoff; the batch is drawn again from
the others. Priority updates go back to the owning shard asynchronously.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from apexrl.common.errors import ApexError, FailedPreconditionError, is_transient
from apexrl.replay_server.client import DEFAULT_MAX_MESSAGE_BYTES, ReplayClient
from apexrl.replay_server.wire import SampledBatch, ShardInfo, ShardTotals

log = logging.getLogger(__name__)
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class PrioritizedBatch:
    """A batch drawn across shards. Row j came from shard `shard_ids[j]` with key `keys[j]`."""

    columns: dict[str, np.ndarray]
    shard_ids: np.ndarray       # int32 [B]
    keys: np.ndarray            # uint64 [B]
    probabilities: np.ndarray   # float64 [B]: P(i) over the whole fleet
    weights: np.ndarray         # float32 [B]: normalised importance weights, max over the fleet = 1
    incarnations: tuple[int, ...]  # per shard: the incarnation its keys belong to (0 if not sampled)
    fleet_size: int

    def split(self, parts: int, rng: np.random.Generator) -> list[PrioritizedBatch]:
        """Cut into `parts` batches of random rows. Rows arrive grouped by shard and stratum, so they are
        shuffled first; every part is then a fair draw with the same probabilities and weights."""
        order = rng.permutation(len(self.keys))
        return [
            PrioritizedBatch({name: col[idx] for name, col in self.columns.items()}, self.shard_ids[idx],
                             self.keys[idx], self.probabilities[idx], self.weights[idx], self.incarnations,
                             self.fleet_size)
            for idx in np.array_split(order, parts)
        ]


_NO_TOTALS = ShardTotals(total_priority=0.0, size=0, min_priority=0.0, incarnation=0)


@dataclass
class _ShardView:
    """The sampler's latest knowledge of one shard: its totals as last reported, and its failure backoff."""

    totals: ShardTotals = _NO_TOTALS
    min_size: int = 1
    down_until: float = 0.0
    backoff: float = 0.0

    @property
    def size(self) -> int:
        return self.totals.size

    def observe(self, totals: ShardTotals) -> None:
        self.totals = totals
        self.backoff = 0.0
        self.down_until = 0.0

    def fail(self, now: float, max_backoff: float) -> float:
        """Take the shard out of sampling for a doubling backoff; return the backoff in seconds."""
        self.backoff = min(max_backoff, max(0.5, self.backoff * 2))
        self.down_until = now + self.backoff
        return self.backoff


class Shard(Protocol):
    """What the sampler needs of one shard: a ReplayClient, or any object with the same calls (the learner
    benchmark passes in-process tables through this seam)."""

    address: str

    def sample_future(self, batch_size: int, *, timeout: float | None = None) -> ResultFuture[SampledBatch]: ...

    def info_future(self, *, timeout: float | None = None) -> ResultFuture[ShardInfo]: ...

    def priority_stream(self, max_in_flight: int) -> PrioritySink: ...

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

    def send(self, keys: np.ndarray, priorities: np.ndarray, incarnation: int, timeout: float = 10.0) -> bool: ...

    def flush(self, timeout: float) -> bool: ...

    def close(self, wait: float = 5.0) -> None: ...


class ShardedReplayClient:
    """Samples across shards weighted by their root sums and routes priority updates to the owning shard.

    Args:
        addresses: `host:port` of every shard; shard ids are positions in this list. Or the shards themselves
            (objects with the `Shard` calls), for example in-process tables in a benchmark.
        timeout: default deadline per call, seconds.
        seed: seed of the batch allocation.
        max_backoff: longest pause before a failed shard is tried again, seconds.
        max_updates_in_flight: asynchronous priority updates outstanding before update_priorities blocks.
        coalesce_rows: priority updates for one shard are buffered until this many rows are waiting, then sent as
            one message (a call costs ~1 ms of CPU on each side whatever its size; bench/README.md). 0 sends each
            batch's updates at once. `flush_updates` sends what is buffered.
    """

    def __init__(
        self,
        addresses: Sequence[str] | Sequence[Shard],
        *,
        timeout: float = 10.0,
        seed: int | None = None,
        token: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_backoff: float = 10.0,
        max_updates_in_flight: int = 64,
        coalesce_rows: int = 0,
    ) -> None:
        if not addresses:
            raise ValueError("ShardedReplayClient needs at least one shard address")
        self.shards: list[Shard] = [
            ReplayClient(a, timeout=timeout, token=token, max_message_bytes=max_message_bytes)
            if isinstance(a, str) else a for a in addresses
        ]
        self.timeout = timeout
        self.max_backoff = max_backoff
        self._views = [_ShardView() for _ in addresses]
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # allocation and views; held across the sampling RPCs
        self._streams = [c.priority_stream(max_updates_in_flight) for c in self.shards]
        self._unsent = 0
        self.coalesce_rows = coalesce_rows
        # Per shard: buffered (keys, priorities) pieces and their incarnation, waiting to be sent together.
        self._buffered: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in addresses]
        self._buffered_incarnation = [0] * len(addresses)

    # ----------------------------------------------------------------------------------------------- views
    def refresh(self, *, timeout: float | None = None) -> None:
        """Ask every shard for its totals (in parallel); unreachable shards are marked down."""
        deadline = self.timeout if timeout is None else timeout
        calls = [(s, c.info_future(timeout=deadline)) for s, c in enumerate(self.shards)]
        now = time.monotonic()
        for s, call in calls:
            try:
                info = call.result()
                self._views[s].observe(info.totals)
                self._views[s].min_size = info.min_size_to_sample
            except ApexError as err:
                log.warning("shard %s unreachable (%s); skipping it for now", self.shards[s].address, err)
                self._views[s].fail(now, self.max_backoff)

    @property
    def fleet_size(self) -> int:
        return sum(v.size for v in self._views)

    # ---------------------------------------------------------------------------------------------- sample
    def sample(self, batch_size: int, *, beta: float = 0.4, timeout: float | None = None) -> PrioritizedBatch:
        """Draw `batch_size` rows across the fleet with probability p_i / sum(p) and importance weights."""
        if batch_size < 1:
            raise ValueError(f"batch_size ({batch_size}) must be >= 1")
        if not any(v.size for v in self._views):
            self.refresh(timeout=timeout)
        with self._lock:  # allocation and views are shared; the RPCs themselves run in parallel
            return self._sample_locked(batch_size, beta, timeout)

    def _live(self) -> list[int]:
        now = time.monotonic()
        return [s for s, v in enumerate(self._views) if v.down_until <= now and v.size >= max(1, v.min_size)]

    def _sample_locked(self, batch_size: int, beta: float, timeout: float | None) -> PrioritizedBatch:
        deadline = self.timeout if timeout is None else timeout
        for _ in range(len(self.shards) + 1):
            live = self._live()
            if not live:
                self.refresh(timeout=timeout)
                live = self._live()
                if not live:
                    break
            mass = np.array([self._views[s].totals.total_priority for s in live])
            if mass.sum() <= 0:  # every priority is 0: shards sample uniformly, so weigh them by size
                mass = np.array([float(self._views[s].size) for s in live])
            share = mass / mass.sum()
            counts = self._rng.multinomial(batch_size, share)
            calls = [(s, sh, self.shards[s].sample_future(int(k), timeout=deadline))
                     for s, sh, k in zip(live, share, counts, strict=True) if k > 0]
            parts: dict[int, tuple[float, SampledBatch]] = {}
            for s, sh, call in calls:
                try:
                    part = call.result()
                except ApexError as err:
                    if not is_transient(err):
                        raise
                    log.warning("shard %s failed to sample (%s); skipping it for %.1fs", self.shards[s].address,
                                err, self._views[s].fail(time.monotonic(), self.max_backoff))
                    continue
                parts[s] = (float(sh), part)
                self._views[s].observe(part.totals)
            if len(parts) == len(calls):
                return self._assemble(parts, beta)
            # A shard failed: draw the whole batch again from the others, so every row's probability comes from
            # one allocation (exact P(i)); failures are rare, the wasted rows cheap.
        raise FailedPreconditionError(
            f"no shard can be sampled: {', '.join(f'{c.address} ({v.size} rows)' for c, v in zip(self.shards, self._views, strict=True))}"
        )

    def _assemble(self, parts: dict[int, tuple[float, SampledBatch]], beta: float) -> PrioritizedBatch:
        order = sorted(parts)
        batches = [parts[s][1] for s in order]
        shard_ids = np.concatenate([np.full(len(b.keys), s, dtype=np.int32) for s, b in zip(order, batches, strict=True)])
        keys = np.concatenate([b.keys for b in batches])
        probabilities = np.concatenate([parts[s][0] * parts[s][1].probabilities for s in order])
        columns = {name: np.concatenate([b.columns[name] for b in batches]) for name in batches[0].columns}
        fleet_size = self.fleet_size
        # Smallest probability any stored row has: the fleet-wide normaliser of the weights (PER / Ape-X).
        total = sum(v.totals.total_priority for v in self._views if v.size > 0)
        mins = [v.totals.min_priority for v in self._views if v.size > 0 and v.totals.min_priority > 0]
        p_min = min(mins) / total if mins and total > 0 else probabilities.min()
        p_min = min(p_min, probabilities.min())
        weights = (fleet_size * probabilities) ** -beta / (fleet_size * p_min) ** -beta
        incarnations = tuple(parts[s][1].incarnation if s in parts else 0 for s in range(len(self.shards)))
        return PrioritizedBatch(columns, shard_ids, keys, probabilities, weights.astype(np.float32),
                                incarnations, fleet_size)

    # ------------------------------------------------------------------------------------------ priorities
    def update_priorities(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
        """Send new raw priorities for a sampled batch back to the owning shards, asynchronously, over one
        StreamUpdatePriorities stream per shard.

        Blocks only while `max_updates_in_flight` updates to a shard are outstanding. Failures are counted
        (`update_errors` requests, `updates_dropped` rows) and logged, never raised: a lost priority update only
        delays a row's re-weighting."""
        priorities = np.asarray(priorities, dtype=np.float64)
        if priorities.shape != batch.keys.shape:
            raise ValueError(f"priorities {list(priorities.shape)} must match the batch {list(batch.keys.shape)}")
        for s in np.unique(batch.shard_ids):
            mask = batch.shard_ids == s
            incarnation = batch.incarnations[s]
            if self._buffered[s] and incarnation != self._buffered_incarnation[s]:
                self._send_buffered(s)  # the shard restarted: keys of two incarnations never share a message
            self._buffered[s].append((batch.keys[mask], priorities[mask]))
            self._buffered_incarnation[s] = incarnation
            if sum(len(k) for k, _ in self._buffered[s]) >= self.coalesce_rows:
                self._send_buffered(s)

    def _send_buffered(self, s: int) -> None:
        """Send shard s's buffered updates as one message (later pieces last, so a repeated key's newest value
        wins on the shard)."""
        pieces, self._buffered[s] = self._buffered[s], []
        if not pieces:
            return
        keys = np.concatenate([k for k, _ in pieces])
        priorities = np.concatenate([p for _, p in pieces])
        if not self._streams[s].send(keys, priorities, self._buffered_incarnation[s], timeout=self.timeout):
            log.warning("priority updates to %s backed up for %.0fs; dropping %d", self.shards[s].address,
                        self.timeout, len(keys))
            self._unsent += len(keys)

    @property
    def updates_applied(self) -> int:
        return sum(stream.applied for stream in self._streams)

    @property
    def updates_stale(self) -> int:
        return sum(stream.stale for stream in self._streams)

    @property
    def updates_dropped(self) -> int:
        """Rows whose update was lost to a broken stream or a backed-up shard."""
        return self._unsent + sum(stream.dropped for stream in self._streams)

    @property
    def update_errors(self) -> int:
        """Priority streams that failed (each drops the updates it had in flight)."""
        return sum(stream.failures for stream in self._streams)

    def flush_updates(self, timeout: float | None = None) -> None:
        """Send what is buffered, then wait until every priority update was answered (or dropped); TimeoutError
        otherwise."""
        for s in range(len(self.shards)):
            self._send_buffered(s)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        for stream in self._streams:
            if not stream.flush(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"priority updates to {stream.address} still in flight at the deadline")

    def close(self) -> None:
        """Close every connection; Sample calls and priority streams still in flight are cancelled."""
        for stream in self._streams:
            stream.close(wait=0)
        for client in self.shards:
            client.close()
        for stream in self._streams:
            stream.close(wait=1.0)

    def __enter__(self) -> ShardedReplayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

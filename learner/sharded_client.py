"""ShardedReplayClient: one prioritized batch drawn across many replay shards (ARCHITECTURE §3).

Shard s holds total priority T_s; with T = sum_s T_s over the shards that can be sampled now (reachable and
holding at least their minimum size), the client allocates the batch as k_s ~ Multinomial(B, T_s/T) from its view
of the shards, asks every shard with k_s > 0 for k_s stratified samples in parallel (several calls when k_s is
above the shard's largest batch), and so draws row i of shard s with probability P(i) = (T_s/T) * (p_i / T_s')
where T_s' is the shard's total when it answered. P(i) is what the batch reports: the probability it was drawn
with, not an estimate.

Importance weights follow PER/Ape-X: w_i = (N * P(i))^-beta / max_j w_j, with N the rows of the shards this
allocation covered and the maximum taken over all of their rows through each shard's minimum priority, so a shard
that is down counts neither in N nor in the maximum.

Freshness: every Sample and priority-update answer carries the shard's totals; before each allocation, shards
whose view is older than `max_staleness` seconds (an empty or all-zero shard gets no sample answers) are asked
for their totals in parallel. So the allocation never uses totals older than `max_staleness` (plus one Info round
trip), and a shard that was empty, held only zero priorities, restarted or joined late is sampled in proportion to
its mass within that bound of getting it. A shard that fails is skipped (its mass leaves T; the batch is drawn
again from the others) and asked again after a doubling backoff of at most `max_backoff` seconds.

Membership: an address `dns:///NAME:PORT` stands for every address NAME resolves to (a Kubernetes headless
Service), re-resolved every `resolve_every` seconds (common/discovery.py). A new address becomes a new shard id and
joins with its own mass as soon as its totals are known; an address that disappears is retired: it leaves the
allocation, N and the weights' maximum at once, and its pending priority updates are dropped (counted). Shard ids
are never reused for another address, so the ids in a batch stay valid.

The parts live beside it: the per-shard view and the `Shard` seam (shard_view.py), the allocation and the calls
it makes (allocation.py), the batch and its weights (prioritized_batch.py), priority write-back
(priority_writeback.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from apexrl.common.discovery import Resolver, ShardAddresses, system_resolver
from apexrl.common.errors import ApexError, FailedPreconditionError, is_transient
from apexrl.common.tls import TlsFiles
from apexrl.learner.allocation import Piece, allocate, call_rows, cut, plan_calls
from apexrl.learner.prioritized_batch import AnswerRows, PrioritizedBatch, assemble
from apexrl.learner.priority_writeback import PriorityWriteback
from apexrl.learner.shard_view import PrioritySink, ResultFuture, Shard, ShardView
from apexrl.replay_server.client.replay_client import DEFAULT_MAX_MESSAGE_BYTES, ReplayClient
from apexrl.replay_server.core.types import SampledBatch, ShardTotals

# The batch and the seam are imported from here too (apexrl.learner re-exports them).
__all__ = ["PrioritizedBatch", "PrioritySink", "ResultFuture", "Shard", "ShardedReplayClient"]

log = logging.getLogger(__name__)


class ShardedReplayClient:
    """Samples across shards weighted by their root sums and routes priority updates to the owning shard.

    Args:
        addresses: `host:port` of every shard, or `dns:///NAME:PORT` for every address NAME resolves to; shard
            ids are positions in the list of shards seen so far. Or the shards themselves (objects with the
            `Shard` calls), for example in-process tables in a benchmark.
        timeout: default deadline per call, seconds.
        seed: seed of the batch allocation.
        token, tls: the shards' bearer token and TLS files (ReplayClient's), for every shard.
        max_staleness: the oldest totals an allocation may use, seconds (shards with older views are asked first).
        max_backoff: longest pause before a failed shard is tried again, seconds.
        max_updates_in_flight: asynchronous priority updates outstanding before update_priorities blocks.
        coalesce_rows: priority updates for one shard are buffered until this many rows are waiting, then sent as
            one message (a call costs ~1 ms of CPU on each side whatever its size; bench/README.md). 0 sends each
            batch's updates at once. `flush_updates` sends what is buffered.
        resolve_every: seconds between re-resolving `dns:///` addresses.
        resolver: how names are resolved (the system resolver: /etc/hosts, DNS).
    """

    def __init__(
        self,
        addresses: Sequence[str] | Sequence[Shard],
        *,
        timeout: float = 10.0,
        seed: int | None = None,
        token: str | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_staleness: float = 1.0,
        max_backoff: float = 5.0,
        max_updates_in_flight: int = 64,
        coalesce_rows: int = 0,
        resolve_every: float = 10.0,
        resolver: Resolver = system_resolver,
    ) -> None:
        if not addresses:
            raise ValueError("ShardedReplayClient needs at least one shard address")
        if not max_staleness > 0:
            raise ValueError(f"max_staleness ({max_staleness}) must be > 0")
        self.timeout = timeout
        self.max_staleness = max_staleness
        self.max_backoff = max_backoff
        self._connect = lambda address: ReplayClient(
            address, timeout=timeout, token=token, tls=tls, max_message_bytes=max_message_bytes
        )
        self._max_updates_in_flight = max_updates_in_flight
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # allocation; held across the sampling RPCs
        self._membership_lock = threading.Lock()  # adding and retiring shards
        # Per shard id (ids only grow): the client, the sampler's view, and (in the write-back) its priority stream.
        self.shards: list[Shard] = []
        self._views: list[ShardView] = []
        self._writeback = PriorityWriteback(coalesce_rows, timeout, lambda s: self._views[s].retired)
        self._ids: dict[str, int] = {}
        self._addresses: ShardAddresses | None = None
        if all(isinstance(a, str) for a in addresses):
            self._addresses = ShardAddresses(addresses, resolve_every=resolve_every, resolver=resolver)
            for address in self._addresses.current(force=True):
                self._add(self._connect(address))
        else:
            for shard in addresses:
                self._add(shard)

    @property
    def coalesce_rows(self) -> int:
        """Rows buffered per shard before its priority updates are sent as one message."""
        return self._writeback.coalesce_rows

    # ------------------------------------------------------------------------------------------ membership
    def _add(self, shard: Shard) -> int:
        s = len(self.shards)
        self._ids[shard.address] = s
        self._views.append(ShardView())
        self._writeback.add(shard.priority_stream(self._max_updates_in_flight, on_totals=self._observer(s)))
        self.shards.append(shard)  # last: a shard id is valid once everything it indexes exists
        return s

    def _sync_membership(self) -> None:
        """Follow what the `dns:///` addresses resolve to now: add new shards, retire departed ones, revive
        returning ones (with a fresh connection and view)."""
        if self._addresses is None or not self._addresses.dynamic:
            return
        with self._membership_lock:
            self._sync_membership_locked(set(self._addresses.current()))

    def _sync_membership_locked(self, now_present: set[str]) -> None:
        for address in sorted(now_present - {a for a, s in self._ids.items() if not self._views[s].retired}):
            s = self._ids.get(address)
            if s is None:
                s = self._add(self._connect(address))
            else:
                self.shards[s] = self._connect(address)
                self._views[s] = ShardView()
                self._writeback.replace(
                    s,
                    self.shards[s].priority_stream(self._max_updates_in_flight, on_totals=self._observer(s)),
                )
            log.info("shard %s joined (id %d)", address, s)
        for address, s in self._ids.items():
            if address not in now_present and not self._views[s].retired:
                self._views[s].retired = True
                self._writeback.retire(s)
                self.shards[s].close()
                log.info("shard %s left (id %d retired)", address, s)

    @property
    def addresses(self) -> list[str]:
        """The addresses of the shards in use now (not retired)."""
        return [
            shard.address for shard, view in zip(self.shards, self._views, strict=True) if not view.retired
        ]

    # ----------------------------------------------------------------------------------------------- views
    def _observer(self, s: int) -> Callable[[ShardTotals], None]:
        """Totals carried by priority-update answers (on the stream's thread) refresh shard s's view."""
        view = self._views[s]  # this connection's view: a revived shard gets a new one
        return lambda totals: view.observe(totals, time.monotonic())

    def refresh(self, *, timeout: float | None = None, only_stale: bool = False) -> None:
        """Ask shards for their totals and limits in parallel: every shard that is not backing off, or with
        `only_stale` those whose view is older than `max_staleness` (or whose limits are unknown). Unreachable
        shards are marked down."""
        self._sync_membership()
        deadline = self.timeout if timeout is None else timeout
        now = time.monotonic()
        targets = [
            s
            for s, v in enumerate(self._views)
            if v.up(now) and (not only_stale or v.max_batch == 0 or now - v.observed_at > self.max_staleness)
        ]
        calls = [(s, self.shards[s].info_future(timeout=deadline)) for s in targets]
        for s, call in calls:
            view = self._views[s]
            try:
                info = call.result()
            except ApexError as err:
                if view.backoff == 0:
                    log.warning("shard %s unreachable (%s); skipping it for now", self.shards[s].address, err)
                view.fail(time.monotonic(), self.max_backoff)
                continue
            view.observe(info.totals, time.monotonic())
            view.min_size = info.min_size_to_sample
            view.max_batch = info.max_sample_batch_size

    @property
    def fleet_size(self) -> int:
        """Rows held by the shards that are not backing off (the last view of each)."""
        now = time.monotonic()
        return sum(v.size for v in self._views if v.up(now))

    # ---------------------------------------------------------------------------------------------- sample
    def sample(self, batch_size: int, *, beta: float = 0.4, timeout: float | None = None) -> PrioritizedBatch:
        """Draw `batch_size` rows across the fleet with probability p_i / sum(p) and importance weights."""
        return self.sample_batches(batch_size, 1, beta=beta, timeout=timeout)[0]

    def sample_batches(
        self, batch_size: int, batches: int, *, beta: float = 0.4, timeout: float | None = None
    ) -> list[PrioritizedBatch]:
        """`batches` batches of `batch_size` rows, each drawn as `sample` draws one (its own allocation over the
        shards, its own strata on each shard), all of them in one Sample call per shard (replay.proto,
        SampleRequest.batch_rows): a call costs a shard about the same whatever its rows. An older shard answers
        one stratified batch of the same rows, which is cut into the batches at random: the same probabilities."""
        if batch_size < 1:
            raise ValueError(f"batch_size ({batch_size}) must be >= 1")
        if batches < 1:
            raise ValueError(f"batches ({batches}) must be >= 1")
        with self._lock:  # allocation and views are shared; the RPCs themselves run in parallel
            return self._sample_locked(batch_size, batches, beta, timeout)

    def _sample_locked(
        self, batch_size: int, batches: int, beta: float, timeout: float | None
    ) -> list[PrioritizedBatch]:
        deadline = self.timeout if timeout is None else timeout
        for _ in range(len(self.shards) + 1):
            self.refresh(timeout=timeout, only_stale=True)
            now = time.monotonic()
            live = [s for s, v in enumerate(self._views) if v.sampleable(now)]
            if not live:
                break
            shares, counts = allocate(
                self._rng, {s: self._views[s].totals for s in live}, batch_size, batches
            )
            max_batch = {s: self._views[s].max_batch for s in live}
            calls = [
                (s, pieces, self._start_sample(s, pieces, deadline))
                for s, pieces in plan_calls(counts, max_batch)
            ]
            parts: list[dict[int, list[AnswerRows]]] = [{} for _ in range(batches)]
            failed = False
            for s, pieces, call in calls:
                try:
                    part = call.result()
                except ApexError as err:
                    if not is_transient(err):
                        raise
                    self._failed(s, err)
                    failed = True
                    continue
                self._views[s].observe(part.totals, time.monotonic())
                for b, piece in cut(part, pieces, self._rng):
                    parts[b].setdefault(s, []).append(piece)
            if not failed:
                return [
                    assemble(parts[b], shares, self._covered(shares), len(self.shards), beta)
                    for b in range(batches)
                ]
            # A shard failed: draw the whole batch again from the others, so every row's probability comes from
            # one allocation (exact P(i)); failures are rare, the wasted rows cheap.
        views = ", ".join(
            f"{c.address} ({v.size} rows{', down' if not v.up(time.monotonic()) else ''})"
            for c, v in zip(self.shards, self._views, strict=True)
        )
        raise FailedPreconditionError(f"no shard can be sampled: {views}")

    def _start_sample(self, s: int, pieces: list[Piece], deadline: float) -> ResultFuture[SampledBatch]:
        rows, batch_rows = call_rows(pieces)
        if not batch_rows:
            return self.shards[s].sample_future(rows, timeout=deadline)
        return self.shards[s].sample_future(rows, timeout=deadline, batch_rows=batch_rows)

    def _failed(self, s: int, err: ApexError) -> None:
        """Shard s failed to sample: back off from it (named in the log when it was healthy until now)."""
        view = self._views[s]
        if view.backoff == 0:
            log.warning(
                "shard %s failed to sample (%s); skipping it for %.1fs",
                self.shards[s].address,
                err,
                view.fail(time.monotonic(), self.max_backoff),
            )
        else:
            view.fail(time.monotonic(), self.max_backoff)

    def _covered(self, shares: dict[int, float]) -> dict[int, ShardTotals]:
        """The totals now seen of every shard an allocation covered: N and the weights' maximum count them."""
        return {s: self._views[s].totals for s in shares}

    # ------------------------------------------------------------------------------------------ priorities
    def update_priorities(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
        """Send new raw priorities for a sampled batch back to the owning shards, asynchronously, over one
        StreamUpdatePriorities stream per shard.

        Blocks only while `max_updates_in_flight` updates to a shard are outstanding. Failures are counted
        (`update_errors` requests, `updates_dropped` rows) and logged, never raised: a lost priority update only
        delays a row's re-weighting."""
        self._writeback.update(batch, priorities)

    def zero_priorities(self, batch: PrioritizedBatch, rows: np.ndarray) -> None:
        """Set the priority of rows `rows` of a sampled batch to 0 at once, so they are not drawn again (unless
        every row of their shard has priority 0): what the data path does with rows whose frames do not
        decompress. Thread-safe: it goes straight to each shard's priority stream, past the coalescing buffer."""
        self._writeback.zero(batch, rows)

    @property
    def updates_outstanding(self) -> int:
        """Priority-update messages queued or in flight to the shards (each stream holds at most
        `max_updates_in_flight`)."""
        return self._writeback.outstanding

    @property
    def updates_applied(self) -> int:
        return self._writeback.applied

    @property
    def updates_stale(self) -> int:
        return self._writeback.stale

    @property
    def updates_dropped(self) -> int:
        """Rows whose update was lost to a broken stream or a backed-up shard."""
        return self._writeback.dropped

    @property
    def update_errors(self) -> int:
        """Priority streams that failed (each drops the updates it had in flight)."""
        return self._writeback.failures

    def flush_updates(self, timeout: float | None = None) -> None:
        """Send what is buffered, then wait until every priority update was answered (or dropped); TimeoutError
        otherwise."""
        self._writeback.flush(self.timeout if timeout is None else timeout)

    def close(self) -> None:
        """Close every connection; Sample calls and priority streams still in flight are cancelled."""
        for stream in self._writeback.streams:
            stream.close(wait=0)
        for client in self.shards:
            client.close()
        for stream in self._writeback.streams:
            stream.close(wait=1.0)

    def __enter__(self) -> ShardedReplayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

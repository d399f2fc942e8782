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
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from apexrl.common.compression import CompressedColumn, concatenate, take_rows
from apexrl.common.discovery import Resolver, ShardAddresses, system_resolver
from apexrl.common.errors import ApexError, FailedPreconditionError, is_transient
from apexrl.common.tls import TlsFiles
from apexrl.replay_server.client import DEFAULT_MAX_MESSAGE_BYTES, ReplayClient
from apexrl.replay_server.probabilities import importance_weights, shard_shares, smallest_probability
from apexrl.replay_server.types import SampledBatch, ShardInfo, ShardTotals

log = logging.getLogger(__name__)
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class PrioritizedBatch:
    """A batch drawn across shards. Row j came from shard `shard_ids[j]` with key `keys[j]`. Compressed fields
    are CompressedColumns (the learner's data path decompresses them: learner/prefetch.py)."""

    columns: dict[str, np.ndarray | CompressedColumn]
    shard_ids: np.ndarray  # int32 [B]
    keys: np.ndarray  # uint64 [B]
    probabilities: np.ndarray  # float64 [B]: P(i) over the whole fleet
    weights: np.ndarray  # float32 [B]: normalised importance weights, max over the fleet = 1
    incarnations: tuple[int, ...]  # per shard: the incarnation its keys belong to (0 if not sampled)
    fleet_size: int
    writers: np.ndarray | None = (
        None  # object [B]: each row's writer id, when the batch has compressed fields
    )

    def take(self, idx: np.ndarray) -> PrioritizedBatch:
        """The rows at `idx`, in that order."""
        return PrioritizedBatch(
            {name: take_rows(col, idx) for name, col in self.columns.items()},
            self.shard_ids[idx],
            self.keys[idx],
            self.probabilities[idx],
            self.weights[idx],
            self.incarnations,
            self.fleet_size,
            None if self.writers is None else self.writers[idx],
        )

    def split(self, parts: int, rng: np.random.Generator) -> list[PrioritizedBatch]:
        """Cut into `parts` batches of random rows. Rows arrive grouped by shard and stratum, so they are
        shuffled first; every part is then a fair draw with the same probabilities and weights."""
        order = rng.permutation(len(self.keys))
        return [self.take(idx) for idx in np.array_split(order, parts)]


_NO_TOTALS = ShardTotals(total_priority=0.0, size=0, min_priority=0.0, incarnation=0)


@dataclass
class _ShardView:
    """The sampler's knowledge of one shard: totals as last reported (and when), its limits, its backoff."""

    totals: ShardTotals = _NO_TOTALS
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
        self.coalesce_rows = coalesce_rows
        self._connect = lambda address: ReplayClient(
            address, timeout=timeout, token=token, tls=tls, max_message_bytes=max_message_bytes
        )
        self._max_updates_in_flight = max_updates_in_flight
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # allocation; held across the sampling RPCs
        self._membership_lock = threading.Lock()  # adding and retiring shards
        self._unsent = 0
        # Per shard id (ids only grow): the client, the sampler's view, the priority stream, and the buffered
        # (keys, priorities) pieces with their incarnation, waiting to be sent together.
        self.shards: list[Shard] = []
        self._views: list[_ShardView] = []
        self._streams: list[PrioritySink] = []
        self._buffered: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self._buffered_incarnation: list[int] = []
        self._ids: dict[str, int] = {}
        self._addresses: ShardAddresses | None = None
        if all(isinstance(a, str) for a in addresses):
            self._addresses = ShardAddresses(addresses, resolve_every=resolve_every, resolver=resolver)
            for address in self._addresses.current(force=True):
                self._add(self._connect(address))
        else:
            for shard in addresses:
                self._add(shard)

    # ------------------------------------------------------------------------------------------ membership
    def _add(self, shard: Shard) -> int:
        s = len(self.shards)
        self._ids[shard.address] = s
        self._views.append(_ShardView())
        self._buffered.append([])
        self._buffered_incarnation.append(0)
        self._streams.append(shard.priority_stream(self._max_updates_in_flight, on_totals=self._observer(s)))
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
                self._views[s] = _ShardView()
                self._streams[s] = self.shards[s].priority_stream(
                    self._max_updates_in_flight, on_totals=self._observer(s)
                )
            log.info("shard %s joined (id %d)", address, s)
        for address, s in self._ids.items():
            if address not in now_present and not self._views[s].retired:
                self._views[s].retired = True
                self._unsent += sum(len(k) for k, _ in self._buffered[s])
                self._buffered[s] = []
                self._streams[s].close(wait=0)
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
            shares, counts = self._allocate(batch_size, batches, live)
            calls = [
                (s, pieces, self._start_sample(s, pieces, deadline)) for s, pieces in self._calls(counts)
            ]
            parts: list[dict[int, list[SampledBatch]]] = [{} for _ in range(batches)]
            failed = False
            for s, pieces, call in calls:
                try:
                    part = call.result()
                except ApexError as err:
                    if not is_transient(err):
                        raise
                    if self._views[s].backoff == 0:
                        log.warning(
                            "shard %s failed to sample (%s); skipping it for %.1fs",
                            self.shards[s].address,
                            err,
                            self._views[s].fail(time.monotonic(), self.max_backoff),
                        )
                    else:
                        self._views[s].fail(time.monotonic(), self.max_backoff)
                    failed = True
                    continue
                self._views[s].observe(part.totals, time.monotonic())
                for b, piece in self._cut(part, pieces):
                    parts[b].setdefault(s, []).append(piece)
            if not failed:
                return [self._assemble(shares, parts[b], beta) for b in range(batches)]
            # A shard failed: draw the whole batch again from the others, so every row's probability comes from
            # one allocation (exact P(i)); failures are rare, the wasted rows cheap.
        views = ", ".join(
            f"{c.address} ({v.size} rows{', down' if not v.up(time.monotonic()) else ''})"
            for c, v in zip(self.shards, self._views, strict=True)
        )
        raise FailedPreconditionError(f"no shard can be sampled: {views}")

    def _allocate(
        self, batch_size: int, batches: int, live: list[int]
    ) -> tuple[dict[int, float], dict[int, np.ndarray]]:
        """Each sampleable shard's share of the probability mass, and its rows in each batch (one multinomial
        draw per batch)."""
        share = shard_shares(
            np.array([self._views[s].totals.total_priority for s in live]),
            np.array([float(self._views[s].size) for s in live]),
        )
        counts = (
            self._rng.multinomial(batch_size, share)[None, :]
            if batches == 1
            else self._rng.multinomial(batch_size, share, size=batches)
        )
        shares = {s: float(sh) for s, sh in zip(live, share, strict=True)}
        return shares, {s: counts[:, j] for j, s in enumerate(live)}

    def _calls(self, counts: dict[int, np.ndarray]) -> list[tuple[int, list[tuple[int, int]]]]:
        """(shard, pieces) of every Sample call, a piece being (batch, rows): each shard's batches in order, as few
        calls as its largest batch allows (a batch above it is cut into pieces, each drawn on its own)."""
        calls = []
        for s, rows in counts.items():
            limit, pieces, used = self._views[s].max_batch, [], 0
            for b, k in enumerate(rows.tolist()):
                while k > 0:
                    take = min(k, limit - used)
                    pieces.append((b, take))
                    used, k = used + take, k - take
                    if used == limit:
                        calls.append((s, pieces))
                        pieces, used = [], 0
            if pieces:
                calls.append((s, pieces))
        return calls

    def _start_sample(
        self, s: int, pieces: list[tuple[int, int]], deadline: float
    ) -> ResultFuture[SampledBatch]:
        rows = [k for _, k in pieces]
        if len(rows) == 1:
            return self.shards[s].sample_future(rows[0], timeout=deadline)
        return self.shards[s].sample_future(sum(rows), timeout=deadline, batch_rows=rows)

    def _cut(self, part: SampledBatch, pieces: list[tuple[int, int]]) -> list[tuple[int, SampledBatch]]:
        """The answer to one call as (batch, rows) pieces. An answer without the batches asked for (an older
        shard: one stratified batch of all the rows) is shuffled first, so each piece is a fair draw."""
        if len(pieces) == 1:
            return [(pieces[0][0], part)]
        rows = tuple(k for _, k in pieces)
        if part.batch_rows != rows:
            part = part.take(self._rng.permutation(len(part.keys)))
        ends = np.cumsum(rows)
        return [
            (b, part.take(slice(end - k, end))) for (b, k), end in zip(pieces, ends.tolist(), strict=True)
        ]

    def _assemble(
        self, shares: dict[int, float], parts: dict[int, list[SampledBatch]], beta: float
    ) -> PrioritizedBatch:
        order = sorted(parts)
        pieces = [(s, b) for s in order for b in parts[s]]
        shard_ids = np.concatenate([np.full(len(b.keys), s, dtype=np.int32) for s, b in pieces])
        keys = np.concatenate([b.keys for _, b in pieces])
        probabilities = np.concatenate([shares[s] * b.probabilities for s, b in pieces])
        columns = {name: concatenate([b.columns[name] for _, b in pieces]) for name in pieces[0][1].columns}
        writers = None
        if any(b.writers for _, b in pieces):
            writers = np.empty(len(keys), dtype=object)
            writers[:] = [w for _, b in pieces for w in (b.writers or ("",) * len(b.keys))]
        # N and the largest weight count exactly the shards this allocation covered (sampled from or not).
        fleet_size = sum(self._views[s].size for s in shares)
        p_min = min(probabilities.min(), self._smallest_probability(shares))
        weights = importance_weights(probabilities, fleet_size, p_min, beta)
        incarnations = tuple(parts[s][0].incarnation if s in parts else 0 for s in range(len(self.shards)))
        return PrioritizedBatch(
            columns,
            shard_ids,
            keys,
            probabilities,
            weights.astype(np.float32),
            incarnations,
            fleet_size,
            writers,
        )

    def _smallest_probability(self, shares: dict[int, float]) -> float:
        """The smallest P(i) any stored row of the covered shards has: the normaliser of the weights."""
        views = ((share, self._views[s].totals) for s, share in shares.items())
        return smallest_probability((share, t.total_priority, t.min_priority, t.size) for share, t in views)

    # ------------------------------------------------------------------------------------------ priorities
    def update_priorities(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
        """Send new raw priorities for a sampled batch back to the owning shards, asynchronously, over one
        StreamUpdatePriorities stream per shard.

        Blocks only while `max_updates_in_flight` updates to a shard are outstanding. Failures are counted
        (`update_errors` requests, `updates_dropped` rows) and logged, never raised: a lost priority update only
        delays a row's re-weighting."""
        priorities = np.asarray(priorities, dtype=np.float64)
        if priorities.shape != batch.keys.shape:
            raise ValueError(
                f"priorities {list(priorities.shape)} must match the batch {list(batch.keys.shape)}"
            )
        for s in np.unique(batch.shard_ids):
            mask = batch.shard_ids == s
            if self._views[s].retired:
                self._unsent += int(mask.sum())  # the shard left the fleet: its rows are gone with it
                continue
            incarnation = batch.incarnations[s]
            if self._buffered[s] and incarnation != self._buffered_incarnation[s]:
                self._send_buffered(s)  # the shard restarted: keys of two incarnations never share a message
            self._buffered[s].append((batch.keys[mask], priorities[mask]))
            self._buffered_incarnation[s] = incarnation
            if sum(len(k) for k, _ in self._buffered[s]) >= self.coalesce_rows:
                self._send_buffered(s)

    def zero_priorities(self, batch: PrioritizedBatch, rows: np.ndarray) -> None:
        """Set the priority of rows `rows` of a sampled batch to 0 at once, so they are not drawn again (unless
        every row of their shard has priority 0): what the data path does with rows whose frames do not
        decompress. Thread-safe: it goes straight to each shard's priority stream, past the coalescing buffer."""
        rows = np.asarray(rows)
        for s in np.unique(batch.shard_ids[rows]):
            picked = rows[batch.shard_ids[rows] == s]
            if self._views[s].retired or not self._streams[s].send(
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
        if not self._streams[s].send(keys, priorities, self._buffered_incarnation[s], timeout=self.timeout):
            log.warning(
                "priority updates to %s backed up for %.0fs; dropping %d",
                self.shards[s].address,
                self.timeout,
                len(keys),
            )
            self._unsent += len(keys)

    @property
    def updates_outstanding(self) -> int:
        """Priority-update messages queued or in flight to the shards (each stream holds at most
        `max_updates_in_flight`)."""
        return sum(stream.outstanding for stream in self._streams)

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

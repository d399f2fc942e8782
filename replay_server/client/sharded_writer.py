"""ShardedWriter: the SDK's writer to many replay shards, what every actor needs and the built-in one uses.

Ape-X actors spread their batches over the shards and must keep acting when one shard is down or slow. The writer
holds one `ReplayClient` per shard (acknowledged streaming inserts, resent after failures, at most
`max_in_flight` unacknowledged batches each: the backlog) and places each batch:

- round-robin, starting at shard `first_shard mod S` (actor i starts at shard i mod S, so actors spread out);
- failover: a shard whose backlog is full (down, or slower than its share) is skipped for the next one; its
  queued batches stay with its client, which resends them when the shard is back, so none is lost;
- back pressure: when every backlog is full, `insert` waits for room on the round-robin shard (the shards' rate
  limiters then pace the writer), re-following `dns:///` names every second meanwhile; `timeout` bounds the
  wait (DeadlineExceededError) and a set `stop` event ends it (nothing sent);
- membership: `dns:///NAME:PORT` stands for every address NAME resolves to (common/discovery.py), re-resolved
  every `resolve_every` seconds: a new address is connected and joins the rotation, a departed one is closed (its
  unacknowledged batches are dropped with it and counted in `dropped_batches`).

Not thread-safe for writing: one thread inserts and flushes (an actor's loop); `shards`, `addresses` and
`backlog()` may be read from any thread (a metrics scrape).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apexrl.common.discovery import Resolver, ShardAddresses, system_resolver
from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.common.tls import TlsFiles
from apexrl.replay_server.client.replay_client import DEFAULT_MAX_MESSAGE_BYTES, ReplayClient

log = logging.getLogger(__name__)

# While every backlog is full: how long one wait on the round-robin shard lasts before names are followed again.
_FULL_WAIT_SECONDS = 1.0


@dataclass(frozen=True)
class Placement:
    """Where `ShardedWriter.insert` queued a batch."""

    address: str  # the shard's host:port
    sequence: int  # the batch's sequence number on that shard's client
    failed_over: bool  # the round-robin shard's backlog was full: the batch went to a later one


class ShardedWriter:
    """Inserts batches into many replay shards: round-robin, failover, back pressure, `dns:///` membership.

    Args:
        addresses: `host:port` of every shard, or `dns:///NAME:PORT` for every address NAME resolves to (one
            string is one target); checked at once (ValueError naming the bad entry).
        first_shard: the round-robin starts at shard `first_shard mod S` (an actor's index spreads actors out).
        timeout: default deadline in seconds of each client's calls, and of `flush`.
        max_in_flight: unacknowledged batches per shard (its backlog) before the writer passes the shard over.
        max_message_bytes: largest message sent; larger batches raise ResourceExhaustedError.
        token: bearer token when the shards require one.
        tls: TLS files when the shards serve TLS.
        resolve_every: seconds between re-resolving `dns:///` addresses.
        resolver: how names are resolved (the system resolver: /etc/hosts, DNS).
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        first_shard: int = 0,
        timeout: float = 30.0,
        max_in_flight: int = 8,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        token: str | None = None,
        tls: TlsFiles | None = None,
        resolve_every: float = 10.0,
        resolver: Resolver = system_resolver,
    ) -> None:
        targets = (addresses,) if isinstance(addresses, str) else tuple(addresses)
        if not targets:
            raise ValueError("ShardedWriter needs at least one shard address")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight ({max_in_flight}) must be >= 1")
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self._addresses = ShardAddresses(targets, resolve_every=resolve_every, resolver=resolver)
        self._connect = lambda address: ReplayClient(
            address,
            timeout=timeout,
            token=token,
            tls=tls,
            max_in_flight=max_in_flight,
            max_message_bytes=max_message_bytes,
        )
        self._shards: list[ReplayClient] = []  # replaced, never changed in place: readers get a snapshot
        self._closed = threading.Event()
        self.dropped_batches = 0  # unacknowledged batches of shards that left the name
        self._sync(force=True, initial=True)
        self._next = first_shard % max(1, len(self._shards))

    # ------------------------------------------------------------------------------------------------- state
    @property
    def shards(self) -> list[ReplayClient]:
        """The clients of the shards in the rotation now, in the order they joined."""
        return list(self._shards)

    @property
    def addresses(self) -> list[str]:
        """The `host:port` of the shards in the rotation now (what `dns:///` names resolved to)."""
        return [client.address for client in self._shards]

    def backlog(self) -> dict[str, int]:
        """Unacknowledged batches per shard address (each at most `max_in_flight`): the writer's queues."""
        return {client.address: client.pending for client in self._shards}

    # ---------------------------------------------------------------------------------------------- membership
    def _sync(self, force: bool = False, initial: bool = False) -> None:
        """Follow what `dns:///` addresses resolve to now: connect to new shards, drop departed ones (their
        unacknowledged batches are lost with them and counted)."""
        if self._shards and not self._addresses.dynamic:
            return
        present = self._addresses.current(force=force)
        leaving = [c for c in self._shards if c.address not in present]
        shards = [c for c in self._shards if c.address in present]
        known = {c.address for c in shards}
        for address in present:
            if address not in known:
                shards.append(self._connect(address))
                if not initial:  # at start-up the caller names its shards
                    log.info("shard %s joined", address)
        self._shards = shards
        for client in leaving:
            lost = client.pending
            client.close()
            self.dropped_batches += lost
            log.info("shard %s left; %d unacknowledged batches dropped with it", client.address, lost)

    # ------------------------------------------------------------------------------------------------- insert
    def insert(
        self,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Placement | None:
        """Queue one batch on a shard (round-robin; a shard with a full backlog is skipped) and say where.

        When every backlog is full, wait for room on the round-robin shard: forever with `timeout` None (back
        pressure), else up to `timeout` seconds, then DeadlineExceededError (nothing queued). Returns None, the
        batch not queued, once `stop` is set. A shard's refusal of an earlier batch is raised here or by `flush`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = stop if stop is not None else self._closed
        self._sync()
        start = self._next
        while not waiter.is_set():
            shards = self._shards
            n = len(shards)
            if n == 0:  # a name that resolves to no shard yet
                if not waiter.wait(self._wait_time(deadline, "no shard address resolved")):
                    self._sync(force=True)
                continue
            start %= n
            self._next = (start + 1) % n
            for attempt in range(n):
                client = shards[(start + attempt) % n]
                try:
                    sequence = client.insert(columns, priorities, timeout=0.0)
                except DeadlineExceededError:
                    continue
                return Placement(client.address, sequence, failed_over=attempt > 0)
            client = shards[start]
            wait = self._wait_time(deadline, f"every backlog full ({n} shards, {self.max_in_flight} each)")
            try:
                return Placement(client.address, client.insert(columns, priorities, timeout=wait), False)
            except DeadlineExceededError:
                # Every shard is full. Follow the names meanwhile: a shard that joined since (a headless Service
                # that listed only the pods Ready when the writer started) may have room; without this, writers
                # blocked on the first shard's rate limiter never learn of the others, and a learner waiting for
                # its minimum replay size waits forever.
                self._sync()
        if waiter is self._closed:
            raise UnavailableError("the writer is closed")
        return None

    def pick(
        self,
        preferred: str | None = None,
        *,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> ReplayClient | None:
        """The shard a writer that must stay on one shard (a SequenceWriter: its items refer to steps it sent
        there) writes to next: `preferred` while its backlog has room, else the next shard with room in the
        round-robin (failover), else `preferred` (or the round-robin's), whose `insert` then waits for room (back
        pressure). While no shard is known (a Service name that lists no Ready shard yet), waits for one as
        `insert` does: up to `timeout` (then DeadlineExceededError; None: forever), None once `stop` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = stop if stop is not None else self._closed
        self._sync()
        while not self._shards:
            if waiter.is_set():
                if waiter is self._closed:
                    raise UnavailableError("the writer is closed")
                return None
            if not waiter.wait(self._wait_time(deadline, "no shard address resolved")):
                self._sync(force=True)
        shards = self._shards
        current = next((c for c in shards if c.address == preferred), None)
        if current is not None and current.pending < self.max_in_flight:
            return current
        start = self._next % len(shards)
        self._next = (start + 1) % len(shards)
        for attempt in range(len(shards)):
            client = shards[(start + attempt) % len(shards)]
            if client.pending < self.max_in_flight:
                return client
        return current or shards[start]

    def _wait_time(self, deadline: float | None, why: str) -> float:
        """One wait of the back-pressure loop; DeadlineExceededError naming `why` once the deadline has passed."""
        if deadline is None:
            return _FULL_WAIT_SECONDS
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError(f"insert: {why} until the deadline")
        return min(_FULL_WAIT_SECONDS, left)

    # --------------------------------------------------------------------------------------------------- end
    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued batch is acknowledged, `timeout` seconds (default: the writer's) for all shards
        together; DeadlineExceededError names the shards still behind; a refused batch's error is raised."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        behind = []
        for client in self._shards:
            try:
                client.flush(max(0.0, deadline - time.monotonic()))
            except DeadlineExceededError:
                behind.append(f"{client.address} ({client.pending} batches)")
        if behind:
            raise DeadlineExceededError(f"flush: still unacknowledged on {', '.join(behind)}")

    def close(self, flush_timeout: float = 0.0) -> None:
        """Flush what was queued within `flush_timeout` seconds in total (a stopped learner may leave the shards'
        rate limiters holding inserts back), then close every connection."""
        self._closed.set()
        closers = [
            threading.Thread(target=client.close, kwargs={"flush_timeout": flush_timeout}, daemon=True)
            for client in self._shards
        ]  # together: a dead shard must not use up the live ones' time
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(flush_timeout + 6.0)

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush_timeout=self.timeout if exc[0] is None else 0.0)

"""PriorityStream: asynchronous priority updates to one shard over the StreamUpdatePriorities RPC.

A learner writes priorities back after every batch. A unary call per batch costs a round trip and ~1 ms of
server time in gRPC's unary path; one long-lived stream with many requests in flight roughly doubles what a
shard can absorb (bench/README.md). Updates are fire-and-forget: if the stream breaks, the requests in flight
are dropped and counted, because a lost priority update only delays a row's re-weighting, and the thread
reconnects with backoff.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import grpc
import numpy as np

from apexrl.proto import replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.core.types import ShardTotals

log = logging.getLogger(__name__)


class PriorityStream:
    """Background sender of UpdatePrioritiesRequests to one shard; thread-safe."""

    def __init__(
        self,
        stub: replay_pb2_grpc.ReplayServiceStub,
        address: str,
        *,
        max_in_flight: int = 32,
        on_totals: Callable[[ShardTotals], None] | None = None,
    ) -> None:
        self.address = address
        self._on_totals = on_totals
        self._stub = stub
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0  # queued or in flight
        self._max_in_flight = max_in_flight
        self._closed = False
        self.applied = 0
        self.stale = 0
        self.dropped = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=f"apexrl-priorities-{address}", daemon=True)
        self._thread.start()

    @property
    def outstanding(self) -> int:
        """Update messages queued or in flight (bounded by max_in_flight)."""
        return self._outstanding

    def send(self, keys: np.ndarray, priorities: np.ndarray, incarnation: int, timeout: float = 10.0) -> bool:
        """Queue new raw priorities for `keys` of `incarnation` as one message; block while `max_in_flight` are
        outstanding. False when the deadline passed first (the update was not queued)."""
        request = wire.encode_update(keys, priorities, incarnation)
        rows = len(keys)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._outstanding >= self._max_in_flight and not self._closed:
                if not self._cond.wait(deadline - time.monotonic()):
                    return False
            if self._closed:
                return False
            self._outstanding += 1
        self._queue.put((request, rows))
        return True

    def flush(self, timeout: float) -> bool:
        """Wait until every queued update was answered or dropped; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._outstanding:
                if not self._cond.wait(deadline - time.monotonic()):
                    return False
        return True

    def _requests(self, stream: _StreamState):
        """Request iterator of one stream. Stops when that stream died (handing back an item it took) or on close."""
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                if stream.dead or self._closed:
                    return
                continue
            request, rows = item
            with self._cond:
                if stream.dead:
                    self._queue.put(item)  # for the next stream
                    return
                stream.in_flight.append(rows)
            yield request

    def _run(self) -> None:
        backoff = 0.1
        while not self._closed:
            stream = _StreamState()
            try:
                replies = self._stub.StreamUpdatePriorities(self._requests(stream))
            except (
                ValueError
            ):  # the client's channel was closed (ReplayClient.close) while this waited to reconnect
                return
            try:
                for reply in replies:
                    result = wire.decode_update_result(reply)
                    if self._on_totals is not None:
                        self._on_totals(result.totals)
                    with self._cond:
                        stream.in_flight.popleft()
                        self._outstanding -= 1
                        self.applied += result.applied
                        self.stale += result.stale
                        self._cond.notify_all()
                    backoff = 0.1
                error = None
            except grpc.RpcError as err:
                error = err
            with self._cond:
                stream.dead = True
                lost = len(stream.in_flight)
                self.dropped += sum(stream.in_flight)
                self._outstanding -= lost
                self._cond.notify_all()
            if self._closed:
                return
            if error is not None:
                self.failures += 1
                log.warning(
                    "priority stream to %s failed (%s: %s); %d updates dropped, reconnecting",
                    self.address,
                    error.code().name,
                    error.details(),
                    lost,
                )
                time.sleep(backoff)
                backoff = min(5.0, backoff * 2)

    def close(self, wait: float = 5.0) -> None:
        """Stop sending (flush() first to wait for answers); wait up to `wait` seconds for the thread to end.
        Closing the channel under a stream ends it at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if wait:
            self._thread.join(timeout=wait)


class _StreamState:
    def __init__(self) -> None:
        self.dead = False
        self.in_flight: deque[int] = deque()  # rows of each request sent on this stream, oldest first

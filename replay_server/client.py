"""ReplayClient: the public SDK for one replay shard (insert / sample / update priorities / info).

Numpy in, numpy out; every call has a deadline; failures raise apexrl.common.errors exceptions.

Inserts go through one long-lived bidirectional stream run by a background thread. Each batch gets a sequence
number and stays in a pending list until the shard acknowledges it; when the stream breaks, the thread reconnects
with backoff and resends every pending batch, and the shard drops the ones it already stored, so no batch is lost
or stored twice (gRPC's own retries do not cover streams). The pending list is bounded (`max_in_flight`), which
is the flow control: `insert` blocks while it is full.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping

import grpc
import numpy as np

from apexrl.common import grpc_util
from apexrl.common.errors import (
    ApexError,
    DeadlineExceededError,
    ResourceExhaustedError,
    UnavailableError,
    error_for_code,
    from_rpc_error,
    status_code_from_int,
)
from apexrl.common.grpc_util import CallFuture
from apexrl.common.tls import TlsFiles
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.priority_stream import PriorityStream
from apexrl.replay_server.wire import CheckpointResult, SampledBatch, ShardInfo, ShardTotals, UpdateResult

log = logging.getLogger(__name__)

# A shard's default message limit (64 MiB: an insert of ~1,000 Atari transitions); larger batches are refused.
DEFAULT_MAX_MESSAGE_BYTES = grpc_util.DEFAULT_MAX_MESSAGE_BYTES

# Per-batch answers that mean "not stored, try again later" rather than "this batch is wrong".
_RETRY_ACK_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Stream failures after which reconnecting and resending cannot help.
_FATAL_STREAM_CODES = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
}


class ReplayClient:
    """Client of one replay shard. Thread-safe.

    Args:
        address: `host:port` of the shard.
        timeout: default deadline in seconds for every call.
        writer_id: de-duplication id for inserts; a fresh UUID by default. Reuse an id only for the same writer.
        max_in_flight: unacknowledged insert batches before `insert` blocks.
        max_message_bytes: largest message sent or received; larger batches raise ResourceExhaustedError.
        token: bearer token when the shard requires one.
        tls: TLS files when the shard serves TLS (its CA; with mutual TLS also this client's certificate and key).
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        writer_id: str | None = None,
        max_in_flight: int = 32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        token: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight ({max_in_flight}) must be >= 1")
        self.address = address
        self.timeout = timeout
        self.writer_id = writer_id or uuid.uuid4().hex
        self.max_in_flight = max_in_flight
        self.max_message_bytes = max_message_bytes
        self._channel = grpc_util.make_channel(address, max_message_bytes=max_message_bytes, token=token, tls=tls)
        self._stub = replay_pb2_grpc.ReplayServiceStub(self._channel)
        # Insert stream state, guarded by _cond.
        self._cond = threading.Condition()
        self._pending: OrderedDict[int, replay_pb2.InsertRequest] = OrderedDict()
        self._next_sequence = 1
        self._stream_queue: queue.SimpleQueue | None = None
        self._errors: list[ApexError] = []
        self._closed = False
        self._writer_thread: threading.Thread | None = None
        self._stream_call: grpc.Future | None = None
        self.reconnects = 0
        self.last_incarnation = 0

    # ------------------------------------------------------------------------------------------------ insert
    def insert(self, columns: Mapping[str, np.ndarray], priorities: np.ndarray | None = None, *,
               timeout: float | None = None) -> int:
        """Queue a batch for the shard and return its sequence number; blocks while `max_in_flight` batches are
        unacknowledged. A batch the shard rejects raises its error from a later `insert` or `flush`."""
        # The payload bounds the message size; ByteSize() would serialise a large batch once just to answer.
        size = sum(np.asarray(a).nbytes for a in columns.values()) + 64 * len(columns) + len(self.writer_id)
        size += 0 if priorities is None else np.asarray(priorities).nbytes
        if size > self.max_message_bytes - 1024:
            raise ResourceExhaustedError(
                f"insert batch is {size} bytes, over the message limit of {self.max_message_bytes}; send fewer rows"
            )
        request = wire.encode_insert(columns, priorities, self.writer_id)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            self._raise_pending_error()
            while len(self._pending) >= self.max_in_flight:
                if not self._cond.wait(deadline - time.monotonic()):
                    raise DeadlineExceededError(
                        f"insert to {self.address}: {len(self._pending)} batches unacknowledged until the deadline"
                    )
                self._raise_pending_error()
            if self._closed:
                raise UnavailableError("client is closed")
            request.sequence = self._next_sequence
            self._next_sequence += 1
            self._pending[request.sequence] = request
            if self._stream_queue is not None:
                self._stream_queue.put(request)
            else:
                self._cond.notify_all()  # wakes the writer thread if it waits for work
            if self._writer_thread is None:
                self._writer_thread = threading.Thread(target=self._run_writer, name="apexrl-insert", daemon=True)
                self._writer_thread.start()
        return request.sequence

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every inserted batch is acknowledged; raise the first rejected batch's error."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            while self._pending:
                if not self._cond.wait(deadline - time.monotonic()):
                    raise DeadlineExceededError(
                        f"flush to {self.address}: {len(self._pending)} batches still unacknowledged"
                    )
            self._raise_pending_error()

    @property
    def pending(self) -> int:
        """Batches sent or queued but not yet acknowledged."""
        with self._cond:
            return len(self._pending)

    def _raise_pending_error(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def _run_writer(self) -> None:
        """Keep one insert stream open while there is pending data; reconnect and resend after failures."""
        backoff = 0.05
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                stream_queue: queue.SimpleQueue = queue.SimpleQueue()
                for request in self._pending.values():
                    stream_queue.put(request)
                self._stream_queue = stream_queue
            try:
                call = self._stub.Insert(_drain(stream_queue))
                with self._cond:
                    self._stream_call = call
                for ack in call:
                    self._on_ack(ack)
                    backoff = 0.05
                error = None
            except grpc.RpcError as err:
                error = err
            with self._cond:
                self._stream_queue = None
                self._stream_call = None
                stream_queue.put(None)
                if self._closed:
                    return
                if error is not None:
                    self._on_stream_error(error)
            if error is not None:
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)

    def _on_ack(self, ack: replay_pb2.InsertAck) -> None:
        with self._cond:
            self.last_incarnation = ack.incarnation
            code = status_code_from_int(ack.error_code) if ack.error_code else grpc.StatusCode.OK
            if code in _RETRY_ACK_CODES:
                # The shard is going away and stored nothing: keep this batch (and every later one) pending and
                # resend them in order on a new stream, to this shard once it is back.
                log.info("shard %s refused batch %d (%s); will resend", self.address, ack.sequence, code.name)
                if self._stream_call is not None:
                    self._stream_call.cancel()
                return
            request = self._pending.pop(ack.sequence, None)
            if code != grpc.StatusCode.OK and request is not None:
                self._errors.append(error_for_code(code, f"insert of batch {ack.sequence} to {self.address} "
                                                         f"rejected: {code.name}: {ack.error_message}"))
            self._cond.notify_all()

    def _on_stream_error(self, err: grpc.RpcError) -> None:
        """Called with _cond held after the stream failed."""
        code = err.code()
        self.reconnects += 1
        if code in _FATAL_STREAM_CODES:
            self._errors.append(from_rpc_error(err, f"insert stream to {self.address}"))
            self._pending.clear()
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and self._pending:
            # The oldest unacknowledged batch is the one the shard refused to receive; resending it cannot help.
            sequence, _ = self._pending.popitem(last=False)
            self._errors.append(from_rpc_error(err, f"insert of batch {sequence} to {self.address}"))
        else:
            log.warning("insert stream to %s failed (%s); resending %d batches", self.address, code.name,
                        len(self._pending))
        self._cond.notify_all()

    # ------------------------------------------------------------------------------------------------ sample
    def sample(self, batch_size: int, *, timeout: float | None = None, wait: bool = True) -> SampledBatch:
        """Draw `batch_size` rows. With wait=False a shard below its minimum size raises FailedPreconditionError
        at once; otherwise the call waits up to its deadline (DeadlineExceededError)."""
        request = replay_pb2.SampleRequest(batch_size=batch_size, no_wait=not wait)
        return wire.decode_sample(self._call(self._stub.Sample, request, "sample", timeout))

    def sample_future(self, batch_size: int, *, timeout: float | None = None,
                      wait: bool = True) -> CallFuture[SampledBatch]:
        """Start a Sample call without waiting (to sample several shards in parallel); the future's result() is
        a SampledBatch or raises the apexrl error of the failed call."""
        request = replay_pb2.SampleRequest(batch_size=batch_size, no_wait=not wait)
        return CallFuture(self._stub.Sample.future(request, timeout=self._deadline(timeout)), wire.decode_sample,
                          f"sample on {self.address}")

    # -------------------------------------------------------------------------------------------- priorities
    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray, *, incarnation: int,
                          timeout: float | None = None) -> UpdateResult:
        """Set new raw priorities for sampled keys; stale keys are ignored and counted, never an error.

        `incarnation` is the one the keys were sampled from (`SampledBatch.incarnation`): after a shard restart
        its keys start from 0 again, and only the incarnation keeps old keys off the new rows. It is required;
        0 ("whatever the shard's current one is") must be asked for explicitly."""
        request = wire.encode_update(keys, priorities, incarnation)
        return wire.decode_update_result(self._call(self._stub.UpdatePriorities, request, "update_priorities",
                                                    timeout))

    def update_priorities_future(self, keys: np.ndarray, priorities: np.ndarray, *, incarnation: int,
                                 timeout: float | None = None) -> CallFuture[UpdateResult]:
        """Start an UpdatePriorities call without waiting; the future's result() is an UpdateResult."""
        call = self._stub.UpdatePriorities.future(wire.encode_update(keys, priorities, incarnation),
                                                  timeout=self._deadline(timeout))
        return CallFuture(call, wire.decode_update_result, f"update_priorities on {self.address}")

    def priority_stream(self, max_in_flight: int = 32,
                        on_totals: Callable[[ShardTotals], None] | None = None) -> PriorityStream:
        """A background StreamUpdatePriorities sender for fire-and-forget updates (what a learner wants);
        `on_totals` receives the shard's totals from every answer."""
        return PriorityStream(self._stub, self.address, max_in_flight=max_in_flight, on_totals=on_totals)

    # -------------------------------------------------------------------------------------------------- info
    def info(self, *, timeout: float | None = None) -> ShardInfo:
        return wire.decode_info(self._call(self._stub.Info, replay_pb2.InfoRequest(), "info", timeout))

    def info_future(self, *, timeout: float | None = None) -> CallFuture[ShardInfo]:
        """Start an Info call without waiting; the future's result() is a ShardInfo."""
        call = self._stub.Info.future(replay_pb2.InfoRequest(), timeout=self._deadline(timeout))
        return CallFuture(call, wire.decode_info, f"info on {self.address}")

    # -------------------------------------------------------------------------------------------- checkpoint
    def checkpoint(self, *, timeout: float | None = 120.0) -> CheckpointResult:
        """Ask the shard to write a checkpoint now; returns once it is durable. It holds every row whose insert
        was acknowledged before this call (flush() first to include what this client queued)."""
        return wire.decode_checkpoint(self._call(self._stub.Checkpoint, replay_pb2.CheckpointRequest(),
                                                 "checkpoint", timeout))

    # ------------------------------------------------------------------------------------------------ common
    def _deadline(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _call(self, method, request, what: str, timeout: float | None):
        try:
            return method(request, timeout=self._deadline(timeout))
        except grpc.RpcError as err:
            raise from_rpc_error(err, f"{what} on {self.address}") from None

    def close(self, flush_timeout: float | None = 0.0) -> None:
        """Close the channel. With flush_timeout > 0, first wait that long for pending inserts."""
        if flush_timeout:
            try:
                self.flush(flush_timeout)
            except ApexError as err:
                log.warning("closing %s with unflushed inserts: %s", self.address, err)
        with self._cond:
            self._closed = True
            if self._stream_queue is not None:
                self._stream_queue.put(None)
            self._cond.notify_all()
        self._channel.close()
        if self._writer_thread is not None:
            self._writer_thread.join(timeout=5)

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush_timeout=self.timeout if exc[0] is None else 0.0)


def _drain(stream_queue: queue.SimpleQueue):
    """The request iterator of one insert stream: yields queued batches until the None sentinel."""
    while True:
        request = stream_queue.get()
        if request is None:
            return
        yield request

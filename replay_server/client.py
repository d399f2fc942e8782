"""ReplayClient: the public SDK for one replay shard (insert / sample / update priorities / info).

Numpy in, numpy out; every call has a deadline; failures raise apexrl.common.errors exceptions.

Inserts go through one long-lived bidirectional stream run by a background thread. Each batch gets a sequence
number and stays in a pending list until the shard acknowledges it; when the stream breaks, the thread reconnects
with backoff and resends every pending batch, and the shard drops the ones it already stored, so no batch is lost
or stored twice (gRPC's own retries do not cover streams). The pending list is bounded (`max_in_flight`), which
is the flow control: `insert` blocks while it is full.

Fewer messages per row (replay.proto, InsertRequest.batch_rows): while a request is unacknowledged, small batches
queue up instead of going out one by one, and the next request carries all of them merged (Nagle's algorithm,
with the ack as the clock): one message and usually one ack for several batches, each still numbered and
de-duplicated on its own. A writer that inserts slower than the shard answers still sends each batch at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from apexrl.common import grpc_util
from apexrl.common.compression import column_nbytes
from apexrl.common.errors import (
    ApexError,
    DeadlineExceededError,
    ErrorCode,
    ResourceExhaustedError,
    UnavailableError,
    error_for_code,
    from_rpc_error,
)
from apexrl.common.grpc_util import CallFuture
from apexrl.common.tls import TlsFiles
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.priority_stream import PriorityStream
from apexrl.replay_server.types import CheckpointResult, SampledBatch, ShardInfo, ShardTotals, UpdateResult

log = logging.getLogger(__name__)

# A shard's default message limit (64 MiB: an insert of ~1,000 Atari transitions); larger batches are refused.
DEFAULT_MAX_MESSAGE_BYTES = grpc_util.DEFAULT_MAX_MESSAGE_BYTES

# Per-batch answers that mean "not stored, try again later" rather than "this batch is wrong".
_RETRY_ACK_CODES = {ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED}
# Stream failures after which reconnecting and resending cannot help.
_FATAL_STREAM_CODES = {
    ErrorCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED,
    ErrorCode.UNIMPLEMENTED,
}
# Merging: a request carries at most this many bytes of merged batches (or half the message limit, if lower).
# Batches above a quarter of it are encoded when inserted and sent alone: their bytes, not the cost per message,
# set their pace.
_MERGE_MAX_BYTES = 1 << 20
# Column dtypes a merged batch may have: those the codec sends as they are (replay.proto, tensor.proto).
_MERGEABLE_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    )
)
_BOOL = np.dtype(np.bool_)
_PRIORITY_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


@dataclass(eq=False)
class _Batch:
    """One inserted batch, kept until the shard acknowledges it: encoded at once (sent alone), or copied, to be
    encoded when sent, possibly merged with the batches queued behind it."""

    sequence: int
    nbytes: int
    request: replay_pb2.InsertRequest | None = None  # encoded at insert: sent alone
    columns: dict[str, np.ndarray] | None = None  # copied at insert: may be merged
    priorities: np.ndarray | None = None
    rows: int = 0
    layout: tuple = ()  # batches of the same layout merge


class _Stream:
    """The sending side of one insert stream (guarded by the client's lock)."""

    def __init__(self, unsent: Iterable[_Batch]) -> None:
        self.unsent: deque[_Batch] = deque(unsent)
        self.unsent_bytes = sum(b.nbytes for b in self.unsent)
        self.in_flight: deque[tuple[int, int]] = (
            deque()
        )  # (first, last) sequence of each request not yet answered
        self.merge = False  # the shard's acks carry `batches`: it understands merged requests
        self.sender_waiting = False  # the request iterator waits for something to send
        self.done = False


class ReplayClient:
    """Client of one replay shard. Thread-safe.

    Args:
        address: `host:port` of the shard.
        timeout: default deadline in seconds for every call.
        writer_id: de-duplication id for inserts, at most MAX_WRITER_ID_BYTES (256) bytes in UTF-8; a fresh UUID
            by default. Reuse an id only for the same writer.
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
        if writer_id is not None and (size := len(writer_id.encode())) > wire.MAX_WRITER_ID_BYTES:
            raise ValueError(
                f"writer_id ({writer_id[:40]!r}{'...' if len(writer_id) > 40 else ''}) is {size} "
                f"bytes in UTF-8, over the limit of {wire.MAX_WRITER_ID_BYTES} bytes"
            )
        self.address = address
        self.timeout = timeout
        self.writer_id = writer_id or uuid.uuid4().hex
        self.max_in_flight = max_in_flight
        self.max_message_bytes = max_message_bytes
        self._channel = grpc_util.make_channel(
            address, max_message_bytes=max_message_bytes, token=token, tls=tls, what="ReplayClient address"
        )
        self._stub = replay_pb2_grpc.ReplayServiceStub(self._channel)
        # Insert stream state, guarded by one lock: _cond wakes writers waiting for room and acks, _send_ready the
        # request iterator of the open stream.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._send_ready = threading.Condition(lock)
        self._pending: OrderedDict[int, _Batch] = OrderedDict()
        self._next_sequence = 1
        self._stream: _Stream | None = None
        self._merging = True  # off for good once a merged request was too large for the shard
        self._merge_batches = max(1, max_in_flight // 2)  # two requests cover the window
        self._merge_bytes = min(_MERGE_MAX_BYTES, max_message_bytes // 2)  # far below the message limit
        self._errors: list[ApexError] = []
        self._closed = False
        self._writer_thread: threading.Thread | None = None
        self._stream_call: grpc.Future | None = None
        self.reconnects = 0
        self.last_incarnation = 0
        self.requests_sent = 0  # InsertRequests sent (resends included); a merged one carries several batches
        self.acks_received = 0  # InsertAcks received; one may answer several batches

    # ------------------------------------------------------------------------------------------------ insert
    def insert(
        self,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        timeout: float | None = None,
    ) -> int:
        """Queue a batch for the shard and return its sequence number; blocks while `max_in_flight` batches are
        unacknowledged. A batch the shard rejects raises its error from a later `insert` or `flush`."""
        # The payload bounds the message size; ByteSize() would serialise a large batch once just to answer.
        size = sum(column_nbytes(a) for a in columns.values()) + 64 * len(columns) + len(self.writer_id)
        size += 0 if priorities is None else np.asarray(priorities).nbytes
        if size > self.max_message_bytes - 1024:
            raise ResourceExhaustedError(
                f"insert batch is {size} bytes, over the message limit of {self.max_message_bytes}; send fewer rows"
            )
        batch = self._prepare(columns, priorities, size)
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
            batch.sequence = self._next_sequence
            if batch.request is not None:
                batch.request.sequence = batch.sequence
            self._next_sequence += 1
            self._pending[batch.sequence] = batch
            stream = self._stream
            if stream is not None:
                stream.unsent.append(batch)
                stream.unsent_bytes += batch.nbytes
                self._wake_sender(stream)
            else:
                self._cond.notify_all()  # wakes the writer thread if it waits for work
            if self._writer_thread is None:
                self._writer_thread = threading.Thread(
                    target=self._run_writer, name="apexrl-insert", daemon=True
                )
                self._writer_thread.start()
        return batch.sequence

    def _prepare(
        self, columns: Mapping[str, np.ndarray], priorities: np.ndarray | None, nbytes: int
    ) -> _Batch:
        """The batch as kept until acknowledged: copied when it may be merged (a small batch of plain numpy
        columns of equal length, float priorities or none), otherwise encoded now (which also raises the codec's
        errors for what it cannot send)."""
        if nbytes <= self._merge_bytes // 4:
            layout, rows = [], -1
            for name, array in columns.items():
                if (
                    not isinstance(array, np.ndarray)
                    or array.dtype not in _MERGEABLE_DTYPES
                    or array.ndim == 0
                    or len(array) != rows
                    and rows != -1
                    or not isinstance(name, str)
                ):
                    break
                if array.dtype == _BOOL and array.size and array.view(np.uint8).max() > 1:
                    break  # bytes other than 0/1 fail the shard's decode, which would refuse the whole request
                rows = len(array)
                layout.append((name, array.dtype, array.shape[1:]))
            else:
                if rows > 0 and (
                    priorities is None
                    or isinstance(priorities, np.ndarray)
                    and priorities.shape == (rows,)
                    and priorities.dtype in _PRIORITY_DTYPES
                ):
                    return _Batch(
                        0,
                        nbytes,
                        columns={name: array.copy() for name, array in columns.items()},
                        priorities=None if priorities is None else priorities.copy(),
                        rows=rows,
                        layout=(tuple(layout), None if priorities is None else priorities.dtype),
                    )
        return _Batch(0, nbytes, request=wire.encode_insert(columns, priorities, self.writer_id))

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
                stream = self._stream = _Stream(self._pending.values())
            try:
                call = self._stub.Insert(self._requests(stream))
                with self._cond:
                    self._stream_call = call
                for ack in call:
                    self._on_ack(ack, stream)
                    backoff = 0.05
                error = None
            except grpc.RpcError as err:
                error = err
            with self._cond:
                self._stream = None
                self._stream_call = None
                stream.done = True
                self._send_ready.notify_all()
                if self._closed:
                    return
                if error is not None:
                    self._on_stream_error(error, stream)
            if error is not None:
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)

    # Sending: the request iterator of a stream, run by gRPC's own thread.
    def _requests(self, stream: _Stream) -> Iterator[replay_pb2.InsertRequest]:
        """Yield the stream's requests until it ends: each time the next batches may go, one request with as many
        of them as merge."""
        while True:
            with self._cond:
                while not (stream.done or self._closed or self._ready_to_send(stream)):
                    stream.sender_waiting = True
                    self._send_ready.wait()
                stream.sender_waiting = False
                if stream.done or self._closed:
                    return
                run = self._take(stream)
            yield self._encode(run)

    def _ready_to_send(self, stream: _Stream) -> bool:
        """Whether the next request should go now (lock held). A batch that may be merged waits while a request is
        unanswered (its ack comes: the shard answers every batch), unless enough batches for a full request queue
        up; the shard meanwhile works on the requests in flight, so the wait costs it nothing."""
        unsent = stream.unsent
        if not unsent:
            return False
        if not (stream.merge and self._merging) or unsent[0].request is not None or not stream.in_flight:
            return True
        return (
            len(unsent) >= self._merge_batches
            or stream.unsent_bytes >= self._merge_bytes
            or unsent[-1].request is not None
        )

    def _wake_sender(self, stream: _Stream) -> None:
        if stream.sender_waiting and self._ready_to_send(stream):
            self._send_ready.notify()

    def _take(self, stream: _Stream) -> list[_Batch]:
        """Take the next request's batches off the queue (lock held): the first one, and when the shard merges,
        those behind it with consecutive numbers and the same layout, within the request's limits."""
        first = stream.unsent.popleft()
        run, nbytes = [first], first.nbytes
        if first.columns is not None and stream.merge and self._merging:
            while stream.unsent and len(run) < self._merge_batches:
                following = stream.unsent[0]
                if (
                    following.columns is None
                    or following.layout != first.layout
                    or following.sequence != run[-1].sequence + 1
                    or nbytes + following.nbytes > self._merge_bytes
                ):
                    break
                run.append(stream.unsent.popleft())
                nbytes += following.nbytes
        stream.unsent_bytes -= nbytes
        stream.in_flight.append((first.sequence, run[-1].sequence))
        self.requests_sent += 1
        return run

    def _encode(self, run: list[_Batch]) -> replay_pb2.InsertRequest:
        first = run[0]
        if first.request is not None:
            return first.request
        if len(run) == 1:
            request = wire.encode_insert(first.columns, first.priorities, self.writer_id)
        else:
            columns = {name: np.concatenate([b.columns[name] for b in run]) for name in first.columns}
            priorities = None if first.priorities is None else np.concatenate([b.priorities for b in run])
            request = wire.encode_insert(columns, priorities, self.writer_id, [b.rows for b in run])
        request.sequence = first.sequence
        return request

    # Receiving: acks, read by the writer thread.
    def _on_ack(self, ack: replay_pb2.InsertAck, stream: _Stream) -> None:
        """An ack answers the `batches` batches ending with ack.sequence (one from an older shard); acks come in
        the order of the batches, so every pending batch up to ack.sequence is answered once it arrives."""
        with self._cond:
            self.acks_received += 1
            self.last_incarnation = ack.incarnation
            stream.merge = stream.merge or ack.batches > 0
            code = ErrorCode.of(ack.error_code)
            if code in _RETRY_ACK_CODES:
                # The shard is going away and stored nothing of these: keep them (and every later one) pending and
                # resend them in order on a new stream, to this shard once it is back.
                log.info("shard %s refused batch %d (%s); will resend", self.address, ack.sequence, code.name)
                if self._stream_call is not None:
                    self._stream_call.cancel()
                return
            refused = []
            while self._pending:
                sequence = next(iter(self._pending))
                if sequence > ack.sequence:
                    break
                del self._pending[sequence]
                if code is not ErrorCode.OK and sequence > ack.sequence - max(1, ack.batches):
                    refused.append(sequence)
            if refused:
                which = f"batch {refused[0]}" if len(refused) == 1 else f"batches {refused[0]}..{refused[-1]}"
                self._errors.append(
                    error_for_code(
                        code,
                        f"insert of {which} to {self.address} rejected: {code.name}: {ack.error_message}",
                    )
                )
            while stream.in_flight and stream.in_flight[0][1] <= ack.sequence:
                stream.in_flight.popleft()
            self._cond.notify_all()
            self._wake_sender(stream)

    def _on_stream_error(self, err: grpc.RpcError, stream: _Stream) -> None:
        """Called with _cond held after the stream failed."""
        code = ErrorCode.of(err.code())
        self.reconnects += 1
        if code in _FATAL_STREAM_CODES:
            self._errors.append(from_rpc_error(err, f"insert stream to {self.address}"))
            self._pending.clear()
        elif code is ErrorCode.RESOURCE_EXHAUSTED and self._pending:
            # The oldest unanswered request is the one the shard refused to receive. Merged, its batches may fit
            # one by one: resend them so, and merge no more. Alone, resending it cannot help.
            first, last = stream.in_flight[0] if stream.in_flight else (0, 0)
            if first != last:
                log.warning(
                    "a merged insert request to %s was too large; resending its batches one by one",
                    self.address,
                )
                self._merging = False
            else:
                sequence, _ = self._pending.popitem(last=False)
                self._errors.append(from_rpc_error(err, f"insert of batch {sequence} to {self.address}"))
        else:
            log.warning(
                "insert stream to %s failed (%s); resending %d batches",
                self.address,
                code.name,
                len(self._pending),
            )
        self._cond.notify_all()

    # ------------------------------------------------------------------------------------------------ sample
    def sample(
        self,
        batch_size: int,
        *,
        timeout: float | None = None,
        wait: bool = True,
        batch_rows: Sequence[int] = (),
    ) -> SampledBatch:
        """Draw `batch_size` rows. With wait=False a shard below its minimum size raises FailedPreconditionError
        at once; otherwise the call waits up to its deadline (DeadlineExceededError). With `batch_rows` (summing
        to batch_size), that many batches each stratified on its own, in one answer whose `batch_rows` says so;
        an older shard answers one batch of batch_size rows with `batch_rows` empty (replay.proto)."""
        request = wire.encode_sample_request(batch_size, not wait, batch_rows)
        return wire.decode_sample(self._call(self._stub.Sample, request, "sample", timeout))

    def sample_future(
        self,
        batch_size: int,
        *,
        timeout: float | None = None,
        wait: bool = True,
        batch_rows: Sequence[int] = (),
    ) -> CallFuture[SampledBatch]:
        """Start a Sample call (as `sample`) without waiting, to sample several shards in parallel; the future's
        result() is a SampledBatch or raises the apexrl error of the failed call."""
        request = wire.encode_sample_request(batch_size, not wait, batch_rows)
        return CallFuture(
            self._stub.Sample.future(request, timeout=self._deadline(timeout)),
            wire.decode_sample,
            f"sample on {self.address}",
        )

    # -------------------------------------------------------------------------------------------- priorities
    def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray, *, incarnation: int, timeout: float | None = None
    ) -> UpdateResult:
        """Set new raw priorities for sampled keys; stale keys are ignored and counted, never an error.

        `incarnation` is the one the keys were sampled from (`SampledBatch.incarnation`): after a shard restart
        its keys start from 0 again, and only the incarnation keeps old keys off the new rows. It is required;
        0 ("whatever the shard's current one is") must be asked for explicitly."""
        request = wire.encode_update(keys, priorities, incarnation)
        return wire.decode_update_result(
            self._call(self._stub.UpdatePriorities, request, "update_priorities", timeout)
        )

    def update_priorities_future(
        self, keys: np.ndarray, priorities: np.ndarray, *, incarnation: int, timeout: float | None = None
    ) -> CallFuture[UpdateResult]:
        """Start an UpdatePriorities call without waiting; the future's result() is an UpdateResult."""
        call = self._stub.UpdatePriorities.future(
            wire.encode_update(keys, priorities, incarnation), timeout=self._deadline(timeout)
        )
        return CallFuture(call, wire.decode_update_result, f"update_priorities on {self.address}")

    def priority_stream(
        self, max_in_flight: int = 32, on_totals: Callable[[ShardTotals], None] | None = None
    ) -> PriorityStream:
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
        return wire.decode_checkpoint(
            self._call(self._stub.Checkpoint, replay_pb2.CheckpointRequest(), "checkpoint", timeout)
        )

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
            self._send_ready.notify_all()
            self._cond.notify_all()
        self._channel.close()
        if self._writer_thread is not None:
            self._writer_thread.join(timeout=5)

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush_timeout=self.timeout if exc[0] is None else 0.0)

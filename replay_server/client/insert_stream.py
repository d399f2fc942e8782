"""The insert stream of a ReplayClient: one long-lived bidirectional Insert stream run by a background thread.

Each batch gets a sequence number and stays in a pending list until the shard acknowledges it; when the stream
breaks, the thread reconnects with backoff and resends every pending batch, and the shard drops the ones it already
stored, so no batch is lost or stored twice (gRPC's own retries do not cover streams). The pending list is bounded
(`max_in_flight`), which is the flow control: `insert` blocks while it is full.

Fewer messages per row (replay.proto, InsertRequest.batch_rows): while a request is unacknowledged, small batches
queue up instead of going out one by one, and the next request carries all of them merged (Nagle's algorithm,
with the ack as the clock): one message and usually one ack for several batches, each still numbered and
de-duplicated on its own. A writer that inserts slower than the shard answers still sends each batch at once.
A new stream (a reconnect after a shard restart, which may be an older shard) sends one request and waits for its
ack, which says whether the shard merges, before the batches queued behind it go out: merged, however loaded the
machine, and never to a shard that would misread them.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping

import grpc
import numpy as np

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
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.client.insert_batches import Batch, encode_run, prepare_batch
from apexrl.replay_server.core.item_batch import ItemBatch

log = logging.getLogger(__name__)

# How long a program's end waits for the shards to acknowledge what its clients still hold (see deliver_at_exit).
EXIT_DELIVERY_SECONDS = 10.0
# Streams that hold, or may come to hold, unacknowledged batches: the interpreter's exit delivers or reports them.
_OPEN_STREAMS: weakref.WeakSet[InsertStream] = weakref.WeakSet()


@atexit.register
def _deliver_at_exit() -> None:
    """A program that inserts and ends without flush() or close() (many first scripts do) still has its rows
    delivered, within EXIT_DELIVERY_SECONDS for all clients together, or is told on stderr what was lost."""
    deadline = time.monotonic() + EXIT_DELIVERY_SECONDS
    for stream in list(_OPEN_STREAMS):
        stream.deliver_at_exit(deadline)


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


class _Stream:
    """The sending side of one insert stream (guarded by the client's lock)."""

    def __init__(self, unsent: Iterable[Batch]) -> None:
        self.unsent: deque[Batch] = deque(unsent)
        self.unsent_bytes = sum(b.nbytes for b in self.unsent)
        self.in_flight: deque[tuple[int, int]] = (
            deque()
        )  # (first, last) sequence of each request not yet answered
        # Whether the shard understands merged requests (its acks carry `batches`): None until its first ack.
        self.merge: bool | None = None
        self.sender_waiting = False  # the request iterator waits for something to send
        self.done = False


class InsertStream:
    """The inserting half of a ReplayClient (see the module docstring). Thread-safe.

    Args:
        stub: the client's ReplayService stub.
        address: the shard's address (for messages).
        writer_id: de-duplication id sent with every batch.
        max_in_flight: unacknowledged batches before `insert` blocks.
        max_message_bytes: largest message sent; larger batches raise ResourceExhaustedError.
    """

    def __init__(
        self,
        stub: replay_pb2_grpc.ReplayServiceStub,
        address: str,
        *,
        writer_id: str,
        max_in_flight: int,
        max_message_bytes: int,
    ) -> None:
        self._stub = stub
        self.address = address
        self.writer_id = writer_id
        self.max_in_flight = max_in_flight
        self.max_message_bytes = max_message_bytes
        # One lock: _cond wakes writers waiting for room and acks, _send_ready the request iterator of the open
        # stream.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._send_ready = threading.Condition(lock)
        self._pending: OrderedDict[int, Batch] = OrderedDict()
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

    def insert(
        self,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        timeout: float,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> int:
        """Queue a batch for the shard and return its sequence number; blocks while `max_in_flight` batches are
        unacknowledged. A batch the shard rejects raises its error from a later `insert` or `flush`."""
        # The payload bounds the message size; ByteSize() would serialise a large batch once just to answer.
        size = sum(column_nbytes(a) for a in columns.values()) + 64 * len(columns) + len(self.writer_id)
        size += 0 if priorities is None else np.asarray(priorities).nbytes
        size += 0 if items is None else items.nbytes
        if size > self.max_message_bytes - 1024:
            raise ResourceExhaustedError(
                f"insert batch is {size} bytes, over the message limit of {self.max_message_bytes}; send fewer rows"
            )
        batch = prepare_batch(columns, priorities, size, self._merge_bytes, self.writer_id, items, trajectory)
        deadline = time.monotonic() + timeout
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
                _OPEN_STREAMS.add(self)
        return batch.sequence

    def flush(self, timeout: float) -> None:
        """Wait until every inserted batch is acknowledged; raise the first rejected batch's error."""
        deadline = time.monotonic() + timeout
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
            yield encode_run(run, self.writer_id)

    def _ready_to_send(self, stream: _Stream) -> bool:
        """Whether the next request should go now (lock held). A batch that may be merged waits while a request is
        unanswered (its ack comes: the shard answers every batch), unless enough batches for a full request queue
        up; the shard meanwhile works on the requests in flight, so the wait costs it nothing."""
        unsent = stream.unsent
        if not unsent:
            return False
        if stream.merge is None and self._merging and stream.in_flight:
            return False  # the first ack says whether the shard merges: until then one request goes out
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

    def _take(self, stream: _Stream) -> list[Batch]:
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

    # Receiving: acks, read by the writer thread.
    def _on_ack(self, ack: replay_pb2.InsertAck, stream: _Stream) -> None:
        """An ack answers the `batches` batches ending with ack.sequence (one from an older shard); acks come in
        the order of the batches, so every pending batch up to ack.sequence is answered once it arrives."""
        with self._cond:
            self.acks_received += 1
            self.last_incarnation = ack.incarnation
            stream.merge = bool(stream.merge) or ack.batches > 0
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

    def deliver_at_exit(self, deadline: float) -> None:
        """Wait for the acknowledgement of what is still pending, until `deadline` (time.monotonic()); then say on
        stderr what the shard refused and how many rows were never acknowledged (lost with the process)."""
        with self._cond:
            if self._closed or not self._pending and not self._errors:
                return
        try:
            self.flush(max(0.0, deadline - time.monotonic()))
        except DeadlineExceededError:
            pass
        except ApexError as err:  # a batch the shard refused: the program never heard of it
            print(f"apexrl: an insert to {self.address} was refused: {err}", file=sys.stderr)
        with self._cond:
            batches, rows = len(self._pending), sum(batch.rows for batch in self._pending.values())
        if batches:
            print(
                f"apexrl: {rows} rows in {batches} batches inserted to {self.address} were not acknowledged "
                f"before the program ended and are lost: call flush() or close() (or use the client in a with "
                f"block) before it ends",
                file=sys.stderr,
            )

    def stop(self) -> None:
        """Stop sending: wake every waiting writer and the request iterator; the writer thread ends."""
        _OPEN_STREAMS.discard(self)
        with self._cond:
            self._closed = True
            self._send_ready.notify_all()
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the writer thread (after `stop` and the channel's close)."""
        if self._writer_thread is not None:
            self._writer_thread.join(timeout=timeout)

"""ReplayClient: the public SDK for one replay shard (insert / sample / update priorities / info).

Numpy in, numpy out; every call has a deadline; failures raise apexrl.common.errors exceptions.

Inserts go through one long-lived bidirectional stream with acks, resends and merged requests
(insert_stream.py); the other calls are unary.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence

import grpc
import numpy as np

from apexrl.common import grpc_util
from apexrl.common.errors import (
    ApexError,
    from_rpc_error,
)
from apexrl.common.grpc_util import CallFuture
from apexrl.common.tls import TlsFiles
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.client.insert_stream import InsertStream
from apexrl.replay_server.client.priority_stream import PriorityStream
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.types import (
    CheckpointResult,
    SampledBatch,
    ShardInfo,
    ShardTotals,
    UpdateResult,
)

log = logging.getLogger(__name__)

# A shard's default message limit (64 MiB: an insert of ~1,000 Atari transitions); larger batches are refused.
DEFAULT_MAX_MESSAGE_BYTES = grpc_util.DEFAULT_MAX_MESSAGE_BYTES


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
        self._inserts = InsertStream(
            self._stub,
            address,
            writer_id=self.writer_id,
            max_in_flight=max_in_flight,
            max_message_bytes=max_message_bytes,
        )

    # ------------------------------------------------------------------------------------------------ insert
    def insert(
        self,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        timeout: float | None = None,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> int:
        """Queue a batch for the shard and return its sequence number; blocks while `max_in_flight` batches are
        unacknowledged. A batch the shard rejects raises its error from a later `insert` or `flush`. For a
        sequence table, `items` are the windows that end in this batch's steps, of the writer's `trajectory`
        (replay.proto, "Sequence tables"; SequenceWriter builds them).

        What it promises: the batch is sent in the background and resent after a reconnect until the shard
        acknowledges it (stored, or a duplicate of a stored one); it is stored once `flush` returns (with a
        write-ahead log: durable). A program that ends without flush() or close() still has its batches delivered
        at exit, for up to EXIT_DELIVERY_SECONDS (10 s) for all its clients together, or is told on stderr how
        many rows were lost; close() without a flush timeout drops what is pending."""
        return self._inserts.insert(
            columns, priorities, timeout=self._deadline(timeout), items=items, trajectory=trajectory
        )

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every inserted batch is acknowledged; raise the first rejected batch's error."""
        self._inserts.flush(self._deadline(timeout))

    @property
    def pending(self) -> int:
        """Batches sent or queued but not yet acknowledged."""
        return self._inserts.pending

    @property
    def reconnects(self) -> int:
        """Times the insert stream failed (and was reopened, unless the failure was fatal)."""
        return self._inserts.reconnects

    @property
    def last_incarnation(self) -> int:
        """The incarnation the shard named in its latest insert ack."""
        return self._inserts.last_incarnation

    @property
    def requests_sent(self) -> int:
        """InsertRequests sent (resends included); a merged one carries several batches."""
        return self._inserts.requests_sent

    @property
    def acks_received(self) -> int:
        """InsertAcks received; one may answer several batches."""
        return self._inserts.acks_received

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
        self._inserts.stop()
        self._channel.close()
        self._inserts.join(timeout=5)

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush_timeout=self.timeout if exc[0] is None else 0.0)

"""The ReplayService's messages as Python types, and their encoding: one type per wire message.

The table produces these types, the servicer encodes them, the client decodes them back into the same types, so
the three never drift apart (a field added here is added for all three). Numpy in, numpy out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from apexrl.common import codec
from apexrl.common.compression import CompressedColumn, take_rows
from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.proto import replay_pb2
from apexrl.replay_server.probabilities import within_shard

SERVICE_NAME = replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name


@dataclass(frozen=True)
class ShardTotals:
    """What a sampler needs to know of a shard to weigh it against the others (carried by every Sample answer)."""

    total_priority: float  # sum of stored priorities p**alpha
    size: int  # rows held
    min_priority: float  # smallest positive stored priority (0 when none is positive)
    incarnation: int  # random per shard process; keys of another incarnation are stale


@dataclass(frozen=True)
class ShardInfo:
    """A snapshot of one shard's state and counters: the InfoResponse message (same field names)."""

    signature: Signature | None  # None until declared or fixed by the first insert
    capacity: int
    size: int
    total_priority: float  # sum of stored priorities p**alpha
    min_priority: float  # smallest positive stored priority (0 when none is positive)
    max_priority: float  # largest raw priority seen; rows inserted without priorities get it
    alpha: float
    incarnation: int
    inserted_total: int  # rows stored since start (resent duplicates not counted)
    inserted_bytes_total: int  # bytes of row data stored since start (compressed fields as their frames)
    evicted_total: int
    sampled_total: int
    updated_total: int
    stale_updates_total: int
    duplicate_batches_total: int
    min_size_to_sample: int
    samples_per_insert: float
    max_sample_batch_size: int
    stored_bytes: int = 0  # bytes of row data held now (stored_bytes / size: bytes per stored row)
    max_bytes: int = 0  # the most bytes of row data held (0: no limit but the capacity)

    @property
    def totals(self) -> ShardTotals:
        return ShardTotals(self.total_priority, self.size, self.min_priority, self.incarnation)


# Every ShardInfo field except the signature maps one to one onto an InfoResponse field of the same name.
_INFO_SCALARS: tuple[str, ...] = tuple(f.name for f in fields(ShardInfo) if f.name != "signature")


@dataclass(frozen=True)
class SampledBatch:
    """Rows drawn from one shard (the SampleResponse message), with what a sampler needs to weight them and to
    send their new priorities back."""

    keys: np.ndarray  # uint64 [B]
    priorities: np.ndarray  # float64 [B]: stored priorities p**alpha
    columns: dict[str, np.ndarray | CompressedColumn]  # compressed fields as their frames, never decompressed
    total_priority: float  # the shard's sum of stored priorities when the batch was drawn
    size: int  # the shard's rows when the batch was drawn
    min_priority: float  # the shard's smallest positive stored priority
    incarnation: int
    # Tables with compressed fields only (else empty): the writer id that stored each row, so a reader that finds
    # a frame that does not decompress can name who wrote it.
    writers: tuple[str, ...] = ()
    # Several batches in one answer (replay.proto, SampleRequest.batch_rows): the rows of each, back to back.
    # Empty: one batch (also what an older shard answers to a request for several).
    batch_rows: tuple[int, ...] = ()

    @property
    def totals(self) -> ShardTotals:
        return ShardTotals(self.total_priority, self.size, self.min_priority, self.incarnation)

    def take(self, idx: np.ndarray | slice) -> SampledBatch:
        """The rows at `idx` (an index array or a slice) as a one-batch SampledBatch with the same totals."""
        return replace(
            self,
            keys=self.keys[idx],
            priorities=self.priorities[idx],
            columns={name: take_rows(column, idx) for name, column in self.columns.items()},
            writers=tuple(np.asarray(self.writers, dtype=object)[idx]) if self.writers else (),
            batch_rows=(),
        )

    @property
    def probabilities(self) -> np.ndarray:
        """Probability each row was drawn with within this shard (probabilities.within_shard)."""
        return within_shard(self.priorities, self.total_priority, self.size)


@dataclass(frozen=True)
class InsertResult:
    """What the shard reports for one stored (or recognised duplicate) batch: the InsertAck's payload."""

    first_key: int  # key of the first stored row; 0 for a duplicate
    rows: int  # rows stored by this batch; 0 for a duplicate
    duplicate: bool


@dataclass(frozen=True)
class UpdateResult:
    """The UpdatePrioritiesResponse: `applied` counts entries set (a key repeated twice counts twice); `totals`
    are the shard's right after the update."""

    applied: int
    stale: int
    totals: ShardTotals


@dataclass(frozen=True)
class CheckpointResult:
    """A checkpoint that is durable on the shard's disk: the CheckpointResponse message (same field names)."""

    path: str
    rows: int
    inserted_total: (
        int  # the insert counter at the checkpoint's instant: every lower key is in it (or evicted)
    )
    bytes: int
    seconds: float  # from the checkpoint's instant until durable
    incarnation: int


# --- Sample --------------------------------------------------------------------------------------------------------


def encode_sample(batch: SampledBatch) -> replay_pb2.SampleResponse:
    response = replay_pb2.SampleResponse(
        total_priority=batch.total_priority,
        size=batch.size,
        min_priority=batch.min_priority,
        incarnation=batch.incarnation,
    )
    codec.encode_tensor(batch.keys, response.keys)
    codec.encode_tensor(batch.priorities, response.priorities)
    codec.encode_batch(batch.columns, response.batch)
    response.row_writers.extend(batch.writers)
    response.batch_rows.extend(batch.batch_rows)
    return response


def decode_sample(response: replay_pb2.SampleResponse) -> SampledBatch:
    return SampledBatch(
        keys=codec.decode_tensor(response.keys, "keys"),
        priorities=codec.decode_tensor(response.priorities, "priorities"),
        columns=codec.decode_batch(response.batch),
        total_priority=response.total_priority,
        size=response.size,
        min_priority=response.min_priority,
        incarnation=response.incarnation,
        writers=tuple(response.row_writers),
        batch_rows=tuple(response.batch_rows),
    )


def encode_sample_request(
    batch_size: int, no_wait: bool = False, batch_rows: Sequence[int] = ()
) -> replay_pb2.SampleRequest:
    """A SampleRequest; `batch_rows` of two or more entries (summing to batch_size) asks for that many batches in
    one answer."""
    request = replay_pb2.SampleRequest(batch_size=batch_size, no_wait=no_wait)
    if len(batch_rows) > 1:
        request.batch_rows.extend(batch_rows)
    return request


# --- UpdatePriorities ----------------------------------------------------------------------------------------------


def encode_update(
    keys: np.ndarray, priorities: np.ndarray, incarnation: int
) -> replay_pb2.UpdatePrioritiesRequest:
    request = replay_pb2.UpdatePrioritiesRequest(incarnation=incarnation)
    codec.encode_tensor(np.asarray(keys, dtype=np.uint64), request.keys)
    codec.encode_tensor(np.asarray(priorities, dtype=np.float64), request.priorities)
    return request


def decode_update(request: replay_pb2.UpdatePrioritiesRequest) -> tuple[np.ndarray, np.ndarray, int]:
    """(keys, priorities, incarnation); InvalidArgumentError for a bad tensor or keys and priorities that do not
    pair up. Dtypes, ranks and values are the table's to check (update_priorities)."""
    keys = codec.decode_tensor(request.keys, "keys")
    priorities = codec.decode_tensor(request.priorities, "priorities")
    if keys.shape != priorities.shape:
        raise InvalidArgumentError(
            f"keys {list(keys.shape)} and priorities {list(priorities.shape)} must have the same shape [n]"
        )
    return keys, priorities, request.incarnation


def encode_update_result(result: UpdateResult) -> replay_pb2.UpdatePrioritiesResponse:
    t = result.totals
    return replay_pb2.UpdatePrioritiesResponse(
        applied=result.applied,
        stale=result.stale,
        total_priority=t.total_priority,
        size=t.size,
        min_priority=t.min_priority,
        incarnation=t.incarnation,
    )


def decode_update_result(response: replay_pb2.UpdatePrioritiesResponse) -> UpdateResult:
    totals = ShardTotals(response.total_priority, response.size, response.min_priority, response.incarnation)
    return UpdateResult(applied=response.applied, stale=response.stale, totals=totals)


# --- Info ----------------------------------------------------------------------------------------------------------


def encode_info(info: ShardInfo) -> replay_pb2.InfoResponse:
    response = replay_pb2.InfoResponse(**{name: getattr(info, name) for name in _INFO_SCALARS})
    if info.signature is not None:
        codec.encode_signature(info.signature, response.signature)
    return response


def decode_info(response: replay_pb2.InfoResponse) -> ShardInfo:
    return ShardInfo(
        signature=codec.decode_signature(response.signature),
        **{name: getattr(response, name) for name in _INFO_SCALARS},
    )


# --- Insert --------------------------------------------------------------------------------------------------------


# The most batches one merged InsertRequest may carry (replay.proto, InsertRequest.batch_rows).
MAX_MERGED_BATCHES = 4096
# The longest writer id, in UTF-8 bytes (replay.proto, InsertRequest.writer_id): the shard refuses a longer one at
# decode, before anything is stored, and the SDK refuses it when the client is made.
MAX_WRITER_ID_BYTES = 256


def encode_insert(
    columns, priorities: np.ndarray | None, writer_id: str, batch_rows: Sequence[int] = ()
) -> replay_pb2.InsertRequest:
    """An InsertRequest without its sequence number (the client numbers a batch when it queues it). With
    `batch_rows` of two or more entries, the rows are that many merged batches, back to back."""
    request = replay_pb2.InsertRequest(writer_id=writer_id)
    codec.encode_batch(columns, request.batch)
    if priorities is not None:
        codec.encode_tensor(np.asarray(priorities), request.priorities)
    if len(batch_rows) > 1:
        request.batch_rows.extend(batch_rows)
    return request


def decode_insert(request: replay_pb2.InsertRequest) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """(columns, priorities or None); InvalidArgumentError for a writer id over MAX_WRITER_ID_BYTES or a bad
    tensor. The table checks the signature."""
    writer_bytes = len(request.writer_id.encode())
    if writer_bytes > MAX_WRITER_ID_BYTES:
        raise InvalidArgumentError(
            f"writer_id is {writer_bytes} bytes (UTF-8), over the limit of {MAX_WRITER_ID_BYTES} bytes"
        )
    columns = codec.decode_batch(request.batch)
    priorities = (
        codec.decode_tensor(request.priorities, "priorities") if request.HasField("priorities") else None
    )
    return columns, priorities


def merged_batch_offsets(
    request: replay_pb2.InsertRequest, columns: Mapping[str, object], priorities: np.ndarray | None
) -> list[int] | None:
    """The first row of each batch of a merged request, and the end of the last (len(batch_rows) + 1 offsets);
    None for a one-batch request. InvalidArgumentError when batch_rows do not fit the decoded columns: then the
    whole request is refused (replay.proto, InsertRequest.batch_rows)."""
    batch_rows = request.batch_rows
    if not batch_rows:
        return None
    what = f"merged request {request.sequence} ({len(batch_rows)} batches)"
    if len(batch_rows) > MAX_MERGED_BATCHES:
        raise InvalidArgumentError(f"{what}: more than {MAX_MERGED_BATCHES} batches")
    if request.sequence + len(batch_rows) - 1 >= 1 << 64:
        raise InvalidArgumentError(f"{what}: its sequence numbers pass 2**64 - 1")
    offsets = [0]
    for rows in batch_rows:
        if rows < 1:
            raise InvalidArgumentError(f"{what}: batch_rows has an entry {rows}; each batch needs >= 1 row")
        offsets.append(offsets[-1] + rows)
    total = offsets[-1]
    named = list(columns.items()) + ([] if priorities is None else [("priorities", priorities)])
    if not columns:
        raise InvalidArgumentError(f"{what}: the batch has no columns")
    for name, column in named:
        scalar = getattr(column, "ndim", 1) == 0  # an array, or a compressed column (always per row)
        if scalar or len(column) != total:
            rows = "a scalar" if scalar else f"{len(column)} rows"
            raise InvalidArgumentError(f"{what}: column {name!r} has {rows}; batch_rows sum to {total}")
    return offsets


def encode_ack(
    sequence: int,
    incarnation: int,
    result: InsertResult | None = None,
    error_code: int = 0,
    error_message: str = "",
    batches: int = 1,
) -> replay_pb2.InsertAck:
    """The InsertAck for `batches` batches ending with `sequence` (one, but for a run of a merged request): their
    result, or the status code (an int) and message that rejected them."""
    ack = replay_pb2.InsertAck(
        sequence=sequence,
        incarnation=incarnation,
        error_code=error_code,
        error_message=error_message,
        batches=batches,
    )
    if result is not None:
        ack.duplicate = result.duplicate
        ack.first_key = result.first_key
        ack.rows = result.rows
    return ack


# --- Checkpoint ----------------------------------------------------------------------------------------------------


def encode_checkpoint(result: CheckpointResult) -> replay_pb2.CheckpointResponse:
    return replay_pb2.CheckpointResponse(
        **{f.name: getattr(result, f.name) for f in fields(CheckpointResult)}
    )


def decode_checkpoint(response: replay_pb2.CheckpointResponse) -> CheckpointResult:
    return CheckpointResult(**{f.name: getattr(response, f.name) for f in fields(CheckpointResult)})

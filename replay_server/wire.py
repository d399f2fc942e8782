"""The ReplayService's messages encoded and decoded: one Python type per wire message (types.py), and its encoding.

The table produces the types, the servicer encodes them here, the client decodes them back into the same types, so
the three never drift apart (a field added to a type is added for all three). Numpy in, numpy out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields

import numpy as np

from apexrl.common import codec
from apexrl.common.errors import InvalidArgumentError
from apexrl.proto import replay_pb2
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.types import (
    CheckpointResult,
    InsertResult,
    SampledBatch,
    ShardInfo,
    ShardTotals,
    UpdateResult,
)

SERVICE_NAME = replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name


# Every ShardInfo field except the signatures maps one to one onto an InfoResponse field of the same name.
_INFO_SIGNATURES = ("signature", "item_signature")
_INFO_SCALARS: tuple[str, ...] = tuple(f.name for f in fields(ShardInfo) if f.name not in _INFO_SIGNATURES)


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
    if batch.sequence_length:
        response.sequence_length = batch.sequence_length
        codec.encode_tensor(batch.lengths, response.lengths)
        codec.encode_batch(batch.item_columns, response.item_columns)
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
        sequence_length=response.sequence_length,
        lengths=codec.decode_tensor(response.lengths, "lengths") if response.sequence_length else None,
        item_columns=codec.decode_batch(response.item_columns) if response.sequence_length else {},
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
    if info.item_signature is not None:
        codec.encode_signature(info.item_signature, response.item_signature)
    return response


def decode_info(response: replay_pb2.InfoResponse) -> ShardInfo:
    return ShardInfo(
        signature=codec.decode_signature(response.signature),
        item_signature=codec.decode_signature(response.item_signature),
        **{name: getattr(response, name) for name in _INFO_SCALARS},
    )


# --- Insert --------------------------------------------------------------------------------------------------------


# The most batches one merged InsertRequest may carry (replay.proto, InsertRequest.batch_rows).
MAX_MERGED_BATCHES = 4096
# The longest writer id, in UTF-8 bytes (replay.proto, InsertRequest.writer_id): the shard refuses a longer one at
# decode, before anything is stored, and the SDK refuses it when the client is made.
MAX_WRITER_ID_BYTES = 256


def encode_insert(
    columns,
    priorities: np.ndarray | None,
    writer_id: str,
    batch_rows: Sequence[int] = (),
    items: ItemBatch | None = None,
    trajectory: int = 0,
) -> replay_pb2.InsertRequest:
    """An InsertRequest without its sequence number (the client numbers a batch when it queues it). With
    `batch_rows` of two or more entries, the rows are that many merged batches, back to back; with `items`, the
    sequence items that end in the batch (never merged)."""
    request = replay_pb2.InsertRequest(writer_id=writer_id, trajectory=trajectory)
    codec.encode_batch(columns, request.batch)
    if priorities is not None:
        codec.encode_tensor(np.asarray(priorities), request.priorities)
    if len(batch_rows) > 1:
        request.batch_rows.extend(batch_rows)
    if items is not None:
        request.items.end.extend(np.asarray(items.ends).tolist())
        request.items.length.extend(np.asarray(items.lengths).tolist())
        codec.encode_batch(items.columns, request.items.columns)
        if items.priorities is not None:
            codec.encode_tensor(np.asarray(items.priorities), request.items.priorities)
    return request


def decode_items(request: replay_pb2.InsertRequest) -> ItemBatch | None:
    """The request's sequence items, or None; InvalidArgumentError for merged items or a bad tensor (the table
    checks the rest)."""
    if not request.HasField("items"):
        return None
    if request.batch_rows:
        raise InvalidArgumentError("items: a request with sequence items is never merged (batch_rows is set)")
    message = request.items
    priorities = message.priorities
    return ItemBatch(
        ends=np.fromiter(message.end, dtype=np.int64, count=len(message.end)),
        lengths=np.fromiter(message.length, dtype=np.int64, count=len(message.length)),
        columns=_decode_item_columns(message.columns),
        priorities=codec.decode_tensor(priorities, "items.priorities")
        if message.HasField("priorities")
        else None,
    )


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


def _decode_item_columns(batch) -> dict[str, np.ndarray]:
    try:
        return codec.decode_batch(batch)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(f"items.columns: {err}") from None


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
        ack.items = result.items
    return ack


# --- Checkpoint ----------------------------------------------------------------------------------------------------


def encode_checkpoint(result: CheckpointResult) -> replay_pb2.CheckpointResponse:
    return replay_pb2.CheckpointResponse(
        **{f.name: getattr(result, f.name) for f in fields(CheckpointResult)}
    )


def decode_checkpoint(response: replay_pb2.CheckpointResponse) -> CheckpointResult:
    return CheckpointResult(**{f.name: getattr(response, f.name) for f in fields(CheckpointResult)})

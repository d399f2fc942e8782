"""The insert stream's batches: what a ReplayClient keeps of each batch until the shard acknowledges it (copied, to
be merged with the batches queued behind it, or encoded at once and sent alone), and the request a run of them
becomes (replay.proto, InsertRequest.batch_rows). See insert_stream.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apexrl.common.compression import logical_shape
from apexrl.common.signature import SUPPORTED_DTYPES
from apexrl.proto import replay_pb2
from apexrl.replay_server import wire
from apexrl.replay_server.core.item_batch import ItemBatch

# Column dtypes a merged batch may have: those the codec sends as they are (replay.proto, tensor.proto).
_MERGEABLE_DTYPES = frozenset(np.dtype(name) for name in SUPPORTED_DTYPES)
_BOOL = np.dtype(np.bool_)
_PRIORITY_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


@dataclass(eq=False)
class Batch:
    """One inserted batch, kept until the shard acknowledges it: encoded at once (sent alone), or copied, to be
    encoded when sent, possibly merged with the batches queued behind it."""

    sequence: int
    nbytes: int
    request: replay_pb2.InsertRequest | None = None  # encoded at insert: sent alone
    columns: dict[str, np.ndarray] | None = None  # copied at insert: may be merged
    priorities: np.ndarray | None = None
    rows: int = 0  # what a report of undelivered rows counts
    layout: tuple = ()  # batches of the same layout merge


def prepare_batch(
    columns: Mapping[str, np.ndarray],
    priorities: np.ndarray | None,
    nbytes: int,
    merge_bytes: int,
    writer_id: str,
    items: ItemBatch | None = None,
    trajectory: int = 0,
) -> Batch:
    """The batch as kept until acknowledged: copied when it may be merged (a small batch of plain numpy
    columns of equal length, float priorities or none, no sequence items), otherwise encoded now (which also
    raises the codec's errors for what it cannot send)."""
    if nbytes <= merge_bytes // 4 and items is None and not trajectory:
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
                return Batch(
                    0,
                    nbytes,
                    columns={name: array.copy() for name, array in columns.items()},
                    priorities=None if priorities is None else priorities.copy(),
                    rows=rows,
                    layout=(tuple(layout), None if priorities is None else priorities.dtype),
                )
    rows = logical_shape(next(iter(columns.values())))[0] if columns else 0
    request = wire.encode_insert(columns, priorities, writer_id, items=items, trajectory=trajectory)
    return Batch(0, nbytes, request=request, rows=rows)


def encode_run(run: list[Batch], writer_id: str) -> replay_pb2.InsertRequest:
    """The request for a run of batches taken off the queue: the first one's own request, or the run encoded
    (merged, with each batch's rows, when it holds several), numbered by its first batch."""
    first = run[0]
    if first.request is not None:
        return first.request
    if len(run) == 1:
        request = wire.encode_insert(first.columns, first.priorities, writer_id)
    else:
        columns = {name: np.concatenate([b.columns[name] for b in run]) for name in first.columns}
        priorities = None if first.priorities is None else np.concatenate([b.priorities for b in run])
        request = wire.encode_insert(columns, priorities, writer_id, [b.rows for b in run])
    request.sequence = first.sequence
    return request

"""A table's rows: one preallocated column per field, used as a ring of `capacity` slots. Pure numpy, no locks.

Compressed fields (`obs:uint8[4,84,84]@zstd`) are stored as their frames, one bytes object per slot in an object
array (a sample gathers its rows' frames with one fancy index and one join; a snapshot copies references, and
bytes never change, so copy-on-write costs nothing), never decompressed. Such storage also keeps each row's writer
id (Sample returns it, so a reader that finds a bad frame can name its writer) and its frames' byte count, so the
table can evict the oldest rows when the bytes held would exceed its `max_bytes` (`rows_to_evict`).

Not thread-safe by contract: the table owns the lock (as with sum_tree.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from apexrl.common.compression import CompressedColumn
from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.table_state import ROW_WRITER


class ColumnStorage:
    """The columns of one signature over `capacity` slots; slots are given by the caller (the table's ring)."""

    def __init__(
        self,
        signature: Signature,
        columns: dict[str, np.ndarray],
        row_bytes: np.ndarray | None,
        row_writers: np.ndarray | None,
    ) -> None:
        self.signature = signature
        self.columns = columns  # per field: [capacity, *shape], or [capacity] of frames
        # Compressed signatures only (else None): per slot, its frames' bytes (0 when not held) and its writer id.
        self.row_bytes = row_bytes
        self.row_writers = row_writers
        self.frame_bytes = 0  # sum of row_bytes

    @classmethod
    def allocate(cls, signature: Signature, capacity: int, max_batch_rows: int) -> ColumnStorage:
        """Empty storage for `signature`. InvalidArgumentError when it cannot be stored (`max_batch_rows`: the
        largest gather a sample makes, which numpy must also be able to hold)."""
        # numpy refuses any array whose nonzero dimensions multiply past int64 bytes, even an empty one: check the
        # storage and the largest sampled batch before adopting the signature (a first batch may be hostile).
        rows = max(capacity, max_batch_rows)
        for f in signature.fields:
            if (
                f.compression is None
                and math.prod(d for d in (rows, *f.shape) if d) * f.dtype.itemsize >= 1 << 63
            ):
                raise InvalidArgumentError(
                    f"field {f} cannot be stored: {rows} rows of it exceed numpy's limits"
                )
        try:
            columns = {
                f.name: np.zeros((capacity, *f.shape), dtype=f.dtype)
                if f.compression is None
                else np.full(capacity, None, dtype=object)
                for f in signature.fields
            }
            if not signature.compressed:
                return cls(signature, columns, None, None)
            return cls(
                signature, columns, np.zeros(capacity, dtype=np.int64), np.full(capacity, None, dtype=object)
            )
        except MemoryError:
            raise InvalidArgumentError(
                f"{capacity} rows of signature {signature} do not fit in memory"
            ) from None

    @property
    def capacity(self) -> int:
        return len(next(iter(self.columns.values())))

    def write(
        self,
        start: int,
        columns: Mapping[str, np.ndarray | CompressedColumn],
        rows: int,
        offset: int = 0,
        writers: str | np.ndarray | None = None,
    ) -> np.ndarray:
        """Copy rows offset .. offset + rows - 1 of `columns` into the slots from `start` on (wrapping); return
        the slots. Compressed storage also records each row's frame bytes and writer (`writers`: one id for all
        rows, or one per row of `columns`)."""
        cap = self.capacity
        first = min(rows, cap - start)  # rows before the ring wraps
        slots = (start + np.arange(rows, dtype=np.int64)) % cap
        for name, dest in self.columns.items():
            src = columns[name]
            if isinstance(src, CompressedColumn):
                dest[slots] = _object_array(src.frames(offset, offset + rows))
                continue
            dest[start : start + first] = src[offset : offset + first]
            if first < rows:
                dest[: rows - first] = src[offset + first : offset + rows]
        if self.row_bytes is not None:
            sizes = sum(columns[f.name].lengths[offset : offset + rows] for f in self.signature.compressed)
            self.frame_bytes += int(sizes.sum()) - int(self.row_bytes[slots].sum())
            self.row_bytes[slots] = sizes
            self.row_writers[slots] = (
                writers[offset : offset + rows] if isinstance(writers, np.ndarray) else (writers or "")
            )
        return slots

    def load_blocks(
        self, blocks: Iterable[tuple[int, Mapping[str, np.ndarray], np.ndarray]], lowest_key: int
    ) -> np.ndarray:
        """Write saved blocks (first key, columns, leaves) into their keys' slots, rows below `lowest_key` skipped
        (with compressed fields a block's columns may hold each row's writer under ROW_WRITER); return the leaves
        by slot (0 where no row was loaded)."""
        cap = self.capacity
        leaves = np.zeros(cap, dtype=np.float64)
        for first_key, columns, block_leaves in blocks:
            skip = max(0, lowest_key - first_key)
            rows = len(block_leaves) - skip
            if rows <= 0:
                continue
            slots = self.write((first_key + skip) % cap, columns, rows, skip, columns.get(ROW_WRITER))
            leaves[slots] = block_leaves[skip:]
        return leaves

    def frame_bytes_at(self, slots: np.ndarray) -> int:
        """Bytes of the frames held at `slots` (0 without compressed fields)."""
        return int(self.row_bytes[slots].sum()) if self.row_bytes is not None else 0

    def gather(self, slots: np.ndarray) -> tuple[dict[str, np.ndarray | CompressedColumn], tuple[str, ...]]:
        """The rows at `slots` (compressed fields as their frames) and, with compressed fields, their writers."""
        # np.take, not arr[slots]: several times cheaper for a few hundred rows of a contiguous column (see
        # bench/README.md, "Replay: sampling a full shard").
        columns = {name: np.take(arr, slots, axis=0) for name, arr in self.columns.items()}
        if self.row_writers is None:
            return columns, ()
        for f in self.signature.compressed:
            columns[f.name] = CompressedColumn.from_frames(f.compression, f.dtype, f.shape, columns[f.name])
        return columns, tuple(self.row_writers[slots].tolist())

    def stored_bytes(self, size: int) -> int:
        """Bytes of row data held by `size` rows: the uncompressed fields' bytes plus the held frames."""
        return size * self.signature.fixed_row_nbytes + self.frame_bytes

    def rows_to_evict(self, oldest: int, size: int, excess: int) -> int:
        """How many rows, from the oldest slot on, hold at least `excess` bytes (at most `size`)."""
        cap, fixed = self.capacity, self.signature.fixed_row_nbytes
        count, covered, window = 0, 0, 256
        while covered < excess and count < size:  # walk from the oldest row until enough bytes are covered
            w = min(window, size - count)
            slots = (oldest + count + np.arange(w)) % cap
            sizes = (
                np.full(w, fixed, dtype=np.int64) if self.row_bytes is None else fixed + self.row_bytes[slots]
            )
            cumulative = covered + np.cumsum(sizes)
            k = int(np.searchsorted(cumulative, excess))  # the first row whose eviction covers the excess
            if k < w:
                return count + k + 1
            count, covered, window = count + w, int(cumulative[-1]), window * 4
        return count

    def release(self, slots: np.ndarray) -> None:
        """Drop the frames and writers held at evicted `slots` (fixed-size fields are simply overwritten later)."""
        if self.row_bytes is None:
            return
        for f in self.signature.compressed:
            self.columns[f.name][slots] = None
        self.row_writers[slots] = None
        self.frame_bytes -= int(self.row_bytes[slots].sum())
        self.row_bytes[slots] = 0

    def release_all(self) -> None:
        """Drop every frame and writer (a failed restore)."""
        if self.row_bytes is None:
            return
        for f in self.signature.compressed:
            self.columns[f.name][:] = None
        self.row_writers[:] = None
        self.row_bytes[:] = 0
        self.frame_bytes = 0


def _object_array(items: list) -> np.ndarray:
    """A 1-d object array of `items` (numpy would otherwise try to look inside bytes objects)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array

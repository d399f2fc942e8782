"""The shared-memory slots through which the sampler child hands batches to the learner: their layout, the file
that holds them, and the check that a batch fits its slot. Apart from the process and its pipe
(`sampler_process.py`) so that the byte layout both sides must agree on is written once.

The file holds `slots` batches, slot-major; inside a slot, every column's rows back to back (C order, each column
64-byte aligned), the importance weights last as the column WEIGHTS. A compressed column has its decompressed
shape here: the child decompresses straight into the slot. A row of a slot is a transition, or for a sequence batch
(R2D2) an item: its step columns [T, ...] (T the table's max_sequence_length: the item-major rows the shards
answer are those bytes already), then its length (LENGTHS) and its own fields (the item signature's), so the
learner reads a slot as the thread feed's `PrioritizedBatch.for_learning` view, with no copy. The parent creates the file (in /dev/shm when it can),
the child maps it and unlinks its name, so nothing is left behind if either process dies.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from apexrl.common.compression import CompressedColumn, logical_shape

WEIGHTS = "__importance_weights__"  # the slot column holding the batch's importance weights
LENGTHS = "lengths"  # a sequence batch's item lengths, by the name its for_learning view gives them

# (name, dtype string, per-row shape) of one column of a slot.
Column = tuple[str, str, tuple[int, ...]]


class SlotLayout:
    """Where each column of each slot lives in the shared file: slot-major, columns back to back, 64-byte aligned."""

    def __init__(self, columns: list[Column], rows: int, slots: int) -> None:
        self.columns, self.rows, self.slots = columns, rows, slots
        self.offsets: list[int] = []
        offset = 0
        for _, dtype, shape in columns:
            self.offsets.append(offset)
            offset += _aligned(rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        self.slot_bytes = max(64, offset)

    @property
    def total_bytes(self) -> int:
        return self.slot_bytes * self.slots

    def views(self, buffer: mmap.mmap, slot: int) -> dict[str, np.ndarray]:
        base = slot * self.slot_bytes
        return {
            name: np.ndarray((self.rows, *shape), dtype=np.dtype(dtype), buffer=buffer, offset=base + offset)
            for (name, dtype, shape), offset in zip(self.columns, self.offsets, strict=True)
        }

    def check_fits(self, batch: SampledColumns) -> None:
        """ValueError unless a sampled batch has exactly this layout's columns (dtypes, decompressed per-row shapes)
        and rows: a shard that answers other columns, another sequence length or other item fields is named."""
        columns = columns_of(batch)
        if sorted(columns) != sorted(self.columns) or len(batch.weights) != self.rows:
            raise ValueError(
                f"a sampled batch does not fit the slot layout: {len(batch.weights)} rows of {columns}, "
                f"layout {self.rows} rows of {self.columns}"
            )

    def write(self, views: dict[str, np.ndarray], batch: SampledColumns) -> None:
        """Copy what the step columns leave of `batch` into a slot's `views`: the weights, and a sequence batch's
        lengths and item fields (its step columns went in through `step_targets`)."""
        np.copyto(views[WEIGHTS], batch.weights, casting="same_kind")
        if batch.sequence_length:
            np.copyto(views[LENGTHS], batch.lengths, casting="no")
            for name, column in batch.item_columns.items():
                np.copyto(views[name], column, casting="no")


class SampledColumns(Protocol):
    """What the slots read of a sampled batch (a `PrioritizedBatch`)."""

    columns: Mapping[str, np.ndarray | CompressedColumn]
    weights: np.ndarray
    sequence_length: int
    lengths: np.ndarray | None
    item_columns: Mapping[str, np.ndarray]


def columns_of(batch: SampledColumns) -> list[Column]:
    """The slot columns of a sampled batch, per row (decompressed shapes): its columns, or a sequence batch's
    steps as [T, ...] per item, its lengths and item fields; then the weights. ValueError when two share a name."""
    steps = (batch.sequence_length,) if batch.sequence_length else ()
    layout = [(name, col.dtype.str, (*steps, *logical_shape(col)[1:])) for name, col in batch.columns.items()]
    if batch.sequence_length:
        layout.append((LENGTHS, batch.lengths.dtype.str, ()))
        layout.extend((name, col.dtype.str, col.shape[1:]) for name, col in batch.item_columns.items())
    layout.append((WEIGHTS, np.dtype(np.float32).str, ()))
    names = [name for name, _, _ in layout]
    if len(set(names)) != len(names):
        raise ValueError(f"a sampled batch's step and item columns share a name: {names}")
    return layout


def step_targets(views: Mapping[str, np.ndarray], batch: SampledColumns) -> dict[str, np.ndarray]:
    """Where each of `batch`'s columns goes in a slot, shaped as the batch holds it (a sequence batch's [B, T, ...]
    step columns seen as its [B * T, ...] rows: the same bytes), for the decompressor to write into."""
    return {name: views[name].reshape(logical_shape(column)) for name, column in batch.columns.items()}


def create_slots_file(layout: SlotLayout) -> tuple[mmap.mmap, str]:
    """The parent's side: a new file sized for `layout`, mapped; (mapping, path) for the child to map."""
    fd, path = tempfile.mkstemp(prefix="apexrl-sampler-", dir=_shared_dir())
    try:
        os.ftruncate(fd, layout.total_bytes)
        buffer = mmap.mmap(fd, layout.total_bytes)
    finally:
        os.close(fd)
    return buffer, path


def map_slots_file(path: str, layout: SlotLayout) -> mmap.mmap:
    """The child's side: map the parent's file, then unlink its name (both sides hold the mapping)."""
    fd = os.open(path, os.O_RDWR)
    try:
        buffer = mmap.mmap(fd, layout.total_bytes)
    finally:
        os.close(fd)
    os.unlink(path)  # both sides hold the mapping; nothing is left behind if either dies
    return buffer


def _aligned(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def _shared_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

"""The shared-memory slots through which the sampler child hands batches to the learner: their layout, the file
that holds them, and the check that a batch fits its slot. Apart from the process and its pipe
(`sampler_process.py`) so that the byte layout both sides must agree on is written once.

The file holds `slots` batches, slot-major; inside a slot, every column's rows back to back (C order, each column
64-byte aligned), the importance weights last as the column WEIGHTS. A compressed column has its decompressed
shape here: the child decompresses straight into the slot. The parent creates the file (in /dev/shm when it can),
the child maps it and unlinks its name, so nothing is left behind if either process dies.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Mapping

import numpy as np

from apexrl.common.compression import logical_shape

WEIGHTS = "__importance_weights__"  # the slot column holding the batch's importance weights

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

    def check_fits(self, views: Mapping[str, np.ndarray], columns: Mapping[str, object]) -> None:
        """ValueError unless every column of a sampled batch has its place in a slot's `views`: same dtype and
        (decompressed) shape."""
        for name, column in columns.items():
            target = views.get(name)
            if target is None or target.shape != logical_shape(column) or target.dtype != column.dtype:
                raise ValueError(
                    f"a sampled batch does not fit the slot layout: column {name!r} "
                    f"{column.dtype}{list(logical_shape(column))}, layout {self.columns}"
                )


def columns_of(columns: Mapping[str, object]) -> list[Column]:
    """The slot columns of a sampled batch with these columns (decompressed shapes), then the weights."""
    layout = [(name, col.dtype.str, logical_shape(col)[1:]) for name, col in columns.items()]
    layout.append((WEIGHTS, np.dtype(np.float32).str, ()))
    return layout


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

"""The item fields of a sequence table (e.g. each item's recurrent state), kept in dense blocks of rows.

One numpy object per item would cost ~112 bytes of overhead per item, as much as a small state; a preallocated
array of `capacity` rows would cost the whole capacity in states although a table holds about capacity / period
items. Blocks of about BLOCK_BYTES are allocated as items arrive and freed rows reused (a free stack), so the pool
holds at most one block more than its items need. Pure numpy, not thread-safe (the table owns the lock).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apexrl.common.signature import Signature

BLOCK_BYTES = 64 * 1024


class ItemPool:
    """Rows of the item `signature`'s fields; `put` gives each new item a row, `release` frees rows."""

    def __init__(self, signature: Signature) -> None:
        self.signature = signature
        self.block_rows = max(1, BLOCK_BYTES // max(1, signature.row_nbytes))
        self._blocks: list[dict[str, np.ndarray]] = []
        self._free = np.empty(0, dtype=np.int64)  # free rows, a stack: the last is taken first
        self.used = 0

    def put(self, values: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
        """Store `values` rows `rows` ([n, ...] each) and return the pool row of each."""
        count = len(rows)
        while len(self._free) < count:
            self._grow()
        taken, self._free = self._free[len(self._free) - count :], self._free[: len(self._free) - count]
        for f in self.signature.fields:
            source = np.asarray(values[f.name])
            for row, index in zip(rows.tolist(), taken.tolist(), strict=True):
                self._blocks[index // self.block_rows][f.name][index % self.block_rows] = source[row]
        self.used += count
        return taken

    def release(self, indices: np.ndarray) -> None:
        self._free = np.concatenate([self._free, indices.astype(np.int64)])
        self.used -= len(indices)

    def get(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The fields of the rows at `indices`, [n, ...] each."""
        out = {f.name: np.empty((len(indices), *f.shape), dtype=f.dtype) for f in self.signature.fields}
        blocks = indices // self.block_rows
        for block in np.unique(blocks).tolist():
            where = blocks == block
            offsets = indices[where] % self.block_rows
            for name, column in out.items():
                column[where] = self._blocks[block][name][offsets]
        return out

    def _grow(self) -> None:
        first = len(self._blocks) * self.block_rows
        self._blocks.append(
            {f.name: np.zeros((self.block_rows, *f.shape), dtype=f.dtype) for f in self.signature.fields}
        )
        # Pushed in reverse, so the lowest rows are taken first.
        fresh = np.arange(first + self.block_rows - 1, first - 1, -1, dtype=np.int64)
        self._free = np.concatenate([fresh, self._free])

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use."""
        return self.used * self.signature.row_nbytes

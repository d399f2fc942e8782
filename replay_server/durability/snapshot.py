"""A point-in-time copy of a replay table, taken while the table keeps serving (copy-on-write per chunk).

`Snapshot.take` adds the snapshot to the table as a listener with the table's image (table_state.py): in one short
critical section, everything small (`TableState`: counters, keys, the writers' de-duplication table) and the sum
tree's leaves (8 bytes a row). The rows themselves are copied later, one chunk of slots at a time, without holding
the table lock: `chunks()` hands them to a writer. An insert that is about to overwrite rows of a chunk not copied
yet first saves those rows' old values (`overwriting`, which the table calls under its lock: a copy of the rows it
overwrites, not of the chunk), and the chunk's copy gets them back. So every chunk comes out exactly as it was when
the snapshot began, even if an insert wrote into it while it was being copied: the snapshot is the table's state at
that instant, although it is read over seconds. The snapshot's own lock is held only to hand the saved rows over,
never for a copy of a chunk, so a call never waits behind the snapshot (in CPython a copy under a lock would also
make the caller wait for the GIL). Priority updates touch only the tree, whose leaves were copied at the start;
samples change no row. Compressed fields are object arrays of frames (bytes, immutable): their copies are copies of
references. Rows evicted by the table's max_bytes are saved first as well, since eviction releases their frames.
Several snapshots may be open at once: each is a listener of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np

from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.table_state import TableImage, TableListener, TableState


def chunks_holding(state: TableState, chunk_rows: int) -> list[int]:
    """Indices of the chunks (slots [j * chunk_rows, (j + 1) * chunk_rows)) that hold at least one row."""
    first, rows = state.held_slots()
    count = -(-state.capacity // chunk_rows)
    if rows >= state.capacity:
        return list(range(count))
    held: set[int] = set()
    end = first + rows
    for a, b in ((first, min(end, state.capacity)), (0, max(0, end - state.capacity))):
        if b > a:
            held.update(range(a // chunk_rows, (b - 1) // chunk_rows + 1))
    return sorted(held)


class Snapshot(TableListener):
    """The consistent copy of one table (see the module docstring). Made by `Snapshot.take(table, chunk_rows)`;
    iterate `chunks()` once, then `close()` (or use it as a context manager) so the table stops telling it of
    writes."""

    def __init__(self, table: ReplayTable, chunk_rows: int) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows ({chunk_rows}) must be a positive integer")
        self.chunk_rows = chunk_rows
        self._lock = threading.Lock()
        self._table: ReplayTable | None = table  # until closed
        self.saved_rows = 0  # rows inserts had to save first (for tests and metrics)

    @classmethod
    def take(cls, table: ReplayTable, chunk_rows: int) -> Snapshot:
        """Start a consistent copy of `table` as it is now (FailedPreconditionError before its first insert,
        UnavailableError while it refuses calls)."""
        snapshot = cls(table, chunk_rows)
        table.add_listener(snapshot, with_image=True)
        return snapshot

    def added(self, image: TableImage) -> None:
        self.state: TableState = image.state
        self.leaves = image.leaves
        self.chunk_indices = chunks_holding(image.state, self.chunk_rows) if image.state.size else []
        self._storage = image.columns
        self._pending = set(self.chunk_indices)  # chunks not copied yet
        # Per pending chunk: which of its rows were saved before an insert overwrote them, and their old values.
        self._saved_mask: dict[int, np.ndarray] = {}
        self._patches: dict[int, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}

    def _slots(self, j: int) -> tuple[int, int]:
        return j * self.chunk_rows, min((j + 1) * self.chunk_rows, self.state.capacity)

    def overwriting(self, first_slot: int, rows: int) -> None:
        """The table is about to overwrite slots first_slot .. first_slot + rows - 1 (modulo capacity); its lock
        is held. Saves the old values of the rows of chunks not copied yet (only rows not saved before)."""
        with self._lock:
            if self._pending:
                self._save(first_slot, rows)

    def _save(self, start: int, rows: int) -> None:
        cap, size = self.state.capacity, self.chunk_rows
        first = min(rows, cap - start)
        for a, b in ((start, start + first), (0, rows - first)):
            for j in range(a // size, (b - 1) // size + 1) if b > a else ():
                if j not in self._pending:
                    continue
                lo, hi = max(a, j * size), min(b, (j + 1) * size)
                mask = self._saved_mask.setdefault(j, np.zeros(self._slots(j)[1] - j * size, dtype=bool))
                offsets = np.flatnonzero(~mask[lo - j * size : hi - j * size]) + (lo - j * size)
                if offsets.size == 0:
                    continue
                mask[offsets] = True
                slots = offsets + j * size
                self._patches.setdefault(j, []).append(
                    (offsets, {name: column[slots] for name, column in self._storage.items()})
                )
                self.saved_rows += offsets.size

    def chunks(self) -> Iterator[tuple[int, dict[str, np.ndarray], np.ndarray]]:
        """(first slot, columns, leaves) of every chunk holding rows, in slot order, each as it was when the
        snapshot began. A chunk is copied without any lock (inserts may be writing into it meanwhile); then,
        under the snapshot's lock for a moment, it is marked copied and the rows inserts saved before overwriting
        them are put back into the copy."""
        for j in self.chunk_indices:
            a, b = self._slots(j)
            columns = {name: column[a:b].copy() for name, column in self._storage.items()}
            with self._lock:
                self._pending.discard(j)
                self._saved_mask.pop(j, None)
                patches = self._patches.pop(j, [])
            for offsets, old in patches:
                for name, values in old.items():
                    columns[name][offsets] = values
            yield a, columns, self.leaves[a:b]

    def close(self) -> None:
        if self._table is not None:
            self._table.remove_listener(self)
            self._table = None
        with self._lock:
            self._pending.clear()
            self._saved_mask.clear()
            self._patches.clear()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

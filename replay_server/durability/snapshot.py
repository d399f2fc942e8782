"""A point-in-time copy of a replay table, taken while the table keeps serving (copy-on-write per chunk).

`ReplayTable.begin_snapshot` records, in one short critical section, everything small (`TableState`: counters,
keys, the writers' de-duplication table) and the sum tree's leaves (8 bytes a row). The rows themselves are
copied later, one chunk of slots at a time, without holding the table lock: `chunks()` hands them to a writer.
An insert that is about to overwrite rows of a chunk not copied yet first saves those rows' old values
(`before_write`, called by the table under its lock: a copy of the rows it overwrites, not of the chunk), and the
chunk's copy gets them back. So every chunk comes out exactly as it was when the snapshot began, even if an
insert wrote into it while it was being copied: the snapshot is the table's state at that instant, although it
is read over seconds. The lock is held only to hand the saved rows over, never for a copy of a chunk, so a call
never waits behind the snapshot (in CPython a copy under a lock would also make the caller wait for the GIL).
Priority updates touch only the tree, whose leaves were copied at the start; samples change no row. Compressed
fields are object arrays of frames (bytes, immutable): their copies are copies of references. Rows evicted by the
table's max_bytes are saved first as well (`before_write`), since eviction releases their frames.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from apexrl.common.signature import Signature

# Earlier incarnations remembered per table (see TableState.aliases); older ones are forgotten first.
MAX_ALIASES = 8
# In a table with compressed fields, the snapshot's, checkpoint's and restore's columns also hold each row's writer
# id (an object array of str) under this name, which no field can have (field names start with a letter or _).
ROW_WRITER = "@writer"


@dataclass(frozen=True)
class TableState:
    """Everything of a table but its rows and leaves: what a checkpoint's footer records.

    `aliases` maps an earlier incarnation to the key below which its keys name the same rows as this table's
    (rows restored from a checkpoint, or replayed from the write-ahead log, keep their keys): a learner's priority
    update for such a key still applies after a restart, while keys at or above the limit, which the restarted
    shard may give to other rows, are stale. `lineage` names the table's history (see the field)."""

    signature: Signature
    capacity: int
    alpha: float
    next_key: int  # keys held: [next_key - size, next_key)
    size: int
    max_priority: float
    incarnation: int
    aliases: dict[int, int] = field(default_factory=dict)
    writers: tuple[tuple[str, int], ...] = ()  # (writer id, last stored sequence), least recently used first
    counters: dict[str, int] = field(
        default_factory=dict
    )  # evicted, sampled, updated, stale, duplicates, bytes
    # Random, drawn when a table starts empty (or is made by resharding) and carried on by every restore: a
    # write-ahead log replays only onto the lineage it was written for.
    lineage: int = 0

    @property
    def first_key(self) -> int:
        return self.next_key - self.size

    def held_slots(self) -> tuple[int, int]:
        """(first slot, rows): the held rows occupy slots first .. first + rows - 1, modulo the capacity."""
        return self.first_key % self.capacity, self.size


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


class Snapshot:
    """The consistent copy of one table (see the module docstring). Made by `ReplayTable.begin_snapshot`;
    iterate `chunks()` once, then `close()` (or use it as a context manager) so inserts stop checking it."""

    def __init__(
        self,
        state: TableState,
        leaves: np.ndarray,
        storage: dict[str, np.ndarray],
        lock: threading.Condition,
        chunk_rows: int,
        on_close: Callable[[], None],
    ) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows ({chunk_rows}) must be a positive integer")
        self.state = state
        self.leaves = leaves
        self.chunk_rows = chunk_rows
        self.chunk_indices = chunks_holding(state, chunk_rows) if state.size else []
        self._storage = storage
        self._lock = lock
        self._pending = set(self.chunk_indices)  # chunks not copied yet
        # Per pending chunk: which of its rows were saved before an insert overwrote them, and their old values.
        self._saved_mask: dict[int, np.ndarray] = {}
        self._patches: dict[int, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
        self._on_close = on_close
        self.saved_rows = 0  # rows inserts had to save first (for tests and metrics)

    def _slots(self, j: int) -> tuple[int, int]:
        return j * self.chunk_rows, min((j + 1) * self.chunk_rows, self.state.capacity)

    def before_write(self, start: int, rows: int) -> None:
        """The table is about to overwrite slots start .. start + rows - 1 (modulo capacity); its lock is held.
        Saves the old values of the rows of chunks not copied yet (only rows not saved before)."""
        if not self._pending:
            return
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
        snapshot began. A chunk is copied without the table lock (inserts may be writing into it meanwhile);
        then, under the lock for a moment, it is marked copied and the rows inserts saved before overwriting
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
        with self._lock:
            self._pending.clear()
            self._saved_mask.clear()
            self._patches.clear()
        self._on_close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

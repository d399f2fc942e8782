"""The table's durability hooks: a consistent snapshot of a serving table, a restore from a saved state, and the
write-ahead log's replay of one batch at its original keys.

They are the table's own methods moved out of table.py (`ReplayTable.begin_snapshot`, `restore`, `replay_insert`
delegate here) and work on the table's state under its lock (`table._cond`): its keys (`_ring`, `_max_priority`,
`_aliases`, `_writers`), its rows (`_rows`, `_signature`, `_allocate`, `_write_rows`, `_store`,
`_enforce_max_bytes`), its tree (`_tree`), its `_counters`, its `_gate` and the open `_snapshot`. Nothing else
reaches into them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.dedup import WriterSequences
from apexrl.replay_server.durability.snapshot import MAX_ALIASES, ROW_WRITER, Snapshot, TableState
from apexrl.replay_server.key_ring import KeyRing
from apexrl.replay_server.table_counters import TableCounters
from apexrl.replay_server.updates import check_priorities

if TYPE_CHECKING:
    from apexrl.replay_server.table import ReplayTable


def begin_snapshot(table: ReplayTable, chunk_rows: int) -> Snapshot:
    """Start a consistent copy of the table as it is now (snapshot.py): one short critical section copies the
    small state and the tree's leaves; the rows are copied chunk by chunk as the snapshot is read, while
    inserts, samples and updates go on. One snapshot at a time; close it when done."""
    with table._cond:
        table.check_available()
        if table._snapshot is not None:
            raise FailedPreconditionError("a snapshot of this table is already being taken")
        if table._signature is None:
            raise FailedPreconditionError("the table has no signature yet (nothing was ever inserted)")
        state = TableState(
            signature=table._signature,
            capacity=table.config.capacity,
            alpha=table.config.alpha,
            next_key=table._ring.next_key,
            size=table._ring.size,
            max_priority=table._max_priority,
            incarnation=table.incarnation,
            aliases=dict(table._aliases),
            writers=tuple(table._writers.items()),
            counters=table._counters.saved(),
            lineage=table.lineage,
        )
        rows = table._rows
        storage = rows.columns if rows.row_writers is None else {**rows.columns, ROW_WRITER: rows.row_writers}
        table._snapshot = Snapshot(
            state, table._tree.leaf_values(), storage, table._cond, chunk_rows, lambda: _end_snapshot(table)
        )
        return table._snapshot


def _end_snapshot(table: ReplayTable) -> None:
    with table._cond:
        table._snapshot = None


def restore(
    table: ReplayTable, state: TableState, blocks: Iterable[tuple[int, Mapping[str, np.ndarray], np.ndarray]]
) -> int:
    """Load a saved state into this table, which must be empty and refusing calls (`refuse_calls`): `blocks`
    are (first key, columns, leaves p**alpha) in key order covering the state's keys (with compressed fields,
    the columns may hold each row's writer id under ROW_WRITER). Rows keep their keys and priorities; with a
    capacity (or max_bytes) below the saved size the oldest rows are dropped (counted as evicted). The
    table keeps its own, new incarnation; the saved one (and its own aliases) become aliases, so priority
    updates for restored keys still apply. A failed restore (a block that does not read, or leaves the tree
    refuses) leaves the table as it was before, empty and without a signature unless the config declares one,
    ready for another restore. Returns the rows restored."""
    if table.config.signature is not None and state.signature != table.config.signature:
        raise InvalidArgumentError(
            f"saved signature {state.signature} differs from the table's {table.config.signature}"
        )
    cap = table.config.capacity
    keep = min(state.size, cap)
    lowest = state.next_key - keep
    with table._cond:
        if table._ring.next_key or table._gate.unavailable is None:
            raise FailedPreconditionError("restore needs an empty table that refuses calls (refuse_calls)")
        if table._signature != state.signature:
            table._allocate(state.signature)
    leaves = np.zeros(cap, dtype=np.float64)
    try:
        for first_key, columns, block_leaves in blocks:
            skip = max(0, lowest - first_key)
            rows = len(block_leaves) - skip
            if rows <= 0:
                continue
            slots = table._write_rows(
                (first_key + skip) % cap, columns, rows, offset=skip, writers=columns.get(ROW_WRITER)
            )
            leaves[slots] = block_leaves[skip:]
        with table._cond:
            table._tree.load_leaves(leaves)
    except BaseException:
        _forget_restored_rows(table)
        raise
    with table._cond:
        table._ring = KeyRing(cap, state.next_key, keep)
        table._max_priority = state.max_priority
        table.lineage = state.lineage or table.lineage
        table._writers = WriterSequences(table.config.max_tracked_writers, state.writers)
        table._counters = TableCounters.from_saved(state.counters)
        table._counters.evicted += state.size - keep
        aliases = dict(state.aliases)
        if state.incarnation:
            aliases[state.incarnation] = state.next_key
        table._aliases = dict(list(aliases.items())[-MAX_ALIASES:])
        table._enforce_max_bytes()
        return table._ring.size


def _forget_restored_rows(table: ReplayTable) -> None:
    """Undo the rows a failed restore wrote: the frames it stored are released and the table has the signature
    it had before (none unless its config declares one)."""
    with table._cond:
        if table.config.signature is None:
            table._rows, table._signature = None, None
        elif table._rows is not None:
            table._rows.release_all()


def replay_insert(
    table: ReplayTable,
    first_key: int,
    columns: Mapping[str, np.ndarray],
    priorities: np.ndarray,
    writer_id: str,
    sequence: int,
    incarnation: int,
) -> bool:
    """Store a batch read back from the write-ahead log with its original keys and raw priorities; a batch
    below the next key is already held and skipped (False). The incarnation that wrote it becomes an alias
    up to the batch's last key: those keys name the same rows here."""
    signature = table._signature or Signature.from_batch(columns)
    rows = signature.check_batch(columns)
    with table._cond:
        if first_key + rows <= table._ring.next_key:
            return False
        if table._signature is None:
            table._allocate(signature)
        if first_key != table._ring.next_key:
            raise FailedPreconditionError(
                f"log batch at key {first_key} does not follow key {table._ring.next_key}"
            )
        table._store(columns, check_priorities(priorities, rows), rows, writer_id)
        table._writers.remember(writer_id, sequence)
        if incarnation and incarnation != table.incarnation:
            table._aliases[incarnation] = max(table._aliases.get(incarnation, 0), table._ring.next_key)
            table._aliases = dict(list(table._aliases.items())[-MAX_ALIASES:])
        return True

"""What a restore checks before it trusts a checkpoint's content. Checksums prove that a file is the one that was
written, not that what was written makes sense: a bug, a hand-edited file or a hostile peer can leave a file
whose every CRC holds and whose leaves are NaN, whose keys overlap or whose counters are negative. Each check
below raises InvalidArgumentError naming the first value no table could have saved, and the checkpointer sets
such a file aside exactly like a corrupt one (renamed `*.corrupt`, the previous checkpoint restored) instead of
the shard failing to start on it again and again.

Pure: no I/O, no locks. The bounds are the table's own (`MAX_PRIORITY`, `TableConfig`'s alpha range).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from apexrl.common.errors import InvalidArgumentError
from apexrl.replay_server.core.table import MAX_PRIORITY, TableConfig, check_priorities
from apexrl.replay_server.core.table_state import ROW_WRITER, TABLE_COLUMNS, TableState

_KEY_LIMIT = 1 << 63  # keys travel as uint64 but the table computes with int64
_WIRE_LIMIT = 1 << 64  # incarnations and sequence numbers are uint64 on the wire
# Relative slack on the largest leaf, MAX_PRIORITY ** alpha: the sum tree raises with numpy, this bound with Python.
_LEAF_SLACK = 1 + 1e-9

Block = tuple[int, Mapping[str, np.ndarray], np.ndarray]


def check_state(state: TableState) -> None:
    """InvalidArgumentError naming the first number of a checkpoint's footer that no table could have saved."""
    try:
        TableConfig(capacity=state.capacity, alpha=state.alpha)  # the table's own rule for both
    except ValueError as err:
        raise InvalidArgumentError(str(err)) from None
    if not 0 <= state.size <= min(state.capacity, state.next_key) or state.next_key >= _KEY_LIMIT:
        raise InvalidArgumentError(
            f"size {state.size} and next key {state.next_key} do not fit a table of "
            f"capacity {state.capacity} (keys below 2**63)"
        )
    check_priorities(np.array([state.max_priority]), 1, "max_priority")
    if not 0 <= state.incarnation < _WIRE_LIMIT or not 0 <= state.lineage < _WIRE_LIMIT:
        raise InvalidArgumentError(
            f"incarnation {state.incarnation} or lineage {state.lineage} is not a uint64"
        )
    for incarnation, limit in state.aliases.items():
        if not 0 <= incarnation < _WIRE_LIMIT or not 0 <= limit <= state.next_key:
            raise InvalidArgumentError(
                f"alias of incarnation {incarnation} up to key {limit}: keys above the next "
                f"key ({state.next_key}) would name rows not inserted yet"
            )
    for writer, sequence in state.writers:
        if not 0 <= sequence < _WIRE_LIMIT:
            raise InvalidArgumentError(f"writer {writer[:64]!r} has sequence {sequence}, not a uint64")
    negative = {name: value for name, value in state.counters.items() if value < 0}
    if negative:
        raise InvalidArgumentError(f"negative counters {negative}")


def checked_blocks(state: TableState, blocks: Iterable[Block]) -> Iterator[Block]:
    """The blocks of a checkpoint's rows (first key, columns, leaves), each checked before it is handed on: keys
    consecutive from the state's first key to its next key, columns of the state's signature with one row per
    leaf, and leaves (priority ** alpha) finite, >= 0 and at most MAX_PRIORITY ** alpha. InvalidArgumentError
    naming the first fault; a restore that takes them then fails before it trusts a bad row."""
    largest = (MAX_PRIORITY**state.alpha if state.alpha else 1.0) * _LEAF_SLACK
    key = state.first_key
    for first_key, columns, leaves in blocks:
        if first_key != key:
            raise InvalidArgumentError(f"rows from key {first_key} follow key {key - 1}")
        rows = state.signature.check_batch({n: c for n, c in columns.items() if n not in TABLE_COLUMNS})
        writers = columns.get(ROW_WRITER)
        if rows != len(leaves) or (writers is not None and len(writers) != rows):
            raise InvalidArgumentError(
                f"rows from key {first_key}: {rows} rows, {len(leaves)} leaves"
                f"{'' if writers is None else f', {len(writers)} writer ids'}"
            )
        bad = ~((leaves >= 0) & (leaves <= largest))  # also true for NaN
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidArgumentError(
                f"row {first_key + i} has priority ** alpha {float(leaves[i])}; leaves must be finite, >= 0 and "
                f"<= {largest / _LEAF_SLACK:g} ({int(bad.sum())} of {rows} from key {first_key} are not)"
            )
        key += rows
        yield first_key, columns, leaves
    if key != state.next_key:
        raise InvalidArgumentError(f"rows end at key {key}, the state says {state.next_key}")

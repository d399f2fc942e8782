"""The sequence items of one insert as the table takes them (replay.proto, SequenceItems), and their checks.
Pure numpy: the wire decodes into it, the table, the write-ahead log and the SDK's SequenceWriter use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.updates import check_priorities


@dataclass(frozen=True)
class ItemBatch:
    """The items of one insert: item i ends at row ends[i] - 1 of the insert's batch and spans lengths[i] steps;
    `columns` are the item fields ([items, ...]); `priorities` raw, or None for the shard's max priority."""

    ends: np.ndarray  # int64 [items]
    lengths: np.ndarray  # int64 [items]
    columns: Mapping[str, np.ndarray]
    priorities: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        """Bytes the items take in a request (what bounds its size)."""
        fields = sum(np.asarray(column).nbytes for column in self.columns.values())
        return (
            fields
            + 8 * len(self.ends)
            + (0 if self.priorities is None else np.asarray(self.priorities).nbytes)
        )

    def checked(
        self, rows: int, max_length: int, signature: Signature | None
    ) -> tuple[Signature | None, np.ndarray | None]:
        """Check the items against a batch of `rows` steps (InvalidArgumentError naming the field); returns the
        item signature they have (the table's, or theirs when it has none yet; None: no item fields) and their
        priorities as float64."""
        count = len(self.ends)
        if len(self.lengths) != count:
            raise InvalidArgumentError(
                f"items.length has {len(self.lengths)} entries and items.end {count}: one of each per item"
            )
        _check_range(self.ends, 1, rows, "items.end", f"a row of the batch plus one (1 .. {rows})")
        _check_range(self.lengths, 1, max_length, "items.length", f"1 .. max_sequence_length ({max_length})")
        starts = self.ends - self.lengths
        if len(np.unique(starts)) != count:
            raise InvalidArgumentError("items: two items of one insert start at the same step")
        own = signature
        if own is None and self.columns:
            own = Signature.from_batch(self.columns)
        if own is None:  # no item fields (items start from a zero state, say)
            if self.columns:
                raise InvalidArgumentError("items.columns: this table's items carry no fields")
        else:
            try:
                got = own.check_batch(self.columns)
            except InvalidArgumentError as err:
                raise InvalidArgumentError(f"items.columns: {err}") from None
            if got != count:
                raise InvalidArgumentError(f"items.columns hold {got} rows for {count} items")
            if own.compressed:
                raise InvalidArgumentError("items.columns: item fields cannot be compressed")
        values = (
            None if self.priorities is None else check_priorities(self.priorities, count, "items.priorities")
        )
        return own, values


def _check_range(values: np.ndarray, low: int, high: int, what: str, expected: str) -> None:
    bad = (values < low) | (values > high)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgumentError(f"{what}[{i}] is {int(values[i])}, expected {expected}")

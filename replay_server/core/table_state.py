"""What a replay table shows of itself to whatever persists, copies or watches it, without knowing what that is:
its state as data (`TableState`, the rows' `TableImage`) and the one way to observe its writes (`TableListener`).

A checkpoint, a write-ahead log and a live snapshot are all listeners (durability/); the table calls them under its
lock, in key order, and never imports them. Pure: numpy and the signature, no lock, no transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from apexrl.common.signature import Signature

if TYPE_CHECKING:
    from apexrl.replay_server.core.item_batch import ItemBatch

# Earlier incarnations remembered per table (see TableState.aliases); older ones are forgotten first.
MAX_ALIASES = 8
# In a table with compressed fields, an image's, checkpoint's and restore's columns also hold each row's writer id
# (an object array of str) under this name, which no field can have (field names start with a letter or _).
ROW_WRITER = "@writer"
# A sequence table's per-slot columns (sequences.py), beside the fields in an image, a checkpoint and a restore:
# the key distance to the trajectory's next step (int32, 0: none), the steps of the item starting there (uint16,
# 0: none), and that item's fields (an object array of bytes, the fields' raw bytes in item-signature order; None
# where no item starts; only when the items have fields).
NEXT_STEP = "@next_step"
ITEM_LENGTH = "@item_length"
ITEM_FIELDS = "@item_fields"
TABLE_COLUMNS = (ROW_WRITER, NEXT_STEP, ITEM_LENGTH, ITEM_FIELDS)


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
    # Sequence tables (0, None, () otherwise): the longest item, the items' fields, and each (writer, trajectory)'s
    # last step keys, least recently used first.
    max_sequence_length: int = 0
    item_signature: Signature | None = None
    tails: tuple[tuple[str, int, tuple[int, ...]], ...] = ()

    @property
    def first_key(self) -> int:
        return self.next_key - self.size

    def held_slots(self) -> tuple[int, int]:
        """(first slot, rows): the held rows occupy slots first .. first + rows - 1, modulo the capacity."""
        return self.first_key % self.capacity, self.size


@dataclass(frozen=True)
class TableImage:
    """A table at one instant, handed to a listener as it is added (`ReplayTable.add_listener(with_image=True)`):
    its state, a copy of the sum tree's leaves (p**alpha per slot), and its storage columns by slot (with
    ROW_WRITER when rows have writers). The columns are the table's own arrays, not copies: they change with
    every later write, which the listener hears of first (`TableListener.overwriting`)."""

    state: TableState
    leaves: np.ndarray
    columns: Mapping[str, np.ndarray]


class TableListener:
    """Observes a table's writes (durability's one way in). Each method is called under the table's lock, so it
    must be quick and must not call the table; the defaults do nothing."""

    def added(self, image: TableImage) -> None:
        """The listener was added with the table's image (nothing was written between the two)."""

    def storing(
        self,
        first_key: int,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray,
        writer_id: str,
        sequence: int,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> None:
        """A new batch (raw priorities) is about to be stored at keys first_key... (in a sequence table: steps of
        `trajectory`, with the `items` that end in them). Raising refuses it: the insert raises that error and the
        table is exactly as before. Batches the table reloads (`insert_at`, `load_state`) are not new and are not
        announced."""

    def overwriting(self, first_slot: int, rows: int) -> None:
        """Slots first_slot .. first_slot + rows - 1 (modulo the capacity) are about to be overwritten, their rows
        evicted, or (a sequence table) their per-slot columns changed."""

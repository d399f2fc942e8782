"""Sequence items (R2D2): windows of consecutive steps of one writer, stored as references to the table's rows.

In a sequence table (TableConfig.max_sequence_length > 0) every row is one environment step, and what is sampled
and prioritised is an *item*: up to max_sequence_length consecutive steps of one writer, plus the item's own fields
(the recurrent state at its first step). Overlapping windows (R2D2 starts one every `period` steps) would store
each step two or three times as copies; here a step is stored once and items refer to it (Reverb's lesson:
items are references into stored data, never copies).

How an item finds its steps. A writer sends its steps in order; the shard keeps, per writer, the keys of its last
max_sequence_length steps (its *tail*), and links each step to the same writer's next one (`next_step`, a key
distance per slot). An item arrives with the request that holds its last step and says only where it ends (a
row of that request) and how many steps it spans: its steps are the writer's last `length` steps up to that row.
An item lives at its first step's slot (its key is that step's key), so the FIFO ring evicts it exactly when its
oldest step goes: an item is never held without all of its steps, and never sampled after losing one. An item
whose first step is evicted by the very insert that brings it (a table smaller than its writers' windows) is
dropped at once and counted as evicted.

Pure numpy, not thread-safe: the table owns the lock (as with storage.py and sum_tree.py).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.item_pool import ItemPool
from apexrl.replay_server.core.table_state import ITEM_FIELDS, ITEM_LENGTH, NEXT_STEP

# Slots are indexed by int32 key distances: a sequence table's capacity stays below this.
MAX_SEQUENCE_CAPACITY = (1 << 31) - 1
# An item's length is a uint16 per slot.
MAX_SEQUENCE_LENGTH = (1 << 16) - 1


class SequenceIndex:
    """Which stored steps begin an item, each item's fields, the links from each step to its writer's next one,
    and each writer's tail (see the module docstring). Slots are the table ring's."""

    def __init__(self, capacity: int, max_length: int, max_writers: int) -> None:
        if capacity > MAX_SEQUENCE_CAPACITY:
            raise InvalidArgumentError(f"a sequence table holds at most {MAX_SEQUENCE_CAPACITY} steps")
        if not 1 <= max_length <= MAX_SEQUENCE_LENGTH:
            raise InvalidArgumentError(f"max_sequence_length must be in [1, {MAX_SEQUENCE_LENGTH}]")
        self.capacity = capacity
        self.max_length = max_length
        self.max_writers = max_writers
        self.next_step = np.zeros(
            capacity, dtype=np.int32
        )  # key distance to the writer's next step (0: none)
        self.item_length = np.zeros(capacity, dtype=np.uint16)  # steps of the item starting here (0: none)
        self.signature: Signature | None = None  # the item fields, fixed by the first items (or declared)
        self.fixed = False  # whether the item fields are fixed (None then means: no item fields)
        self.pool: ItemPool | None = None  # the items' fields, with a signature that has fields
        self.pool_row = np.zeros(0, dtype=np.int32)  # per slot, its item's row in the pool (with a pool)
        self.items = 0  # items held
        self.inserted = 0  # items ever stored (dropped-on-arrival ones included)
        self.evicted = 0  # items gone with their first step (or dropped on arrival)
        # (writer, trajectory) -> keys of its last steps, least recently used first
        self._tails: OrderedDict[tuple[str, int], deque[int]] = OrderedDict()

    # ------------------------------------------------------------------------------------------------ insert
    def first_keys(
        self, writer_id: tuple[str, int], first_key: int, items: ItemBatch, oldest_after: int
    ) -> np.ndarray:
        """Each item's first step key, or -1 for an item whose first step will be gone once the batch starting at
        `first_key` is stored (`oldest_after`: the oldest key held then). InvalidArgumentError for an item that
        needs steps this writer never sent here."""
        tail = self._tails.get(writer_id, ())
        held = len(tail)
        firsts = np.empty(len(items), dtype=np.int64)
        for i, (end, length) in enumerate(zip(items.ends.tolist(), items.lengths.tolist(), strict=True)):
            start = held + end - length  # index of the first step in (tail, then the batch's rows)
            if start < 0:
                raise InvalidArgumentError(
                    f"items.length[{i}] is {length}: the item needs {length} steps of writer {writer_id[0]!r} "
                    f"(trajectory {writer_id[1]}) up to row {end - 1} of the batch, and the shard holds "
                    f"{held + end} (steps sent to another shard, or before this shard restarted, must be sent "
                    f"again)"
                )
            key = tail[start] if start < held else first_key + start - held
            firsts[i] = key if key >= oldest_after else -1
        return firsts

    def check_starts(self, firsts: np.ndarray, held: np.ndarray) -> None:
        """InvalidArgumentError when an item would start at a step that already begins one (`held`: which of the
        first keys are stored steps)."""
        taken = held & (self.item_length[firsts % self.capacity] > 0)
        if taken.any():
            i = int(np.flatnonzero(taken)[0])
            raise InvalidArgumentError(f"items.end[{i}]: an item already starts at step key {int(firsts[i])}")

    def last_key(self, writer_id: tuple[str, int]) -> int | None:
        """The key of the trajectory's newest step here (None: none yet)."""
        tail = self._tails.get(writer_id)
        return tail[-1] if tail else None

    def tails_state(self) -> tuple[tuple[str, int, tuple[int, ...]], ...]:
        """Each (writer, trajectory)'s last step keys, least recently used first (TableState.tails)."""
        return tuple((writer, trajectory, tuple(keys)) for (writer, trajectory), keys in self._tails.items())

    def load_tails(self, tails: tuple[tuple[str, int, tuple[int, ...]], ...]) -> None:
        """Take the tails a restored state saved (the most recently used max_writers of them)."""
        for writer, trajectory, keys in tails[-self.max_writers :]:
            self._tails[(writer, trajectory)] = deque(keys, maxlen=self.max_length)

    def link(self, writer_id: tuple[str, int], first_key: int, rows: int, oldest_key: int) -> None:
        """Record a stored batch of `rows` steps of `writer_id` starting at `first_key` (the writer's tail and
        the links from each of its steps to the next); `oldest_key`: the oldest key held before the batch."""
        cap = self.capacity
        tail = self._tails.pop(writer_id, None)
        if tail is None:
            tail = deque(maxlen=self.max_length)
            if len(self._tails) >= self.max_writers:
                self._tails.popitem(last=False)
        if tail and tail[-1] >= oldest_key:
            self.next_step[tail[-1] % cap] = first_key - tail[-1]
        slots = (first_key + np.arange(rows, dtype=np.int64)) % cap
        self.next_step[slots] = 1
        self.next_step[slots[-1]] = 0
        tail.extend(range(max(first_key, first_key + rows - self.max_length), first_key + rows))
        self._tails[writer_id] = tail

    def fix_signature(self, signature: Signature | None) -> None:
        """Adopt the item fields of the first items (None: items carry no fields)."""
        self.signature, self.fixed = signature, True
        if signature is not None:
            self.pool = ItemPool(signature)
            self.pool_row = np.zeros(self.capacity, dtype=np.int32)

    def add(self, firsts: np.ndarray, items: ItemBatch) -> np.ndarray:
        """Store the items whose first key is not -1 (`firsts`); returns their slots, in item order."""
        kept = np.flatnonzero(firsts >= 0)
        self.inserted += len(items)
        self.evicted += len(items) - len(kept)
        slots = firsts[kept] % self.capacity
        self.item_length[slots] = items.lengths[kept]
        if self.pool is not None and len(kept):
            self.pool_row[slots] = self.pool.put(items.columns, kept)  # copies: the request is not kept
        self.items += len(kept)
        return slots

    def evict(self, slots: np.ndarray) -> np.ndarray:
        """Forget the steps at `slots` (overwritten or dropped): the items they begin go with them. Returns the
        slots of those items (the only ones of `slots` whose sum-tree leaves are not 0)."""
        lost = slots[self.item_length[slots] > 0]
        count = len(lost)
        if count:
            self.item_length[lost] = 0
            if self.pool is not None:
                self.pool.release(self.pool_row[lost])
            self.items -= count
            self.evicted += count
        self.next_step[slots] = 0
        return lost

    # ------------------------------------------------------------------------------------------------ sample
    def starts_item(self, slots: np.ndarray) -> np.ndarray:
        """Which of `slots` (of stored steps) begin an item."""
        return self.item_length[slots] > 0

    def uniform_slots(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` item slots drawn uniformly with replacement (the zero-mass rule, over items)."""
        return rng.choice(np.flatnonzero(self.item_length), count)

    def step_slots(self, item_slots: np.ndarray, first_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slots of each item's steps, [items, max_length] (positions past an item's length repeat its last
        step), and each item's length."""
        cap = self.capacity
        lengths = self.item_length[item_slots].astype(np.int64)
        keys = np.empty((len(item_slots), self.max_length), dtype=np.int64)
        key = first_keys.astype(np.int64)
        keys[:, 0] = key
        for t in range(1, self.max_length):
            key = np.where(t < lengths, key + self.next_step[key % cap], key)
            keys[:, t] = key
        return keys % cap, lengths

    def gather_fields(self, item_slots: np.ndarray) -> dict[str, np.ndarray]:
        """The item fields of the items at `item_slots`, [items, ...] per field."""
        return {} if self.pool is None else self.pool.get(self.pool_row[item_slots])

    @property
    def nbytes(self) -> int:
        """Bytes the items' own fields hold (the index arrays not counted: 8 bytes per step)."""
        return 0 if self.pool is None else self.pool.nbytes


@dataclass(frozen=True)
class ItemPlacement:
    """A sequence insert's items once checked against the table (table.py places them, then stores them)."""

    items: ItemBatch | None  # None: the insert brings steps only
    signature: Signature | None  # the item fields they have
    values: np.ndarray  # raw priorities, one per item
    firsts: np.ndarray  # each item's first step key (-1: dropped on arrival, its first step already gone)

    @property
    def count(self) -> int:
        """Items that will be held."""
        return int((self.firsts >= 0).sum())

    def logged(self) -> ItemBatch | None:
        """The items as a write-ahead log keeps them: with the priorities they get (a replay must not draw the
        max priority of its own time)."""
        return None if self.items is None else replace(self.items, priorities=self.values)


# --------------------------------------------------------------------------------------------------- persistence
# What durability sees of a sequence index: per-slot columns beside the fields (table_state.NEXT_STEP, ITEM_LENGTH,
# ITEM_FIELDS) and the tails in TableState; a restore loads both back.


def image_columns(index: SequenceIndex) -> dict[str, np.ndarray | ItemFieldsView]:
    """The index's per-slot columns as an image shows them (the arrays themselves, not copies)."""
    columns: dict[str, np.ndarray | ItemFieldsView] = {
        NEXT_STEP: index.next_step,
        ITEM_LENGTH: index.item_length,
    }
    if index.pool is not None:
        columns[ITEM_FIELDS] = ItemFieldsView(index)
    return columns


def load_block(index: SequenceIndex, slots: np.ndarray, columns: Mapping[str, np.ndarray], skip: int) -> None:
    """Load a restored block's per-slot columns (rows from `skip` on) into `slots`; InvalidArgumentError for
    item fields that do not fit the item signature."""
    links = np.asarray(columns[NEXT_STEP])[skip:]
    lengths = np.asarray(columns[ITEM_LENGTH])[skip:]
    if (links < 0).any() or (lengths > index.max_length).any():
        raise InvalidArgumentError(
            f"saved sequence columns hold a negative link or an item longer than {index.max_length} steps"
        )
    index.next_step[slots] = links
    index.item_length[slots] = lengths
    starts = np.flatnonzero(lengths)
    index.items += len(starts)
    if index.pool is not None and len(starts):
        rows = decode_item_rows(
            np.asarray(columns[ITEM_FIELDS], dtype=object)[skip:][starts], index.signature
        )
        index.pool_row[slots[starts]] = index.pool.put(rows, np.arange(len(starts)))


class ItemFieldsView:
    """The items' fields by slot, as an object array of bytes (None where no item starts) when indexed: what a
    snapshot copies and a checkpoint writes (table_state.ITEM_FIELDS)."""

    def __init__(self, index: SequenceIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.capacity

    def __getitem__(self, where) -> np.ndarray:
        index = self._index
        slots = np.arange(index.capacity)[where]
        out = np.full(len(slots), None, dtype=object)
        starts = np.flatnonzero(index.item_length[slots])
        if len(starts):
            values = index.pool.get(index.pool_row[slots[starts]])
            out[starts] = encode_item_rows(values, index.signature)
        return out


def encode_item_rows(values: Mapping[str, np.ndarray], signature: Signature) -> list[bytes]:
    """Each item's fields as one bytes object: the fields' raw bytes in signature order."""
    count = len(next(iter(values.values())))
    flat = [
        np.ascontiguousarray(values[f.name], dtype=f.dtype).reshape(count, -1).view(np.uint8)
        for f in signature.fields
    ]
    joined = np.concatenate(flat, axis=1) if len(flat) > 1 else flat[0]
    return [row.tobytes() for row in joined]


def decode_item_rows(rows: np.ndarray, signature: Signature) -> dict[str, np.ndarray]:
    """The fields of items saved by encode_item_rows (an object array of bytes); InvalidArgumentError for a row
    of the wrong size."""
    width = signature.row_nbytes
    bad = [
        i
        for i, row in enumerate(rows.tolist())
        if not isinstance(row, bytes | bytearray) or len(row) != width
    ]
    if bad:
        raise InvalidArgumentError(f"saved item fields at row {bad[0]} are not {width} bytes ({signature})")
    data = np.frombuffer(b"".join(rows.tolist()), dtype=np.uint8).reshape(len(rows), width)
    out, at = {}, 0
    for f in signature.fields:
        n = f.row_nbytes
        out[f.name] = data[:, at : at + n].copy().view(f.dtype).reshape(len(rows), *f.shape)
        at += n
    return out

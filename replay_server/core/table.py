"""The replay table: a columnar FIFO ring buffer with a prioritized sum tree, keys, and a rate limiter.

The table owns the lock; the sum tree is not thread-safe by contract. Every operation holds the lock only for its
copy in or copy out (never while waiting on the network), so many writers and one learner can share a shard.

Keys are insertion indices (key_ring.py): a priority update for a key no longer stored is ignored and counted.
The rows themselves live in storage.py (columns, frames of compressed fields, each row's writer and bytes), the
resend rule in dedup.py, when calls may proceed (rate limiter, restore, shutdown) in admission.py, the running
totals in table_counters.py; the table ties them together under one lock and decides what to evict (by rows, and
by bytes when `max_bytes` is set: the oldest rows first).

It knows nothing of what persists it. Durability sees it through a narrow public interface (the way Reverb's table
exposes checkpointing and inserting from a checkpoint): listeners told of each write under the lock
(`add_listener`, table_state.TableListener), its state and image (`state`, `TableImage`), and two ways to load rows
that keep their keys (`load_state` from a saved state, `insert_at` for a logged batch). It never blocks: a call held
back raises NotReadyError at once (admission.py); the server waits (waits.py).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from apexrl.common.compression import CompressedColumn, column_nbytes
from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.admission import Admission
from apexrl.replay_server.core.dedup import WriterSequences
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.key_ring import KeyRing
from apexrl.replay_server.core.probabilities import has_mass
from apexrl.replay_server.core.sequences import (
    ItemPlacement,
    SequenceIndex,
    image_columns,
    load_block,
)
from apexrl.replay_server.core.storage import ColumnStorage
from apexrl.replay_server.core.strata import check_batch_rows, stratified_targets
from apexrl.replay_server.core.sum_tree import SumTree
from apexrl.replay_server.core.table_config import TableConfig  # re-exported: its old home
from apexrl.replay_server.core.table_counters import TableCounters
from apexrl.replay_server.core.table_state import (
    MAX_ALIASES,
    ROW_WRITER,
    TableImage,
    TableListener,
    TableState,
)
from apexrl.replay_server.core.types import InsertResult, SampledBatch, ShardInfo, ShardTotals, UpdateResult
from apexrl.replay_server.core.updates import (  # MAX_PRIORITY: re-exported, its old home
    MAX_PRIORITY,  # noqa: F401
    CheckedUpdate,
    check_priorities,
    check_update,
)


class ReplayTable:
    """Thread-safe prioritized FIFO replay table (see module docstring)."""

    def __init__(self, config: TableConfig) -> None:
        self.config = config
        self.incarnation = secrets.randbits(63) | 1  # never 0: 0 means "current" on the wire
        self.lineage = secrets.randbits(63) | 1  # this table's history; a restore carries the saved one on
        self._lock = threading.Lock()
        self._tree = SumTree(config.capacity, config.alpha)
        self._rng = np.random.default_rng(config.seed)
        self._ring = KeyRing(config.capacity)
        self._gate = Admission(config, lambda: self.size)
        # A sequence table's items (sequences.py); None for a table of transitions.
        self._sequences = self._empty_sequences()
        self._signature: Signature | None = None
        self._rows: ColumnStorage | None = None  # allocated with the signature
        if config.signature is not None:
            self._allocate(config.signature)
        self._writers = WriterSequences(config.max_tracked_writers)
        self._max_priority = 1.0
        self._aliases: dict[int, int] = {}  # earlier incarnation -> key limit (see snapshot.TableState)
        self._listeners: tuple[TableListener, ...] = ()  # replaced, never changed in place
        # Why inserts are refused for good: storing failed after a listener took the batch (its keys would clash).
        self._broken: str | None = None
        self._counters = TableCounters()  # read by the metrics collector through info()

    # ----------------------------------------------------------------------------------------------- insert
    def insert(
        self,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        writer_id: str = "",
        sequence: int = 0,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> InsertResult:
        """Store a batch of rows (all or nothing); NotReadyError at once while the rate limiter holds inserts back.

        A batch whose (writer_id, sequence) is not above the writer's last stored sequence is a resend: it is
        reported as a duplicate and not stored. An empty writer_id turns de-duplication off.

        In a sequence table the rows are steps of `writer_id` and `items` the windows that end in this batch
        (sequences.py), of its `trajectory`; they are stored with it or not at all.
        """
        signature = self._signature or Signature.from_batch(columns)
        rows = signature.check_batch(columns)
        if rows > self.config.capacity:
            raise InvalidArgumentError(
                f"batch of {rows} rows exceeds the table capacity ({self.config.capacity})"
            )
        if self.config.max_bytes is not None:
            nbytes = sum(column_nbytes(c) for c in columns.values())
            if nbytes > self.config.max_bytes:
                raise InvalidArgumentError(
                    f"batch of {nbytes} bytes exceeds the table's max_bytes ({self.config.max_bytes})"
                )
        values = None if priorities is None else check_priorities(priorities, rows)
        checked_items = self._check_sequence_insert(values, writer_id, items, rows)
        with self._lock:
            self._gate.check_available()
            if self._broken is not None:
                raise UnavailableError(self._broken)
            if self._writers.is_resend(writer_id, sequence):
                self._counters.duplicates += 1
                return InsertResult(first_key=0, rows=0, duplicate=True)
            self._gate.admit_insert()
            storage = None
            if self._signature is None:
                storage = ColumnStorage.allocate(  # adopted once the listeners have taken the batch
                    signature, self.config.capacity, self.config.max_sample_batch_size
                )
            elif signature is not self._signature:
                rows = self._signature.check_batch(columns)  # first insert raced with another; check again
            first_key = self._ring.next_key
            placed = self._place_items(items, checked_items, rows, (writer_id, trajectory), first_key)
            if values is None:
                values = np.full(rows, 0.0 if self._sequences else self._max_priority)
            # Listeners first: one that raises (a write-ahead log that failed) leaves the table as it was, so nothing
            # is ever stored, and so sampled or acknowledged, that the log does not hold.
            told = 0
            try:
                logged = None if placed is None else placed.logged()
                for listener in self._listeners:
                    if placed is None:
                        listener.storing(first_key, columns, values, writer_id, sequence)
                    else:
                        listener.storing(
                            first_key,
                            columns,
                            values,
                            writer_id,
                            sequence,
                            items=logged,
                            trajectory=trajectory,
                        )
                    told += 1
                if storage is not None:
                    self._rows, self._signature = storage, signature
                self._store(columns, values, rows, writer_id)
                if placed is not None:
                    self._store_items((writer_id, trajectory), first_key, rows, placed)
                self._writers.remember(writer_id, sequence)
            except BaseException:
                if told:  # a listener holds keys the table does not: later keys would clash
                    self._broken = (
                        f"an insert failed after its batch was journalled at key {first_key}: "
                        f"inserts are refused until the shard restarts (and replays the log)"
                    )
                raise
        return InsertResult(
            first_key=first_key, rows=rows, duplicate=False, items=0 if placed is None else placed.count
        )

    def _check_sequence_insert(
        self, values: np.ndarray | None, writer_id: str, items: ItemBatch | None, rows: int
    ) -> tuple[Signature | None, np.ndarray | None] | None:
        """What can be checked of a sequence insert before the lock (InvalidArgumentError naming the field): the
        items' signature and priorities, or None without items."""
        seq = self._sequences
        if seq is None:
            if items:
                raise InvalidArgumentError(
                    "items: this shard stores transitions, not sequence items (its max_sequence_length is 0)"
                )
            return None
        if values is not None:
            raise InvalidArgumentError(
                "priorities: the steps of a sequence table carry none; its items carry theirs (items.priorities)"
            )
        if not writer_id:
            raise InvalidArgumentError(
                "writer_id: a sequence table needs one (its items refer to their writer's earlier steps)"
            )
        if not items:
            return None
        return items.checked(rows, seq.max_length, seq.signature if seq.fixed else None)

    def _place_items(
        self,
        items: ItemBatch | None,
        checked: tuple[Signature | None, np.ndarray | None] | None,
        rows: int,
        writer_id: tuple[str, int],
        first_key: int,
    ) -> ItemPlacement | None:
        """Where a sequence insert's items start (lock held; InvalidArgumentError for an item that needs steps
        the shard does not hold, or starts where another does); None for a table of transitions."""
        seq = self._sequences
        if seq is None:
            return None
        if not items:
            return ItemPlacement(None, None, np.empty(0), np.empty(0, dtype=np.int64))
        signature, values = checked
        if seq.fixed and signature != seq.signature:  # the first items raced with these: check them again
            signature, values = items.checked(rows, seq.max_length, seq.signature)
        oldest_after = max(self._ring.oldest_key, first_key + rows - self.config.capacity)
        firsts = seq.first_keys(writer_id, first_key, items, oldest_after)
        seq.check_starts(firsts, (firsts >= self._ring.oldest_key) & (firsts < first_key))
        if values is None:
            values = np.full(len(items), self._max_priority)
        return ItemPlacement(items, signature, values, firsts)

    def _store_items(
        self, writer_id: tuple[str, int], first_key: int, rows: int, placed: ItemPlacement
    ) -> None:
        """Link a stored batch of steps to its writer's earlier ones and store the items it completes (listeners
        hear of the earlier slots this changes: the trajectory's last step, items starting before the batch)."""
        seq = self._sequences
        firsts = np.where(placed.firsts >= self._ring.oldest_key, placed.firsts, -1)  # max_bytes evicted
        last = seq.last_key(writer_id)
        changed = firsts[(firsts >= 0) & (firsts < first_key)].tolist()
        changed += [last] if last is not None and last >= self._ring.oldest_key else []
        for slot in sorted({key % self.config.capacity for key in changed}):
            for listener in self._listeners:
                listener.overwriting(slot, 1)
        seq.link(writer_id, first_key, rows, self._ring.oldest_key)
        stored = 0
        if placed.items is not None:
            if not seq.fixed:
                seq.fix_signature(placed.signature)
            slots = seq.add(firsts, placed.items)
            stored = len(slots)
            if stored:
                values = placed.values[firsts >= 0]
                self._tree.update(slots, values)
                self._max_priority = max(self._max_priority, float(values.max()))
        self._gate.limiter.inserted(stored, self.size)
        self._enforce_max_bytes()

    def _allocate(self, signature: Signature) -> None:
        self._rows = ColumnStorage.allocate(
            signature, self.config.capacity, self.config.max_sample_batch_size
        )
        self._signature = signature

    def _store(
        self,
        columns: Mapping[str, np.ndarray | CompressedColumn],
        values: np.ndarray,
        rows: int,
        writer_id: str,
    ) -> None:
        """Store a checked batch with its raw priorities at the next keys (evicting the oldest rows beyond
        max_bytes)."""
        start = self._ring.next_slot
        for listener in self._listeners:
            listener.overwriting(start, rows)
        lost = None
        if self._sequences is not None:  # the items starting at overwritten steps go with them
            lost = self._sequences.evict((start + np.arange(rows, dtype=np.int64)) % self.config.capacity)
        slots = self._write_rows(start, columns, rows, writers=writer_id)
        self._max_priority = max(self._max_priority, float(values.max()))
        if lost is None:
            self._tree.update(slots, values)
        elif len(lost):  # a step's leaf is 0 unless an item starts there: only the lost items' leaves change
            self._tree.update(lost, np.zeros(len(lost)))
        self._counters.evicted += self._ring.append(rows)
        self._counters.inserted_bytes += rows * self._signature.fixed_row_nbytes + self._rows.frame_bytes_at(
            slots
        )
        self._enforce_max_bytes()
        if self._sequences is None:  # a sequence table counts the items it stores (_store_items)
            self._gate.limiter.inserted(rows, self._ring.size)

    def _write_rows(
        self,
        start: int,
        columns: Mapping[str, np.ndarray | CompressedColumn],
        rows: int,
        offset: int = 0,
        writers: str | np.ndarray | None = None,
    ) -> np.ndarray:
        """The one place rows are written (storage.ColumnStorage.write), so a test can make it fail."""
        return self._rows.write(start, columns, rows, offset, writers)

    @property
    def stored_bytes(self) -> int:
        """Bytes of row data held: the uncompressed fields' bytes plus the held rows' frames (and a sequence
        table's item fields)."""
        items = self._sequences.nbytes if self._sequences is not None else 0
        return self._rows.stored_bytes(self._ring.size) + items if self._signature else 0

    @property
    def size(self) -> int:
        """What is sampled and weighed: rows held, or a sequence table's items held."""
        return self._ring.size if self._sequences is None else self._sequences.items

    def _enforce_max_bytes(self) -> None:
        """Evict the oldest rows until the bytes held are within max_bytes (lock held)."""
        limit = self.config.max_bytes
        excess = 0 if limit is None else self.stored_bytes - limit
        if excess <= 0:
            return
        rows = self._rows.rows_to_evict(self._ring.oldest_slot, self._ring.size, excess)
        if rows <= 0:
            return
        for listener in self._listeners:
            listener.overwriting(self._ring.oldest_slot, rows)
        slots = self._ring.drop_oldest(rows)  # their keys become stale, their frames are released
        if self._sequences is not None:
            self._sequences.evict(slots)
        self._tree.update(slots, np.zeros(rows))
        self._rows.release(slots)
        self._counters.evicted += rows

    # ----------------------------------------------------------------------------------------------- sample
    def sample(self, batch_size: int, *, batch_rows: Sequence[int] = ()) -> SampledBatch:
        """Draw `batch_size` rows (with replacement) by stratified proportional sampling; with `batch_rows`,
        that many batches back to back, each stratified on its own (strata.py), at one instant.

        Below the minimum size (or when the ratio limiter says so) it raises NotReadyError at once.
        """
        if not 1 <= batch_size <= self.config.max_sample_batch_size:
            raise InvalidArgumentError(
                f"batch_size ({batch_size}) must be in [1, {self.config.max_sample_batch_size}]"
            )
        rows = check_batch_rows(batch_rows, batch_size) if batch_rows else ()
        with self._lock:
            self._gate.check_available()
            self._gate.admit_sample()
            total = self._tree.total
            if has_mass(total):
                slots = (
                    self._tree.find_prefix_sum(stratified_targets(rows, total, self._rng))
                    if rows
                    else self._tree.sample(batch_size, self._rng)
                )
            elif self._sequences is not None:  # the zero-mass rule (probabilities.py), over items
                slots = self._sequences.uniform_slots(self._rng, batch_size)
            else:  # the zero-mass rule (probabilities.py): sample uniformly rather than refuse
                slots = self._ring.uniform_slots(self._rng, batch_size)
            keys = self._ring.keys_at(slots)
            sequence = {} if self._sequences is None else self._gather_items(slots, keys)
            columns, writers = self._rows.gather(sequence.pop("step_slots", slots))
            result = SampledBatch(
                keys=keys,
                priorities=self._tree.get(slots),
                columns=columns,
                total_priority=total,
                size=self.size,
                min_priority=self._tree.min,
                incarnation=self.incarnation,
                writers=writers,
                batch_rows=rows,
                **sequence,
            )
            self._counters.sampled += batch_size
            self._gate.limiter.sampled(batch_size)
        return result

    def _gather_items(self, slots: np.ndarray, keys: np.ndarray) -> dict:
        """What a sequence sample adds: its items' step slots (flattened, item-major), lengths and fields."""
        step_slots, lengths = self._sequences.step_slots(slots, keys.astype(np.int64))
        return {
            "step_slots": step_slots.reshape(-1),
            "lengths": lengths.astype(np.int32),
            "item_columns": self._sequences.gather_fields(slots),
            "sequence_length": self.config.max_sequence_length,
        }

    def not_ready_reason(self) -> str:
        """Why a sample or insert would wait now (for error messages)."""
        with self._lock:
            return self._gate.not_ready_reason()

    # ---------------------------------------------------------------------------------------- priorities
    def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray, incarnation: int = 0
    ) -> UpdateResult:
        """Set new raw priorities. Stale and unknown keys are ignored and counted. When a key appears more than
        once, the last value wins (and `applied` counts each entry)."""
        return self.apply_updates([check_update(keys, priorities, incarnation)])[0]

    def apply_updates(self, updates: Sequence[CheckedUpdate]) -> list[UpdateResult]:
        """Apply checked updates (updates.check_update) in order, in one step: one lock, one sum-tree pass (a key
        in several of them gets the last one's priority). Each result counts its own entries; all carry the
        totals after the step."""
        counts: list[tuple[int, int]] = []
        with self._lock:
            self.check_available()
            slots, values = [], []
            for update in updates:
                current = update.incarnation in (0, self.incarnation)
                valid = self._ring.stored(
                    update.keys, None if current else self._aliases.get(update.incarnation, 0)
                )
                if self._sequences is not None:  # a step that begins no item has no priority to set
                    valid &= self._sequences.starts_item(
                        np.where(valid, update.keys, 0) % self.config.capacity
                    )
                applied = int(valid.sum())
                counts.append((applied, len(update.keys) - applied))
                if applied:
                    slots.append(update.keys[valid] % self.config.capacity)
                    values.append(update.values[valid])
            if slots:
                fresh = values[0] if len(values) == 1 else np.concatenate(values)
                self._tree.update(slots[0] if len(slots) == 1 else np.concatenate(slots), fresh)
                self._max_priority = max(self._max_priority, float(fresh.max()))
            self._counters.updated += sum(applied for applied, _ in counts)
            self._counters.stale += sum(stale for _, stale in counts)
            totals = ShardTotals(self._tree.total, self.size, self._tree.min, self.incarnation)
        return [UpdateResult(applied=applied, stale=stale, totals=totals) for applied, stale in counts]

    # ----------------------------------------------------------------------------- listeners, state, loading
    def add_listener(self, listener: TableListener, *, with_image: bool = False) -> None:
        """Tell `listener` of every write from now on (table_state.TableListener), in key order, under the lock.
        With `with_image` it first gets the table's image (`added`) in the same critical section, so it misses no
        write after the image and sees none before it: FailedPreconditionError before the first insert,
        UnavailableError while the table refuses calls."""
        with self._lock:
            if with_image:
                self._gate.check_available()
                listener.added(self._image())
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: TableListener) -> None:
        with self._lock:
            self._listeners = tuple(other for other in self._listeners if other is not listener)

    def state(self) -> TableState:
        """Everything but the rows and leaves, as a checkpoint records it (FailedPreconditionError before the first
        insert)."""
        with self._lock:
            return self._state()

    def _state(self) -> TableState:
        if self._signature is None:
            raise FailedPreconditionError("the table has no signature yet (nothing was ever inserted)")
        return TableState(
            signature=self._signature,
            capacity=self.config.capacity,
            alpha=self.config.alpha,
            next_key=self._ring.next_key,
            size=self._ring.size,
            max_priority=self._max_priority,
            incarnation=self.incarnation,
            aliases=dict(self._aliases),
            writers=tuple(self._writers.items()),
            counters={**self._counters.saved(), **self._sequence_counters()},
            lineage=self.lineage,
            max_sequence_length=self.config.max_sequence_length,
            item_signature=None if self._sequences is None else self._sequences.signature,
            tails=() if self._sequences is None else self._sequences.tails_state(),
        )

    def _sequence_counters(self) -> dict[str, int]:
        """A sequence table's item counters, saved with the others (TableState.counters)."""
        seq = self._sequences
        return {} if seq is None else {"items_inserted": seq.inserted, "items_evicted": seq.evicted}

    def _image(self) -> TableImage:
        state, rows = self._state(), self._rows
        columns = rows.columns if rows.row_writers is None else {**rows.columns, ROW_WRITER: rows.row_writers}
        if self._sequences is not None:
            columns = {**columns, **image_columns(self._sequences)}
        return TableImage(state, self._tree.leaf_values(), columns)

    def load_state(
        self, state: TableState, blocks: Iterable[tuple[int, Mapping[str, np.ndarray], np.ndarray]]
    ) -> int:
        """Load a saved state into this table, which must be empty and refusing calls (`refuse_calls`): `blocks`
        are (first key, columns, leaves p**alpha) in key order covering the state's keys (with compressed fields,
        the columns may hold each row's writer id under ROW_WRITER). Rows keep their keys and priorities; with a
        capacity (or max_bytes) below the saved size the oldest rows are dropped (counted as evicted). The table
        keeps its own, new incarnation; the saved one (and its own aliases) become aliases, so priority updates
        for restored keys still apply. A failed load (a block that does not read, or leaves the tree refuses)
        leaves the table as it was, empty and without a signature unless the config declares one, ready for
        another. Listeners are not told (nothing new is stored). Returns the rows loaded."""
        if self.config.signature is not None and state.signature != self.config.signature:
            raise InvalidArgumentError(
                f"saved signature {state.signature} differs from the table's {self.config.signature}"
            )
        self._check_sequence_state(state)
        cap = self.config.capacity
        keep = min(state.size, cap)
        with self._lock:
            if self._ring.next_key or self._gate.unavailable is None:
                raise FailedPreconditionError(
                    "restore needs an empty table that refuses calls (refuse_calls)"
                )
            if self._signature != state.signature:
                self._allocate(state.signature)
        lowest = state.next_key - keep
        if self._sequences is not None:  # its per-slot columns are loaded as the rows are
            blocks = self._loading_sequences(blocks, lowest, state)
        try:  # calls are refused: nothing else writes meanwhile
            leaves = self._rows.load_blocks(blocks, lowest_key=lowest)
            if self._sequences is not None:  # only an item's first step has a leaf (what _store relies on)
                leaves[self._sequences.item_length == 0] = 0.0
            with self._lock:
                self._tree.load_leaves(leaves)
        except BaseException:
            with self._lock:  # forget what was written: no frames held, the signature it had before
                if self.config.signature is None:
                    self._rows, self._signature = None, None
                else:
                    self._rows.release_all()
                self._sequences = self._empty_sequences()
            raise
        with self._lock:
            self._ring = KeyRing(cap, state.next_key, keep)
            self._max_priority = state.max_priority
            self.lineage = state.lineage or self.lineage
            self._writers = WriterSequences(self.config.max_tracked_writers, state.writers)
            self._counters = TableCounters.from_saved(state.counters)
            self._counters.evicted += state.size - keep
            if self._sequences is not None:
                self._sequences.load_tails(state.tails)
                self._sequences.inserted = state.counters.get("items_inserted", 0)
                self._sequences.evicted = state.counters.get("items_evicted", 0)
            aliases = dict(state.aliases)
            if state.incarnation:
                aliases[state.incarnation] = state.next_key
            self._aliases = dict(list(aliases.items())[-MAX_ALIASES:])
            self._enforce_max_bytes()
            return self._ring.size

    def insert_at(
        self,
        first_key: int,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray,
        writer_id: str,
        sequence: int,
        incarnation: int,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> bool:
        """Store a batch at the keys it had (read back from a log, raw priorities; in a sequence table with its
        items and trajectory); a batch below the next key is already held and skipped (False), one above it is a
        gap (FailedPreconditionError). The incarnation that wrote it becomes an alias up to the batch's last key:
        those keys name the same rows here. Listeners hear of the rows it overwrites, not of the batch (it is not
        new)."""
        signature = self._signature or Signature.from_batch(columns)
        rows = signature.check_batch(columns)
        checked_items = (
            None if self._sequences is None else self._check_sequence_insert(None, writer_id, items, rows)
        )
        with self._lock:
            if first_key + rows <= self._ring.next_key:
                return False
            if self._signature is None:
                self._allocate(signature)
            if first_key != self._ring.next_key:
                raise FailedPreconditionError(
                    f"log batch at key {first_key} does not follow key {self._ring.next_key}"
                )
            placed = self._place_items(items, checked_items, rows, (writer_id, trajectory), first_key)
            self._store(columns, check_priorities(priorities, rows), rows, writer_id)
            if placed is not None:
                self._store_items((writer_id, trajectory), first_key, rows, placed)
            self._writers.remember(writer_id, sequence)
            if incarnation and incarnation != self.incarnation:
                self._aliases[incarnation] = max(self._aliases.get(incarnation, 0), self._ring.next_key)
                self._aliases = dict(list(self._aliases.items())[-MAX_ALIASES:])
            return True

    def _empty_sequences(self) -> SequenceIndex | None:
        if not self.config.max_sequence_length:
            return None
        index = SequenceIndex(
            self.config.capacity, self.config.max_sequence_length, self.config.max_tracked_writers
        )
        if self.config.item_signature is not None:
            index.fix_signature(self.config.item_signature)
        return index

    def _check_sequence_state(self, state: TableState) -> None:
        """InvalidArgumentError when a saved state cannot be loaded as this table's kind; adopts its item fields."""
        mine = self.config.max_sequence_length
        if bool(state.max_sequence_length) != bool(mine) or state.max_sequence_length > mine:
            raise InvalidArgumentError(
                f"saved table has max_sequence_length {state.max_sequence_length}, this shard {mine} (a "
                f"sequence table restores into a sequence table at least as long)"
            )
        seq = self._sequences
        if seq is None or not state.max_sequence_length:
            return
        if seq.fixed and seq.signature != state.item_signature and state.item_signature is not None:
            raise InvalidArgumentError(
                f"saved item signature {state.item_signature} differs from the table's {seq.signature}"
            )
        if not seq.fixed and (state.item_signature is not None or state.size):
            seq.fix_signature(state.item_signature)

    def _loading_sequences(self, blocks, lowest: int, state: TableState):
        """`blocks`, loading each one's sequence columns into the index as it passes."""
        cap = self.config.capacity
        for first_key, columns, leaves in blocks:
            skip = max(0, lowest - first_key)
            rows = len(leaves) - skip
            if rows > 0:
                slots = (first_key + skip + np.arange(rows, dtype=np.int64)) % cap
                load_block(self._sequences, slots, columns, skip)
            yield first_key, columns, leaves

    def refuse_calls(self, reason: str | None) -> None:
        """Make inserts, samples and priority updates raise UnavailableError(reason) (while a checkpoint is being
        restored), or serve them again with None. Info keeps answering. The rate limiter starts afresh when calls
        are served again: rows restored or replayed from the log earn no samples."""
        with self._lock:
            self._gate.refuse(reason)

    def check_available(self) -> None:
        """UnavailableError while the table refuses calls (see refuse_calls)."""
        self._gate.check_available()

    # ---------------------------------------------------------------------------------------------- misc
    @property
    def _storage(self) -> dict[str, np.ndarray]:
        """The stored columns, per field by slot (white-box tests read them)."""
        return self._rows.columns if self._rows is not None else {}

    @property
    def _row_writers(self) -> np.ndarray | None:
        """Each slot's writer id, with compressed fields (white-box tests read them)."""
        return self._rows.row_writers if self._rows is not None else None

    @property
    def signature(self) -> Signature | None:
        return self._signature

    @property
    def next_key(self) -> int:
        """The key the next stored row gets (InfoResponse.inserted_total)."""
        return self._ring.next_key

    def info(self) -> ShardInfo:
        with self._lock:
            seq = self._sequences
            return ShardInfo(
                signature=self._signature,
                capacity=self.config.capacity,
                size=self.size,
                total_priority=self._tree.total,
                min_priority=self._tree.min,
                max_priority=self._max_priority,
                alpha=self.config.alpha,
                incarnation=self.incarnation,
                inserted_total=self._ring.next_key,
                evicted_total=self._counters.evicted,
                sampled_total=self._counters.sampled,
                updated_total=self._counters.updated,
                stale_updates_total=self._counters.stale,
                duplicate_batches_total=self._counters.duplicates,
                inserted_bytes_total=self._counters.inserted_bytes,
                stored_bytes=self.stored_bytes,
                max_bytes=self.config.max_bytes or 0,
                min_size_to_sample=self.config.min_size_to_sample,
                samples_per_insert=self.config.samples_per_insert,
                max_sample_batch_size=self.config.max_sample_batch_size,
                max_sequence_length=self.config.max_sequence_length,
                item_signature=None if seq is None else seq.signature,
                steps=self._ring.size if seq is not None else 0,
                items_inserted_total=0 if seq is None else seq.inserted,
                items_evicted_total=0 if seq is None else seq.evicted,
            )

    def blocked_seconds(self) -> dict[str, float]:
        """Seconds during which inserts ("insert") and samples ("sample") were held back by the rate limiter or,
        for samples, the minimum size (see BlockedTime)."""
        with self._lock:
            return {what: clock.total for what, clock in self._gate.blocked.items()}

    def close(self) -> None:
        """Answer every later insert, sample and update with UnavailableError (the server is shutting down)."""
        with self._lock:
            self._gate.closed = True

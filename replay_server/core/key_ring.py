"""The ring's keys: which key each slot holds, which keys are still stored, and where the next rows go.

Keys are insertion indices (0, 1, 2, ...). With FIFO eviction the row with key k lives in slot k % capacity and
is still stored while `next_key - size <= k < next_key`; a key outside that range is stale (its row was evicted
and the slot now holds a newer row) or unknown. This is the generation scheme of ARCHITECTURE §2 with
generation = k // capacity folded into one integer. Pure (numpy only) and not thread-safe: the table's lock
guards it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KeyRing:
    """The key range a ring of `capacity` slots holds: `size` rows ending just below `next_key`."""

    capacity: int
    next_key: int = 0
    size: int = 0

    @property
    def oldest_key(self) -> int:
        return self.next_key - self.size

    @property
    def oldest_slot(self) -> int:
        return self.oldest_key % self.capacity

    @property
    def next_slot(self) -> int:
        """The slot the next stored row goes to."""
        return self.next_key % self.capacity

    def append(self, rows: int) -> int:
        """Take `rows` new keys; returns how many of the oldest rows they pushed out of a full ring."""
        overflow = max(0, self.size + rows - self.capacity)
        self.size = min(self.capacity, self.size + rows)
        self.next_key += rows
        return overflow

    def drop_oldest(self, rows: int) -> np.ndarray:
        """Forget the `rows` oldest keys (their rows were evicted early); returns the slots they held."""
        slots = (self.oldest_slot + np.arange(rows, dtype=np.int64)) % self.capacity
        self.size -= rows
        return slots

    def keys_at(self, slots: np.ndarray) -> np.ndarray:
        """The key each stored slot holds now (slots of stored rows only)."""
        newest = self.next_key - 1
        return (newest - (newest - slots) % self.capacity).astype(np.uint64)

    def stored(self, keys: np.ndarray, limit: int | None = None) -> np.ndarray:
        """Which keys name a stored row; `limit` (an earlier incarnation's last key + 1) caps the range."""
        upper = self.next_key if limit is None else limit
        return (keys >= self.oldest_key) & (keys < upper)

    def uniform_slots(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` slots of stored rows drawn uniformly with replacement."""
        return (self.oldest_slot + rng.integers(0, self.size, count)) % self.capacity

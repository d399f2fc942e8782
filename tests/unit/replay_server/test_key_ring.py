"""The ring's key arithmetic (replay_server/core/key_ring.py) and the counters a checkpoint saves (table_counters.py)."""

from __future__ import annotations

import numpy as np

from apexrl.replay_server.core.key_ring import KeyRing
from apexrl.replay_server.core.table_counters import TableCounters


def test_keys_map_to_slots_and_back_after_the_ring_wraps():
    ring = KeyRing(capacity=8)
    assert ring.append(5) == 0
    assert ring.append(6) == 3  # 11 keys in 8 slots: keys 0..2 pushed out
    assert (ring.oldest_key, ring.next_key, ring.size, ring.next_slot) == (3, 11, 8, 3)
    slots = np.arange(8)
    keys = ring.keys_at(slots)
    np.testing.assert_array_equal(keys % 8, slots)
    assert sorted(keys.tolist()) == list(range(3, 11))


def test_stored_keys_exclude_evicted_unknown_and_beyond_an_alias_limit():
    ring = KeyRing(capacity=4, next_key=10, size=4)  # keys 6..9 stored
    keys = np.array([5, 6, 9, 10, 12], dtype=np.uint64)
    np.testing.assert_array_equal(ring.stored(keys), [False, True, True, False, False])
    np.testing.assert_array_equal(ring.stored(keys, limit=8), [False, True, False, False, False])


def test_dropping_the_oldest_returns_their_slots_in_key_order():
    ring = KeyRing(capacity=4, next_key=10, size=4)
    np.testing.assert_array_equal(ring.drop_oldest(3), [2, 3, 0])  # keys 6, 7, 8
    assert (ring.oldest_key, ring.size) == (9, 1)
    rng = np.random.default_rng(0)
    assert set(ring.uniform_slots(rng, 50).tolist()) == {1}


def test_counters_read_back_what_they_saved_and_default_missing_names_to_zero():
    counters = TableCounters(evicted=3, sampled=5, updated=7, stale=1, duplicates=2, inserted_bytes=99)
    assert TableCounters.from_saved(counters.saved()) == counters
    assert TableCounters.from_saved({"sampled": 4}) == TableCounters(sampled=4)

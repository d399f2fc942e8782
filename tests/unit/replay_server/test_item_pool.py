"""The item pool (replay_server/core/item_pool.py): rows reused once freed, blocks allocated only as needed."""

from __future__ import annotations

import numpy as np

from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_pool import BLOCK_BYTES, ItemPool


def test_rows_round_trip_and_freed_rows_are_reused() -> None:
    pool = ItemPool(Signature.parse("state:float32[2,4],version:int64[]"))
    values = {"state": np.arange(24, dtype=np.float32).reshape(3, 2, 4), "version": np.array([7, 8, 9])}
    rows = pool.put(values, np.array([0, 2]))
    got = pool.get(rows)
    np.testing.assert_array_equal(got["state"], values["state"][[0, 2]])
    np.testing.assert_array_equal(got["version"], [7, 9])
    assert pool.used == 2 and pool.nbytes == 2 * (32 + 8)
    pool.release(rows[:1])
    again = pool.put(values, np.array([1]))
    assert again.tolist() == rows[:1].tolist()  # the freed row, not a new one
    np.testing.assert_array_equal(pool.get(again)["version"], [8])


def test_blocks_grow_as_items_arrive_and_gather_across_them() -> None:
    signature = Signature.parse("state:float32[2,512]")
    pool = ItemPool(signature)
    per_block = BLOCK_BYTES // signature.row_nbytes
    count = 3 * per_block + 1
    states = np.random.default_rng(0).normal(size=(count, 2, 512)).astype(np.float32)
    rows = pool.put({"state": states}, np.arange(count))
    assert len(pool._blocks) == 4  # white box: one block beyond three full ones
    order = np.random.default_rng(1).permutation(count)
    np.testing.assert_array_equal(pool.get(rows[order])["state"], states[order])

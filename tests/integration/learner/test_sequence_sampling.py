"""Cross-shard sampling of sequence items (R2D2) against 3 real shards on 127.0.0.1: each item is drawn with
probability p_i / sum(p) over the whole fleet and weighted by the PER formula, exactly as transitions are, and
comes with its own steps, length and fields whichever shard it lives on."""

from __future__ import annotations

import numpy as np
from scipy import stats

from apexrl.common.signature import Signature
from apexrl.learner import ShardedReplayClient
from apexrl.replay_server import ReplayClient
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import TableConfig

WINDOW = 4
ITEMS_PER_SHARD = 6


def _fill(shard, s: int) -> dict[int, tuple[float, int]]:
    """Shard s: one trajectory of steps numbered 1000 * s + t; an item every 2 steps (window 4, the last one cut
    to 3 steps) with priority (i + 1) * (s + 1). Returns item id (its first step number) -> (priority, length)."""
    items = {}
    steps = 2 * ITEMS_PER_SHARD + 1
    numbers = 1000 * s + np.arange(steps)
    with ReplayClient(shard.address) as client:
        for i in range(ITEMS_PER_SHARD):
            start = 2 * i
            length = min(WINDOW, steps - start)
            rows = np.arange(start if i == 0 else start + 2, start + length)
            first_row = start if i == 0 else start + 2
            batch = {
                "obs": numbers[rows].astype(np.float32)[:, None],
                "reward": np.zeros(len(rows), np.float32),
            }
            priority = float((i + 1) * (s + 1))
            item = ItemBatch(
                ends=np.array([start + length - first_row]),
                lengths=np.array([length]),
                columns={"state": np.array([[numbers[start]]], np.float32)},
                priorities=np.array([priority]),
            )
            client.insert(batch, items=item)
            items[int(numbers[start])] = (priority, length)
        client.flush()
    return items


def test_items_are_drawn_by_fleet_priority_with_per_weights(make_shard) -> None:
    config = TableConfig(
        capacity=1000,
        max_sequence_length=WINDOW,
        signature=Signature.parse("obs:float32[1],reward:float32[]"),
        alpha=1.0,
        seed=3,
    )
    shards = [make_shard(config) for _ in range(3)]
    items: dict[int, tuple[float, int]] = {}
    for s, shard in enumerate(shards):
        items.update(_fill(shard, s))
    assert [shard.table.info().size for shard in shards] == [ITEMS_PER_SHARD] * 3
    ids = sorted(items)
    p = np.array([items[i][0] for i in ids])
    total, n, beta = p.sum(), len(ids), 0.5
    counts = dict.fromkeys(ids, 0)
    with ShardedReplayClient([shard.address for shard in shards], seed=5) as sampler:
        for _ in range(150):
            batch = sampler.sample(128, beta=beta)
            assert batch.sequence_length == WINDOW
            obs = batch.columns["obs"].reshape(128, WINDOW)
            firsts = obs[:, 0].astype(int)
            np.testing.assert_array_equal(batch.item_columns["state"][:, 0], firsts)
            for row, first, length in zip(obs, firsts, batch.lengths, strict=True):
                assert length == items[first][1]
                np.testing.assert_array_equal(row[:length], first + np.arange(length))
                counts[first] += 1
            want_p = np.array([items[f][0] for f in firsts]) / total
            np.testing.assert_allclose(batch.probabilities, want_p, rtol=1e-12)
            want_w = (n * want_p) ** -beta / (n * p.min() / total) ** -beta
            np.testing.assert_allclose(batch.weights, want_w, rtol=1e-6)
            assert batch.fleet_size == n
    observed = np.array([counts[i] for i in ids])
    # 19,200 draws over 18 items; a sampler that ignored the shards' totals would give shard 0 a third of them.
    assert stats.chisquare(observed, observed.sum() * p / total).pvalue > 1e-3

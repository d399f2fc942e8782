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


def test_the_prefetcher_hands_the_learner_whole_decompressed_sequences(make_shard) -> None:
    """Compressed pixel steps are decompressed and laid out [B, T, ...] beside each item's length and fields; an
    item with a frame that does not decompress is never trained on (its priority goes to 0, another item takes its
    place)."""
    from apexrl.common.compression import compress
    from apexrl.learner.prefetch import Prefetcher
    from apexrl.replay_server import ShardedWriter
    from apexrl.replay_server.client.sequence_writer import SequenceWriter
    from tests.conftest import frame_ids, pixel_frames

    pixels = Signature.parse("obs:uint8[2,16,16]@zstd,reward:float32[]")
    shard = make_shard(TableConfig(capacity=1000, max_sequence_length=4, signature=pixels, seed=0))
    with ShardedWriter(shard.address) as sharded:
        writer = SequenceWriter(sharded, length=4, period=2)
        for t in range(11):
            frame = compress(pixel_frames([t]), "zstd")
            if t == 9:  # a frame that is not zstd's: its item (steps 8..10) must never reach the learner
                frame = type(frame)(
                    frame.compression, frame.dtype, frame.shape, b"\x28\xb5\x2f\xfdgarbage", np.array([11])
                )
            writer.append({"obs": frame, "reward": np.float32(t)}, {"state": np.array([t], np.float32)})
        writer.end_episode()
        sharded.flush()
    with ShardedReplayClient([shard.address], seed=1) as sampler:
        prefetcher = Prefetcher(sampler, 16, lambda: 0.5, depth=2).start()
        try:
            batches = [prefetcher.get(timeout=30) for _ in range(3)]
        finally:
            prefetcher.stop()
    for batch in batches:
        assert batch is not None
        obs = batch.columns["obs"]
        assert obs.shape == (16, 4, 2, 16, 16) and obs.dtype == np.uint8
        assert batch.columns["lengths"].shape == (16,) and batch.columns["state"].shape == (16, 1)
        ids = frame_ids(obs.reshape(-1, 2, 16, 16)).reshape(16, 4)
        for row, length, state in zip(
            ids, batch.columns["lengths"], batch.columns["state"][:, 0], strict=True
        ):
            np.testing.assert_array_equal(row[:length], state + np.arange(length))
            assert 9 not in row[:length]

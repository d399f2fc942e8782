"""ShardedReplayClient.sample_batches against 3 real shard processes: several batches drawn in one Sample call
per shard, each with its own allocation over the shards, keep P(i) = p_i / sum(p) exactly, the PER weights, and
fleet-wide frequencies (chi-square per batch position); a shard's rows above its largest Sample are split."""

from __future__ import annotations

import numpy as np
from scipy import stats

from apexrl.learner import ShardedReplayClient
from tests.integration.learner.test_sharded_client import _fill


def test_several_batches_per_call_keep_fleet_probabilities_and_weights(shard_processes):
    shards = shard_processes(3, "--alpha", "1.0", "--seed", "7")
    priorities = _fill(shards)
    ids = sorted(priorities)
    p = np.array([priorities[i] for i in ids])
    expected = p / p.sum()
    n, beta, batches = len(ids), 0.5, 4
    counts = np.zeros((batches, n))
    position = {row: j for j, row in enumerate(ids)}
    with ShardedReplayClient([s.address for s in shards], seed=11) as sampler:
        before = [sampler.shards[s].info().sampled_total for s in range(3)]
        for _ in range(50):
            drawn = sampler.sample_batches(256, batches, beta=beta)
            assert [len(b.keys) for b in drawn] == [256] * batches
            for b, batch in enumerate(drawn):
                rows = batch.columns["action"]
                want_p = np.array([priorities[int(r)] for r in rows]) / p.sum()
                np.testing.assert_allclose(batch.probabilities, want_p, rtol=1e-12)
                want_w = (n * want_p) ** -beta / (n * expected.min()) ** -beta
                np.testing.assert_allclose(batch.weights, want_w, rtol=1e-6)
                assert batch.fleet_size == n
                np.testing.assert_array_equal(rows, 100 * batch.shard_ids + batch.keys.astype(np.int64))
                np.add.at(counts[b], [position[int(r)] for r in rows], 1)
        after = [sampler.shards[s].info().sampled_total for s in range(3)]
    assert sum(after) - sum(before) == 50 * batches * 256
    for b in range(batches):
        _, p_value = stats.chisquare(counts[b], counts[b].sum() * expected)
        assert p_value > 1e-3, (b, counts[b])


def test_rows_above_a_shards_largest_sample_are_split_across_calls(shard_processes):
    shards = shard_processes(1, "--alpha", "1.0", "--max-sample-batch-size", "100")
    priorities = _fill(shards)
    with ShardedReplayClient([s.address for s in shards], seed=2) as sampler:
        drawn = sampler.sample_batches(
            70, 3
        )  # 210 rows: calls of 100, 100 and 10 rows, batches cut across them
    assert [len(b.keys) for b in drawn] == [70] * 3
    for batch in drawn:
        assert set(batch.columns["action"].tolist()) <= set(priorities)

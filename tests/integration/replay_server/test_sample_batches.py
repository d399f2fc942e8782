"""Several batches per Sample answer (replay.proto, SampleRequest.batch_rows) on a real in-process shard: the
layout, each batch stratified on its own and drawn in proportion to priority, batches independent of each other,
the limits, and both directions of compatibility (an old client's one-batch call; a new client against a shard
that ignores the field, which the sharded client cuts at random)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from scipy import stats

from apexrl.actor import ReplayClient
from apexrl.common.errors import InvalidArgumentError
from apexrl.learner import ShardedReplayClient
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.core.table import TableConfig
from apexrl.replay_server.server.service import ReplayServicer
from tests.conftest import cartpole_batch

ROWS = 10
PRIORITIES = np.arange(1, ROWS + 1, dtype=np.float64)  # alpha 1: row i is drawn with probability p_i / 55


@pytest.fixture
def filled(make_shard):
    """Keys 0..9 (action = key) with raw priorities 1..10, alpha 1, a seeded table: every figure is fixed."""
    shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=3))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(ROWS), priorities=PRIORITIES)
        client.flush()
    return shard


def in_stratum(keys: np.ndarray, rows: int) -> bool:
    """True when draw j of a batch of `rows` lies in stratum j: the key's mass [C(k-1), C(k)) meets
    [j, j + 1) * total / rows."""
    upper = np.cumsum(PRIORITIES)
    lower = upper - PRIORITIES
    width = upper[-1] / rows
    j = np.arange(rows)
    return bool(np.all((lower[keys] < (j + 1) * width) & (upper[keys] > j * width)))


def test_batches_come_back_to_back_each_stratified_on_its_own(filled):
    with ReplayClient(filled.address) as client:
        for _ in range(50):
            sample = client.sample(12, batch_rows=[5, 7])
            assert sample.batch_rows == (5, 7)
            assert sample.keys.shape == (12,) and sample.priorities.shape == (12,)
            keys = sample.keys.astype(np.int64)
            np.testing.assert_array_equal(sample.columns["action"], keys)  # row i is the row of keys[i]
            np.testing.assert_array_equal(sample.priorities, PRIORITIES[keys])
            assert in_stratum(keys[:5], 5) and in_stratum(keys[5:], 7)
            assert sample.total_priority == pytest.approx(PRIORITIES.sum())
    assert filled.table.info().sampled_total == 50 * 12


def test_each_batch_is_drawn_in_proportion_to_priority(filled):
    counts = np.zeros((3, ROWS))
    with ReplayClient(filled.address) as client:
        for _ in range(400):
            sample = client.sample(9, batch_rows=[2, 3, 4])
            for b, (lo, hi) in enumerate(((0, 2), (2, 5), (5, 9))):
                np.add.at(counts[b], sample.keys[lo:hi].astype(np.int64), 1)
    for b in range(3):
        expected = PRIORITIES / PRIORITIES.sum() * counts[b].sum()
        assert stats.chisquare(counts[b], expected).pvalue > 1e-3, (b, counts[b])


def test_batches_are_independent_of_each_other(filled):
    """Two batches of one row each: the pair is distributed as p_i * p_j. One stratified batch of two rows (what
    an older shard draws) would put the first in the lower half of the mass and the second in the upper half."""
    joint = np.zeros((ROWS, ROWS))
    with ReplayClient(filled.address) as client:
        for _ in range(1500):
            first, second = client.sample(2, batch_rows=[1, 1]).keys.astype(np.int64)
            joint[first, second] += 1
    p = PRIORITIES / PRIORITIES.sum()
    # Pool into 3 mass classes per side so every expected cell is large enough for chi-square.
    classes = np.digitize(np.arange(ROWS), [5, 8])  # rows 0-4, 5-7, 8-9
    pooled = np.zeros((3, 3))
    want = np.zeros((3, 3))
    for i in range(ROWS):
        for j in range(ROWS):
            pooled[classes[i], classes[j]] += joint[i, j]
            want[classes[i], classes[j]] += p[i] * p[j] * joint.sum()
    assert stats.chisquare(pooled.ravel(), want.ravel()).pvalue > 1e-3, pooled


@pytest.mark.parametrize(
    ("size", "rows", "message"),
    [
        (12, [5, 0, 7], r"batch_rows\[1\] is 0; each batch needs >= 1 row"),
        (12, [5, 6], r"batch_rows \(2 batches\) sum to 11, not to batch_size \(12\)"),
        (4097, [4096, 1], r"batch_size \(4097\) must be in \[1, 4096\]"),
        (0, [1], r"batch_size \(0\) must be in \[1, 4096\]"),
    ],
)
def test_bad_batch_rows_are_refused_before_anything_is_drawn(filled, size, rows, message):
    with ReplayClient(filled.address) as client, pytest.raises(InvalidArgumentError, match=message):
        client.sample(size, batch_rows=rows)
    assert filled.table.info().sampled_total == 0


def test_an_old_client_gets_one_batch_and_no_batch_rows(filled):
    """A request without the field (every client before it) is answered exactly as before."""
    with grpc.insecure_channel(filled.address) as channel:
        response = replay_pb2_grpc.ReplayServiceStub(channel).Sample(replay_pb2.SampleRequest(batch_size=6))
    assert len(response.batch_rows) == 0 and response.keys.shape == [6]


@pytest.fixture
def old_shards(make_shard, monkeypatch):
    """Shards that behave as before the field: they drop SampleRequest.batch_rows, so a request for several
    batches gets one stratified batch of batch_size rows and an answer without batch_rows."""
    sample = ReplayServicer.Sample

    async def old_sample(self, request, context):
        return await sample(self, replay_pb2.SampleRequest(batch_size=request.batch_size), context)

    monkeypatch.setattr(ReplayServicer, "Sample", old_sample)
    shards = []
    for s in range(2):
        shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=s))
        with ReplayClient(shard.address) as client:
            client.insert(cartpole_batch(ROWS, 100 * s), priorities=PRIORITIES * (s + 1))
            client.flush()
        shards.append(shard)
    return shards


def test_a_new_client_cuts_an_old_shards_single_batch_at_random(old_shards):
    with ReplayClient(old_shards[0].address) as client:
        assert client.sample(6, batch_rows=[3, 3]).batch_rows == ()  # the old shard's answer
    fleet = np.concatenate([PRIORITIES, 2 * PRIORITIES])
    ids = np.concatenate([np.arange(ROWS), 100 + np.arange(ROWS)])
    counts = dict.fromkeys(ids.tolist(), 0)
    with ShardedReplayClient([s.address for s in old_shards], seed=5) as sampler:
        for _ in range(60):
            batches = sampler.sample_batches(32, 4, beta=0.5)
            assert [len(b.keys) for b in batches] == [32] * 4
            for batch in batches:
                rows = batch.columns["action"]
                want = fleet[np.searchsorted(ids, rows)] / fleet.sum()
                np.testing.assert_allclose(batch.probabilities, want, rtol=1e-12)
                for row in rows.tolist():
                    counts[row] += 1
    observed = np.array([counts[i] for i in ids.tolist()])
    assert stats.chisquare(observed, fleet / fleet.sum() * observed.sum()).pvalue > 1e-3

"""The importance weights the learner receives on its default data path (the sampler process writing batches into
shared memory, learner/sampler_process.py) are PER's: w_i = (N * P(i))^-beta / max_j w_j, computed here
independently from the priorities the test stored. With P(i) = p_i^alpha / sum_k p_k^alpha and the maximum at the
fleet's smallest priority, that is w_i = (p_i / p_min)^(-alpha * beta): unequal priorities, spread over two shards
with the fleet's smallest on one of them, so a weight of 1 everywhere (or a normaliser taken per shard) shows."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.learner.config import LearnerConfig
from apexrl.learner.learner import make_sampler
from apexrl.learner.sampler_process import SamplerProcess
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch

ALPHA, BETA = 0.7, 0.5
IDS = (np.arange(0, 200), np.arange(1000, 1200))  # the `action` ids of each shard's rows


def priority_of(ids: np.ndarray) -> np.ndarray:
    """Each row's raw priority, from its id: 1..19 on the first shard, 0.2..18.2 on the second."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.where(ids < 1000, 1.0 + ids % 19, 0.2 + 3.0 * (ids % 7))


@pytest.mark.timeout(90)
def test_the_sampler_process_hands_the_learner_per_importance_weights(make_shard):
    shards = []
    for i, ids in enumerate(IDS):
        shard = make_shard(TableConfig(capacity=1000, alpha=ALPHA, seed=i))
        with ReplayClient(shard.address) as client:
            client.insert(cartpole_batch(len(ids), start=int(ids[0])), priorities=priority_of(ids))
            client.flush(timeout=10)
        shards.append(shard)
    p_min = min(priority_of(ids).min() for ids in IDS)
    config = LearnerConfig(
        replay=tuple(s.address for s in shards), batch_size=64, seed=0, min_replay_size=1, prefetch_depth=2
    )
    feed = make_sampler(config)
    assert isinstance(feed, SamplerProcess), "the default data path is the sampler process"
    feed.start(lambda: BETA)
    try:
        for _ in range(3):
            batch = feed.get(timeout=30)
            assert batch is not None, "no batch within 30 s"
            assert batch.fleet_size == 400
            expected = (priority_of(batch.columns["action"]) / p_min) ** (-ALPHA * BETA)
            np.testing.assert_allclose(
                batch.weights,
                expected,
                rtol=1e-5,
                err_msg="the weights in the shared slot are not (p_i / p_min)^(-alpha * beta)",
            )
            assert batch.weights.min() < 0.9  # weights of 1 would not pass
    finally:
        feed.close()

"""Several writer processes, a sampler and a priority updater hit one shard process at once: nothing is lost,
nothing is stored twice."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np

from apexrl.actor import ReplayClient
from apexrl.common.errors import ApexError, DeadlineExceededError
from tests.conftest import cartpole_batch

WRITERS, BATCHES, ROWS, CAPACITY = 3, 150, 32, 5000


def _writer(address: str, writer: int) -> None:
    with ReplayClient(address, timeout=60) as client:
        for b in range(BATCHES):
            # action = writer * 1e6 + row number: identifies every row in the fleet
            client.insert(cartpole_batch(ROWS, writer * 1_000_000 + b * ROWS))
        client.flush(timeout=60)


def test_concurrent_writers_sampler_and_updater_lose_nothing(shard_processes):
    (shard,) = shard_processes(1, "--capacity", str(CAPACITY), "--alpha", "0.7")
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(shard.address, w)) for w in range(WRITERS)]
    for w in writers:
        w.start()

    stop = threading.Event()
    counts = {"sampled": 0, "applied": 0, "stale": 0}
    errors: list[ApexError] = []

    def sample_and_update() -> None:
        rng = np.random.default_rng(0)
        with ReplayClient(shard.address, timeout=30) as client:
            while not stop.is_set():
                try:
                    batch = client.sample(64, timeout=5)
                except DeadlineExceededError:
                    continue  # not ready yet: the writer processes are still starting (a loaded machine)
                except ApexError as err:
                    errors.append(err)
                    return
                try:
                    result = client.update_priorities(
                        batch.keys, rng.uniform(0.1, 2.0, len(batch.keys)), incarnation=batch.incarnation
                    )
                except ApexError as err:
                    errors.append(err)
                    return
                counts["sampled"] += len(batch.keys)
                counts["applied"] += result.applied
                counts["stale"] += result.stale

    learner = threading.Thread(target=sample_and_update)
    learner.start()
    for w in writers:
        w.join(120)
    stop.set()
    learner.join(30)
    assert [w.exitcode for w in writers] == [0] * WRITERS
    assert not errors

    with ReplayClient(shard.address) as client:
        info = client.info()
        sent = WRITERS * BATCHES * ROWS
        assert info.inserted_total == sent  # nothing lost, nothing stored twice
        assert info.size + info.evicted_total == sent  # inserted = stored + evicted
        assert info.size == CAPACITY and info.duplicate_batches_total == 0
        assert info.sampled_total == counts["sampled"] > 0
        assert info.updated_total == counts["applied"] and info.stale_updates_total == counts["stale"]
        # The rows held are distinct rows the writers sent.
        ids = client.sample(4096).columns["action"]
    writer_ids, row_ids = np.divmod(ids, 1_000_000)
    assert set(writer_ids) <= set(range(WRITERS)) and row_ids.max() < BATCHES * ROWS
    assert shard.stop() == 0

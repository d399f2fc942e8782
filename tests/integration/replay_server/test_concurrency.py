"""Several writer processes, a sampler and a priority updater hit one shard process at once: nothing is lost,
nothing is stored twice."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np

from apexrl.actor import ReplayClient
from apexrl.common.errors import ApexError, DeadlineExceededError, UnavailableError
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
    transient: list[ApexError] = []

    def sample_and_update() -> None:
        """The learner's loop: UNAVAILABLE and DEADLINE_EXCEEDED (not ready yet, a connect attempt that timed out
        on a loaded machine) are retried, as the learner's sampler retries them (learner/sharded_client.py); any
        other failure is a bug."""
        rng = np.random.default_rng(0)

        def retried(call):
            while not stop.is_set():
                try:
                    return call()
                except ApexError as err:
                    if not isinstance(err, (UnavailableError, DeadlineExceededError)):
                        errors.append(err)
                        return None
                    transient.append(err)
                    stop.wait(0.05)
            return None

        with ReplayClient(shard.address, timeout=30) as client:
            while not errors and (batch := retried(lambda: client.sample(64, timeout=5))) is not None:
                counts["sampled"] += len(batch.keys)
                priorities = rng.uniform(0.1, 2.0, len(batch.keys))
                result = retried(
                    lambda b=batch, p=priorities: client.update_priorities(
                        b.keys, p, incarnation=b.incarnation
                    )
                )
                if result is None:
                    return
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
    assert len(transient) < 1000, transient[-3:]  # retried, but not a shard that never answers

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

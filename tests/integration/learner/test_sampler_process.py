"""The learner's sampler process against real in-process shards: batches arrive in shared memory with the rows the
shards hold, priorities go back to the owning shards, a batch stays intact until the next get, and a dead child
is an error in the train loop, never a silent stall."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from apexrl.learner.config import LearnerConfig
from apexrl.learner.sampler_process import SamplerProcess
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, wait_until


def filled_shards(make_shard, rows_each: int = 200) -> list:
    shards = [make_shard(TableConfig(capacity=1000, seed=i)) for i in range(2)]
    for i, shard in enumerate(shards):
        with ReplayClient(shard.address) as client:
            client.insert(cartpole_batch(rows_each, start=i * 1000), priorities=np.ones(rows_each))
            client.flush(timeout=10)
    return shards


def sampler_for(shards, **changes) -> SamplerProcess:
    config = LearnerConfig(
        replay=tuple(s.address for s in shards),
        batch_size=32,
        seed=0,
        min_replay_size=1,
        prefetch_depth=2,
        sample_batches_per_call=2,
        **changes,
    )
    return SamplerProcess(
        config, slots=config.prefetch_depth + 1, batches_per_call=config.sample_batches_per_call
    )


SHM = "/dev/shm/apexrl-sampler-"


@pytest.mark.timeout(60)
def test_batches_come_from_the_shards_and_priorities_go_back_to_them(make_shard):
    shards = filled_shards(make_shard)
    sampler = sampler_for(shards).start(lambda: 0.5)
    try:
        batch = sampler.get(timeout=30)
        assert batch is not None, "no batch within 30 s"
        ids = batch.columns["action"]
        assert batch.columns["obs"].shape == (32, 4) and batch.columns["obs"].dtype == np.float32
        # Every row is one the shards hold, whole: obs and next_obs were written from the same id.
        assert set(ids.tolist()) <= set(range(200)) | set(range(1000, 1200))
        np.testing.assert_array_equal(batch.columns["obs"][:, 0], ids.astype(np.float32))
        np.testing.assert_array_equal(batch.columns["next_obs"][:, 0], ids.astype(np.float32) + 1)
        assert batch.weights.shape == (32,) and np.all((batch.weights > 0) & (batch.weights <= 1))
        assert batch.fleet_size == 400

        # The batch stays as it was while it is held, however many batches the child fills meanwhile.
        held = {name: column.copy() for name, column in batch.columns.items()}
        wait_until(lambda: sampler._drain(0.05) or sampler.depth >= 2, "the child to fill the other slots")
        for name, column in held.items():
            np.testing.assert_array_equal(batch.columns[name], column)

        # New priorities reach the shard that owns each row.
        totals_before = [s.table.info().total_priority for s in shards]
        sampler.update_priorities(batch, np.full(32, 5.0))
        sampler.flush_updates(timeout=10)
        totals_after = [s.table.info().total_priority for s in shards]
        assert sum(totals_after) > sum(totals_before)
        from_first = int(np.sum(ids < 1000))
        assert (totals_after[0] > totals_before[0]) == (from_first > 0)
        assert (totals_after[1] > totals_before[1]) == (from_first < 32)

        # Many batches in a row: each one fresh and whole.
        for _ in range(20):
            batch = sampler.get(timeout=10)
            assert batch is not None
            np.testing.assert_array_equal(batch.columns["next_obs"][:, 0], batch.columns["action"] + 1)
            sampler.update_priorities(batch, np.ones(32))
        assert sampler.updates_dropped == 0
    finally:
        sampler.close()
    # Its own file only: another run's learner may hold one meanwhile.
    assert sampler.slots_path is not None and sampler.slots_path.startswith(SHM)
    assert not os.path.exists(sampler.slots_path), "the shared-memory file outlived the sampler"


@pytest.mark.timeout(60)
def test_a_killed_sampler_process_is_an_error_in_the_train_loop(make_shard):
    shards = filled_shards(make_shard)
    sampler = sampler_for(shards).start(lambda: 0.5)
    try:
        assert sampler.get(timeout=30) is not None
        os.kill(sampler._process.pid, signal.SIGKILL)
        sampler._process.join(10)
        with pytest.raises(RuntimeError, match="sampler process ended unexpectedly"):
            for _ in range(10):
                sampler.get(timeout=1)
    finally:
        sampler.close()


@pytest.mark.timeout(60)
def test_an_empty_fleet_gives_no_batch_until_rows_arrive(make_shard):
    shard = make_shard(TableConfig(capacity=1000, seed=0))
    sampler = sampler_for([shard]).start(lambda: 0.5)
    try:
        assert sampler.get(timeout=1.0) is None  # min_replay_size 1: nothing to sample yet, no error
        with ReplayClient(shard.address) as client:
            client.insert(cartpole_batch(50), priorities=np.ones(50))
            client.flush(timeout=10)
        batch = sampler.get(timeout=30)
        assert batch is not None and set(batch.columns["action"].tolist()) <= set(range(50))
    finally:
        sampler.close()


# --- compressed columns ------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_compressed_rows_arrive_decompressed_in_the_shared_slots(shard_processes):
    from tests.conftest import pixel_batch, pixel_frames

    shards = shard_processes(2, "--capacity", "1000")  # `apexrl replay` processes: they never decompress
    for i, shard in enumerate(shards):
        with ReplayClient(shard.address) as client:
            for start in range(i * 1000, i * 1000 + 300, 100):
                client.insert(pixel_batch(100, start), priorities=np.ones(100))
            client.flush(timeout=10)
    sampler = sampler_for(shards).start(lambda: 0.5)
    try:
        for _ in range(10):
            batch = sampler.get(timeout=30)
            assert batch is not None
            ids = batch.columns["action"]
            assert batch.columns["obs"].shape == (32, 2, 16, 16) and batch.columns["obs"].dtype == np.uint8
            np.testing.assert_array_equal(
                batch.columns["obs"], pixel_frames(ids)
            )  # the originals, pixel for pixel
            np.testing.assert_array_equal(batch.columns["next_obs"], pixel_frames(ids + 1))
            sampler.update_priorities(batch, np.ones(32))
        assert sampler.rows_rejected == 0
    finally:
        sampler.close()


@pytest.mark.timeout(90)
def test_a_row_that_does_not_decompress_is_rejected_naming_its_writer(make_shard, capfd):
    from apexrl.common.compression import CompressedColumn, compress
    from tests.conftest import pixel_batch, pixel_frames

    shard = make_shard(TableConfig(capacity=1000, seed=0))
    with ReplayClient(shard.address, writer_id="good-actor") as client:
        client.insert(pixel_batch(200), priorities=np.ones(200))
        client.flush(timeout=10)
    bad = pixel_batch(2, 5000)  # frames of half a row: valid zstd, the wrong size
    half = compress(pixel_frames([5000, 5001], shape=(2, 16, 8)), "zstd")
    bad["obs"] = CompressedColumn("zstd", np.dtype(np.uint8), (2, 16, 16), half.data, half.lengths)
    with ReplayClient(shard.address, writer_id="broken-actor") as client:
        client.insert(bad, priorities=np.full(2, 50.0))  # drawn often until rejected
        client.flush(timeout=10)
    sampler = sampler_for([shard]).start(lambda: 0.5)
    try:
        for _ in range(20):
            batch = sampler.get(timeout=30)
            assert batch is not None
            ids = batch.columns["action"]
            assert ids.max() < 5000  # bad rows never reach the train step...
            np.testing.assert_array_equal(batch.columns["obs"], pixel_frames(ids))  # ...whole good rows do
            sampler.update_priorities(batch, np.ones(32))
        sampler.flush_updates(timeout=10)
        assert sampler.rows_rejected >= 2
        leaves = shard.table._tree.leaf_values()
        assert leaves[200] == 0 and leaves[201] == 0  # their priority is 0 on the shard: not drawn again
    finally:
        sampler.close()
    err = capfd.readouterr().err
    assert (
        "written by writer 'broken-actor'" in err and "the frame announces 256 bytes, the row has 512" in err
    )
    assert "good-actor" not in err

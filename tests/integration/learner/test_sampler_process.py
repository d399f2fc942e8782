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


# --- sequence batches (R2D2) -------------------------------------------------------------------------------------

WINDOW, PERIOD = 8, 4


def sequence_shards(make_shard, sets: int = 1) -> list[list]:
    """`sets` copies of the same 2 sequence shards (alpha 1, so a leaf is the priority): shard s holds one
    trajectory of episodes of 30 steps numbered 1000 * s + key (the step's key there), windows of 8 every 4 (the
    last of an episode cut short), each with the field `state` [2, 3] holding its first step's number, and priority
    1 + (first number % 7)."""
    from apexrl.common.signature import Signature
    from apexrl.replay_server import ShardedWriter
    from apexrl.replay_server.client.sequence_writer import SequenceWriter

    signature = Signature.parse("obs:float32[4],reward:float32[]")
    copies = []
    for _ in range(sets):
        shards = [
            make_shard(
                TableConfig(capacity=1000, max_sequence_length=WINDOW, signature=signature, alpha=1.0, seed=s)
            )
            for s in range(2)
        ]
        for s, shard in enumerate(shards):
            with ShardedWriter(shard.address) as sharded:
                writer = SequenceWriter(
                    sharded, length=WINDOW, period=PERIOD, priority=lambda w: 1.0 + float(w["obs"][0, 0]) % 7
                )
                for key in range(150):
                    number = np.float32(1000 * s + key)
                    writer.append(
                        {"obs": np.full(4, number), "reward": number}, {"state": np.full((2, 3), number)}
                    )
                    if key % 30 == 29:
                        writer.end_episode()
                sharded.flush()
        copies.append(shards)
    return copies


def feed_config(shards, **changes) -> LearnerConfig:
    return LearnerConfig(
        replay=tuple(s.address for s in shards),
        batch_size=16,
        seed=0,
        min_replay_size=1,
        prefetch_depth=2,
        sample_batches_per_call=2,
        **changes,
    )


def first_batches(feed, count: int) -> list[tuple[dict[str, np.ndarray], np.ndarray, int]]:
    """The feed's first `count` batches, copied (a slot is reused once the next one is taken); no priorities sent, so
    the shards' draws depend on nothing but their seeds."""
    batches = []
    try:
        for _ in range(count):
            batch = feed.get(timeout=30)
            assert batch is not None, "no batch within 30 s"
            columns = {name: np.array(column) for name, column in batch.columns.items()}
            batches.append((columns, np.array(batch.weights), batch.fleet_size))
    finally:
        feed.stop(wait=False)
        feed.close()
    return batches


@pytest.mark.timeout(90)
def test_a_sequence_batch_through_the_process_is_the_thread_feeds_batch(make_shard):
    """Two copies of the same shards, one sampled by each feed with the same seed: the same batches, column for
    column ([B, T, ...] steps, lengths, item fields), weights and fleet size."""
    by_thread, by_process = both_feeds(*sequence_shards(make_shard, sets=2))
    assert_same_batches(by_thread, by_process)
    for columns, _, fleet in by_process:
        assert list(columns) == ["obs", "reward", "lengths", "state"]
        assert fleet == 2 * 5 * 7  # items: 7 windows in each episode of 30 steps
        # What those columns are: each item's own steps, item-major, its length and its state.
        obs, lengths, state = columns["obs"], columns["lengths"], columns["state"]
        assert obs.shape == (16, WINDOW, 4) and state.shape == (16, 2, 3) and lengths.shape == (16,)
        firsts = obs[:, 0, 0]
        np.testing.assert_array_equal(state, np.broadcast_to(firsts[:, None, None], (16, 2, 3)))
        for row, first, length in zip(obs[:, :, 0], firsts, lengths, strict=True):
            assert length == min(WINDOW, 30 - first % 1000 % 30)  # cut short at its episode's end
            np.testing.assert_array_equal(row[:length], first + np.arange(length))
            np.testing.assert_array_equal(row[length:], first + length - 1)  # padded with its last step
        assert len(set(firsts // 1000)) == 2, "a batch of 16 draws from both shards"


def both_feeds(for_thread, for_process, count: int = 4) -> tuple[list, list]:
    """The first `count` batches of the thread feed over `for_thread` and of the sampler process over `for_process`
    (copies of the same shards), with the same settings and seed."""
    from apexrl.learner.feed import ThreadFeed
    from apexrl.learner.learner import make_sampler
    from apexrl.learner.sampler_process import replay_sampler

    config = feed_config(for_thread, sampler_process=False)
    by_thread = first_batches(ThreadFeed(replay_sampler(config), config).start(lambda: 0.5), count)
    feed = make_sampler(feed_config(for_process))
    assert isinstance(feed, SamplerProcess), "the default feed is the sampler process"
    return by_thread, first_batches(feed.start(lambda: 0.5), count)


def assert_same_batches(by_thread: list, by_process: list) -> None:
    for (thread_columns, thread_weights, thread_fleet), (columns, weights, fleet) in zip(
        by_thread, by_process, strict=True
    ):
        assert list(columns) == list(thread_columns)
        for name, column in columns.items():
            assert column.dtype == thread_columns[name].dtype, name
            np.testing.assert_array_equal(column, thread_columns[name], err_msg=name)
        np.testing.assert_array_equal(weights, thread_weights)
        assert fleet == thread_fleet


@pytest.mark.timeout(90)
def test_a_transition_batch_through_the_process_is_the_thread_feeds_batch(make_shard):
    """The same for transitions (the slots' layout for them did not change with sequences)."""
    by_thread, by_process = both_feeds(filled_shards(make_shard), filled_shards(make_shard))
    assert_same_batches(by_thread, by_process)
    assert list(by_process[0][0]) == ["obs", "action", "reward", "discount", "next_obs"]
    assert by_process[0][0]["obs"].shape == (16, 4)


@pytest.mark.timeout(90)
def test_sequence_priorities_go_back_to_the_item_on_its_own_shard(make_shard):
    (shards,) = sequence_shards(make_shard)
    sampler = SamplerProcess(feed_config(shards), slots=3, batches_per_call=2).start(lambda: 0.5)
    try:
        for _ in range(3):
            batch = sampler.get(timeout=30)
            assert batch is not None, "no batch within 30 s"
            firsts = batch.columns["obs"][:, 0, 0].astype(np.int64)
            # 100 + the item's number: an item drawn twice gets the same priority; shard 0's are below 1000.
            sampler.update_priorities(batch, 100.0 + firsts)
        sampler.flush_updates(timeout=10)
        assert sampler.updates_dropped == 0
        leaves = [shard.table._tree.leaf_values() for shard in shards]
        updated = {s: np.flatnonzero(leaves[s] >= 100) for s in range(2)}
        assert all(len(keys) for keys in updated.values()), "both shards had items updated"
        for s, keys in updated.items():
            np.testing.assert_array_equal(leaves[s][keys], 100.0 + 1000 * s + keys)  # each on its own shard
    finally:
        sampler.close()


@pytest.mark.timeout(90)
def test_compressed_sequences_arrive_whole_and_a_bad_item_is_replaced_in_the_slot(make_shard):
    """Pixel steps are decompressed straight into the slot as [B, T, ...]; an item with a frame that does not
    decompress is replaced there by a good one (never trained on; its priority goes to 0)."""
    from apexrl.common.compression import compress
    from apexrl.common.signature import Signature
    from apexrl.replay_server import ShardedWriter
    from apexrl.replay_server.client.sequence_writer import SequenceWriter
    from tests.conftest import frame_ids, pixel_frames

    pixels = Signature.parse("obs:uint8[2,16,16]@zstd,reward:float32[]")
    shard = make_shard(TableConfig(capacity=1000, max_sequence_length=4, signature=pixels, seed=0))
    with ShardedWriter(shard.address) as sharded:
        writer = SequenceWriter(sharded, length=4, period=2)
        for t in range(11):
            frame = compress(pixel_frames([t]), "zstd")
            if t == 9:  # not zstd's: its item (steps 8..10) must never reach the learner
                frame = type(frame)(
                    frame.compression, frame.dtype, frame.shape, b"\x28\xb5\x2f\xfdgarbage", np.array([11])
                )
            writer.append({"obs": frame, "reward": np.float32(t)}, {"state": np.array([t], np.float32)})
        writer.end_episode()
        sharded.flush()
    sampler = SamplerProcess(feed_config([shard]), slots=3, batches_per_call=2).start(lambda: 0.5)
    try:
        for _ in range(5):
            batch = sampler.get(timeout=30)
            assert batch is not None, "no batch within 30 s"
            obs = batch.columns["obs"]
            assert obs.shape == (16, 4, 2, 16, 16) and obs.dtype == np.uint8
            ids = frame_ids(obs.reshape(-1, 2, 16, 16)).reshape(16, 4)
            for row, length, state in zip(
                ids, batch.columns["lengths"], batch.columns["state"][:, 0], strict=True
            ):
                np.testing.assert_array_equal(row[:length], state + np.arange(length))
                assert 9 not in row[:length]
            sampler.update_priorities(batch, np.ones(16))
        assert sampler.rows_rejected >= 1
    finally:
        sampler.close()

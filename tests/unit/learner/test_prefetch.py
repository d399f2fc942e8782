"""The prefetcher (learner/prefetch.py) with an in-process sampler: batches arrive in order with the beta of their
draw, several batches per call come from one `sample_batches` draw unchanged, it waits for the fleet's minimum
size, retries transient sampling errors, surfaces a bug as RuntimeError in get(), and stop() ends its thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.learner.prefetch import Prefetcher
from apexrl.learner.sharded_client import PrioritizedBatch
from tests.conftest import wait_until
from tests.unit.learner.fakes import FakeSampler, make_batch


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "apexrl-prefetch"]


@pytest.fixture
def started():
    made: list[Prefetcher] = []

    def start(sampler, **kwargs) -> Prefetcher:
        made.append(Prefetcher(sampler, **{"batch_size": 8, "beta": lambda: 0.4, **kwargs}).start())
        return made[-1]

    yield start
    for prefetcher in made:
        prefetcher.stop()


def get(prefetcher: Prefetcher, timeout: float = 10.0):
    batch = prefetcher.get(timeout=timeout)
    assert batch is not None, "no batch arrived"
    return batch


def test_batches_arrive_in_order_with_the_beta_current_at_their_draw(started):
    sampler = FakeSampler()
    betas = iter(np.linspace(0.4, 1.0, 1000))
    prefetcher = started(sampler, beta=lambda: float(next(betas)), depth=2)
    batches = [get(prefetcher) for _ in range(5)]
    assert [b.keys.tolist() for b in batches] == [list(range(8 * i, 8 * i + 8)) for i in range(5)]
    assert all(b is d for b, d in zip(batches, sampler.drawn, strict=False))  # one draw per batch, unchanged
    sizes, batches, used = zip(*sampler.sample_calls, strict=True)
    assert set(sizes) == {8} and set(batches) == {1}  # one batch per draw
    assert list(used) == sorted(used) and used[0] == 0.4 and used[1] > 0.4
    # The queue is bounded: with nothing taken, the thread stops drawing after `depth` batches (+1 in hand).
    wait_until(lambda: len(sampler.sample_calls) >= 5 + 3, "the prefetcher filled its queue")
    assert len(sampler.sample_calls) <= 5 + 3


def test_several_batches_per_call_come_from_one_draw_each_as_it_was_drawn(started):
    """Each batch of a `sample_batches` draw was allocated and stratified on its own by the sampler: the
    prefetcher hands it on unchanged (no re-cutting, which would undo the per-batch stratification)."""
    sampler = FakeSampler()
    prefetcher = started(sampler, batch_size=8, batches_per_call=4, depth=4, beta=lambda: 0.5)
    batches = [get(prefetcher) for _ in range(4)]
    assert sampler.sample_calls[0] == (8, 4, 0.5)  # one draw of 4 batches of 8
    assert all(b is d for b, d in zip(batches, sampler.drawn[:4], strict=True))


def test_sampling_waits_until_the_fleet_holds_the_minimum(started):
    sampler = FakeSampler(fleet_sizes=[10, 60, 500])
    prefetcher = started(sampler, min_fleet_size=100)
    get(prefetcher)
    assert (
        sampler.refreshes == 3 and sampler.sample_calls[0][0] == 8
    )  # no draw before the fleet held 100 rows


def test_transient_sampling_errors_are_retried(started):
    sampler = FakeSampler(failures=[UnavailableError("shard down"), DeadlineExceededError("slow")])
    prefetcher = started(sampler)
    assert get(prefetcher).keys.tolist() == list(range(8))
    assert len(sampler.sample_calls) >= 3 and prefetcher.error is None  # two failures, then the batch


def test_a_bug_in_sampling_becomes_a_runtime_error_in_get(started):
    bug = KeyError("columns")
    prefetcher = started(FakeSampler(failures=[bug]))
    wait_until(lambda: prefetcher.error is not None, "the prefetch thread failed")
    with pytest.raises(RuntimeError, match="prefetch thread failed") as err:
        prefetcher.get(timeout=1)
    assert err.value.__cause__ is bug


def test_stop_ends_the_thread_even_when_the_queue_is_full(started):
    assert not prefetch_threads()
    sampler = FakeSampler()
    prefetcher = started(sampler, depth=1)
    get(prefetcher)
    wait_until(
        lambda: len(sampler.sample_calls) >= 3, "one batch queued and one held while the queue is full"
    )
    assert len(prefetch_threads()) == 1
    prefetcher.stop()
    assert not prefetch_threads()
    assert prefetcher.get(timeout=0.01) is not None  # what was queued stays readable
    assert prefetcher.get(timeout=0.01) is None


# --- compressed columns ------------------------------------------------------------------------------------------


class PixelSampler(FakeSampler):
    """FakeSampler whose batches carry compressed image observations naming their keys (tests.conftest), the row
    with key `bad` a frame of the wrong size, and each row's writer; records zero_priorities."""

    def __init__(self, bad: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad = bad
        self.zeroed: list[list[int]] = []
        self.shards = [type("Shard", (), {"address": f"shard-{s}:7000"})() for s in range(2)]

    def sample_batches(
        self, batch_size: int, batches: int, *, beta: float = 0.4, timeout: float | None = None
    ) -> list[PrioritizedBatch]:
        drawn = super().sample_batches(batch_size, batches, beta=beta, timeout=timeout)
        return [pixel_version(batch, self.bad) for batch in drawn]

    def zero_priorities(self, batch: PrioritizedBatch, rows: np.ndarray) -> None:
        self.zeroed.append(batch.keys[rows].tolist())


def pixel_version(batch: PrioritizedBatch, bad: int | None = None) -> PrioritizedBatch:
    from apexrl.common.compression import CompressedColumn, compress
    from tests.conftest import pixel_frames

    ids = batch.keys.astype(np.int64)
    frames = compress(pixel_frames(ids), "zstd").frames()
    for i in np.flatnonzero(ids == bad):
        frames[i] = compress(pixel_frames(ids[i : i + 1], shape=(2, 16, 8)), "zstd").frame(0)
    obs = CompressedColumn.from_frames("zstd", np.uint8, (2, 16, 16), frames)
    writers = np.array([f"actor-{k % 3}" for k in ids], dtype=object)
    return PrioritizedBatch(
        {**batch.columns, "obs": obs},
        batch.shard_ids,
        batch.keys,
        batch.probabilities,
        batch.weights,
        batch.incarnations,
        batch.fleet_size,
        writers,
    )


def test_compressed_columns_arrive_decompressed_from_the_prefetch_thread(started):
    from tests.conftest import frame_ids

    prefetcher = started(PixelSampler(), batch_size=8, batches_per_call=2, seed=0)
    for _ in range(4):
        batch = get(prefetcher)
        assert batch.columns["obs"].shape == (8, 2, 16, 16) and batch.columns["obs"].dtype == np.uint8
        np.testing.assert_array_equal(frame_ids(batch.columns["obs"]), batch.keys.astype(np.int64))
    assert prefetcher.decompressor.rows_rejected == 0


def test_a_row_that_does_not_decompress_is_named_zeroed_and_replaced_by_a_good_row(caplog):
    from apexrl.learner.prefetch import BatchDecompressor
    from tests.conftest import frame_ids

    sampler = PixelSampler(bad=5)
    decompressor = BatchDecompressor(sampler, seed=0)
    batch = pixel_version(make_batch(range(8)), bad=5)
    with caplog.at_level("ERROR"):
        out = decompressor(batch)
    assert out is not None and 5 not in out.keys.tolist() and len(out.keys) == 8
    # The replacement is a whole good row: its frames, key, shard, probability and weight travel together.
    np.testing.assert_array_equal(frame_ids(out.columns["obs"]), out.keys.astype(np.int64))
    j = int(np.flatnonzero(batch.keys == 5)[0])
    donor = int(out.keys[j])
    assert out.weights[j] == batch.weights[donor] and out.shard_ids[j] == batch.shard_ids[donor]
    assert out.columns["action"][j] == batch.columns["action"][donor]
    assert sampler.zeroed == [[5]] and decompressor.rows_rejected == 1
    (record,) = [r for r in caplog.records if "rejected row" in r.getMessage()]
    message = record.getMessage()
    assert "key 5 of shard shard-1:7000" in message and "written by writer 'actor-2'" in message
    assert "the frame announces 256 bytes, the row has 512" in message
    # A writer is named once a minute at most; every bad row still counts and is zeroed.
    caplog.clear()
    decompressor(pixel_version(make_batch([5, 6]), bad=5))
    assert decompressor.rows_rejected == 2 and not [
        r for r in caplog.records if "rejected row" in r.getMessage()
    ]
    # A batch with no good row is dropped.
    assert decompressor(pixel_version(make_batch([5, 5]), bad=5)) is None and sampler.zeroed[-1] == [5, 5]

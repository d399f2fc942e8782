"""The prefetcher (learner/prefetch.py) with an in-process sampler: batches arrive in order with the beta of their
draw, a large draw is split into fair parts, it waits for the fleet's minimum size, retries transient sampling
errors, surfaces a bug as RuntimeError in get(), and stop() ends its thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.learner.prefetch import Prefetcher
from tests.conftest import wait_until
from tests.unit.learner.fakes import FakeSampler


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
    sizes, used = zip(*sampler.sample_calls, strict=True)
    assert set(sizes) == {8} and list(used) == sorted(used) and used[0] == 0.4 and used[1] > 0.4
    # The queue is bounded: with nothing taken, the thread stops drawing after `depth` batches (+1 in hand).
    wait_until(lambda: len(sampler.sample_calls) >= 5 + 3, "the prefetcher filled its queue")
    assert len(sampler.sample_calls) <= 5 + 3


def test_a_large_draw_is_split_into_parts_that_keep_each_rows_probability_and_weight(started):
    sampler = FakeSampler()
    prefetcher = started(sampler, batch_size=8, batches_per_call=4, depth=4, seed=0)
    parts = [get(prefetcher) for _ in range(4)]
    assert sampler.sample_calls[0][0] == 32  # one draw of 4 batches' rows
    drawn = sampler.drawn[0]
    assert [len(p.keys) for p in parts] == [8] * 4
    assert sorted(np.concatenate([p.keys for p in parts]).tolist()) == drawn.keys.tolist()
    assert [p.keys.tolist() for p in parts] != [drawn.keys[8 * i:8 * i + 8].tolist() for i in range(4)]  # shuffled
    row = {int(k): j for j, k in enumerate(drawn.keys)}
    for part in parts:
        idx = [row[int(k)] for k in part.keys]
        np.testing.assert_array_equal(part.probabilities, drawn.probabilities[idx])
        np.testing.assert_array_equal(part.weights, drawn.weights[idx])
        np.testing.assert_array_equal(part.shard_ids, drawn.shard_ids[idx])
        for name, column in drawn.columns.items():
            np.testing.assert_array_equal(part.columns[name], column[idx])
        assert part.incarnations == drawn.incarnations and part.fleet_size == drawn.fleet_size


def test_sampling_waits_until_the_fleet_holds_the_minimum(started):
    sampler = FakeSampler(fleet_sizes=[10, 60, 500])
    prefetcher = started(sampler, min_fleet_size=100)
    get(prefetcher)
    assert sampler.refreshes == 3 and sampler.sample_calls[0][0] == 8  # no draw before the fleet held 100 rows


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
    wait_until(lambda: len(sampler.sample_calls) >= 3, "one batch queued and one held while the queue is full")
    assert len(prefetch_threads()) == 1
    prefetcher.stop()
    assert not prefetch_threads()
    assert prefetcher.get(timeout=0.01) is not None  # what was queued stays readable
    assert prefetcher.get(timeout=0.01) is None

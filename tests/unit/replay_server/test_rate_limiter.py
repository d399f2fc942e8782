"""The rate limiter (replay_server/core/rate_limiter.py, pure): a minimum size before sampling, and a samples-per-insert
ratio that blocks whichever side runs ahead by more than the tolerance, on both sides, and never both at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.replay_server.core.rate_limiter import BlockedTime, RateLimiter


def test_without_a_ratio_only_the_minimum_size_holds_sampling_back():
    limiter = RateLimiter(min_size=10)
    assert not limiter.enabled
    assert not limiter.can_sample(0) and not limiter.can_sample(9) and limiter.can_sample(10)
    for _ in range(100):
        limiter.sampled(1000)  # sampling far ahead of inserting never blocks anyone
        assert limiter.can_insert() and limiter.can_sample(10)


def test_rows_inserted_before_the_minimum_size_do_not_count_toward_the_ratio():
    limiter = RateLimiter(min_size=100, samples_per_insert=2.0, tolerance=10)
    limiter.inserted(60, size_after=60)
    limiter.inserted(
        60, size_after=120
    )  # the table reached its minimum with this batch: counted from here on
    assert "0 rows sampled for 60 inserted (diff 120, tolerance 10)" in limiter.describe()
    assert not limiter.can_insert()  # 120 rows of sampling are owed, above the tolerance
    assert limiter.can_sample(120)


def test_the_sampler_waits_when_it_runs_ahead_by_more_than_the_tolerance():
    limiter = RateLimiter(min_size=1, samples_per_insert=1.0, tolerance=16)
    limiter.inserted(32, size_after=32)  # diff 32
    limiter.sampled(32)  # diff 0
    assert limiter.can_sample(32)
    limiter.sampled(16)  # diff -16: exactly the tolerance is still allowed
    assert limiter.can_sample(32)
    limiter.sampled(1)  # diff -17
    assert not limiter.can_sample(32) and limiter.can_insert()
    limiter.inserted(1, size_after=33)  # diff -16
    assert limiter.can_sample(33)


def test_writers_wait_when_they_run_ahead_by_more_than_the_tolerance():
    """The insert side: the shipped launcher turns the ratio on, so actors ahead of the learner must wait."""
    limiter = RateLimiter(min_size=1, samples_per_insert=8.0, tolerance=1024)
    limiter.inserted(128, size_after=128)  # diff 1024: exactly the tolerance is still allowed
    assert limiter.can_insert()
    limiter.inserted(1, size_after=129)  # diff 1032
    assert not limiter.can_insert() and limiter.can_sample(129)
    limiter.sampled(8)  # diff 1024
    assert limiter.can_insert()


@pytest.mark.parametrize(("spi", "tolerance"), [(0.25, 1.0), (1.0, 0.5), (8.0, 1024.0), (32.0, 3.0)])
def test_the_ratio_is_held_within_tolerance_plus_one_batch(spi, tolerance):
    """Writers of 50 rows and a sampler of 64 rows, each acting whenever allowed: the drift stays bounded."""
    limiter = RateLimiter(min_size=1, samples_per_insert=spi, tolerance=tolerance)
    size = inserted = sampled = 0
    for step in range(5000):
        if step % 2 == 0 and limiter.can_insert():
            size, inserted = size + 50, inserted + 50
            limiter.inserted(50, size_after=size)
        elif limiter.can_sample(size):
            limiter.sampled(64)
            sampled += 64
        diff = inserted * spi - sampled
        assert -tolerance - 64 <= diff <= tolerance + 50 * spi
    assert sampled > 0 and inserted > 0
    assert sampled / (inserted * spi) == pytest.approx(
        1.0, abs=(tolerance + 64 + 50 * spi) / (inserted * spi)
    )


OPS = st.lists(
    st.tuples(st.sampled_from(["insert", "sample"]), st.integers(1, 300)), min_size=1, max_size=200
)


@given(min_size=st.integers(1, 500), spi=st.floats(0.01, 64.0), tolerance=st.floats(0.5, 2000.0), ops=OPS)
@settings(max_examples=300, deadline=None)
def test_never_both_sides_blocked_whatever_the_batch_sizes(min_size, spi, tolerance, ops):
    """Deadlock freedom: once sampling may start, at every moment at least one side may go on, so a blocked call
    is always released by the other side; before that, inserting is always allowed."""
    limiter = RateLimiter(min_size=min_size, samples_per_insert=spi, tolerance=tolerance)
    size = 0
    for op, rows in ops:
        can_insert, can_sample = limiter.can_insert(), limiter.can_sample(size)
        if size < min_size:
            assert can_insert and not can_sample
        else:
            assert can_insert or can_sample, limiter.describe()
        if op == "insert" and can_insert:
            size += rows
            limiter.inserted(rows, size_after=size)
        elif op == "sample" and can_sample:
            limiter.sampled(rows)
        elif can_insert:  # the requested side is blocked: the other side acts, as it would in a fleet
            size += rows
            limiter.inserted(rows, size_after=size)
        else:
            limiter.sampled(rows)


# --- blocked time (apexrl_replay_rate_limiter_blocked_seconds_total) ------------------------------------------------


def test_blocked_time_adds_up_one_continuous_wait_from_its_refusals_to_its_admission():
    clock = BlockedTime(gap=0.5)
    clock.admitted(1.0)  # admitted at once: nothing was held back
    assert clock.total == 0 and not clock.waiting
    for now in (10.0, 10.25, 10.5, 10.75):  # one caller re-checking every 0.25 s
        clock.refused(now)
    assert clock.waiting and clock.total == pytest.approx(0.75)
    clock.admitted(10.9)
    assert not clock.waiting and clock.total == pytest.approx(0.9)


def test_blocked_time_ends_a_wait_at_its_last_refusal_when_the_caller_gives_up():
    clock = BlockedTime(gap=0.5)
    clock.refused(0.0)
    clock.refused(0.25)  # then the caller's deadline passed: no more refusals
    clock.refused(30.0)  # a new wait much later: the gap is not counted
    clock.refused(30.5)
    assert clock.total == pytest.approx(0.75)
    clock.admitted(100.0)  # an admission long after the last refusal closes the wait without counting the gap
    assert clock.total == pytest.approx(0.75) and not clock.waiting


def test_concurrent_waiters_count_once_so_the_total_never_outgrows_the_wall_clock():
    clock = BlockedTime(gap=0.5)
    for step in range(40):  # two callers refused at once every 0.25 s for 9.75 s
        clock.refused(step * 0.25)
        clock.refused(step * 0.25)
    assert clock.total == pytest.approx(9.75)

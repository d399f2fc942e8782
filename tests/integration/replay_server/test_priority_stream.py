"""PriorityStream (replay_server/client/priority_stream.py): fire-and-forget priority updates over one long-lived stream
to a real in-process shard; what the shard applied or found stale is counted, updates in flight when the shard
goes away are dropped and counted, and the stream reconnects when the shard is back."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, start_shard_process, wait_until


@pytest.fixture
def filled(make_shard):
    """A shard holding keys 0..99 with priority 1 (alpha 1, so the total is the sum of raw priorities)."""
    shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=0))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100), priorities=np.ones(100))
        client.flush()
    return shard


def test_updates_are_applied_or_counted_stale_and_flush_waits_for_the_answers(filled):
    incarnation = filled.table.incarnation
    with ReplayClient(filled.address) as client:
        stream = client.priority_stream(max_in_flight=4)
        try:
            for i in range(10):  # more messages than may be in flight: send blocks, then goes on
                assert stream.send(
                    np.arange(10 * i, 10 * i + 5, dtype=np.uint64), np.full(5, 3.0), incarnation
                )
            assert stream.send(
                np.array([100, 5000], dtype=np.uint64), np.full(2, 9.0), incarnation
            )  # unknown
            assert stream.send(
                np.arange(3, dtype=np.uint64), np.full(3, 9.0), incarnation ^ 2
            )  # restarted shard
            assert stream.flush(timeout=10)
            assert (stream.applied, stream.stale, stream.dropped, stream.failures) == (50, 5, 0, 0)
        finally:
            stream.close()
    info = filled.table.info()
    assert (info.updated_total, info.stale_updates_total) == (50, 5)
    assert info.total_priority == pytest.approx(50 * 1.0 + 50 * 3.0)


def stopped(pid: int) -> bool:
    """Every thread of the process is stopped (state T)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def test_updates_in_flight_when_the_shard_stops_are_dropped_and_the_stream_reconnects(tmp_path):
    """A shard process frozen (SIGSTOP) with an update in flight, then killed: the update is dropped and counted;
    a new shard process on the same address is found by the same stream."""
    shard = start_shard_process(tmp_path, "frozen", "--alpha", "1.0")
    port = int(shard.address.rsplit(":", 1)[1])
    client = ReplayClient(shard.address)
    stream = client.priority_stream()
    replacement = None
    try:
        client.insert(cartpole_batch(100), priorities=np.ones(100))
        client.flush()
        incarnation = client.info().incarnation
        assert stream.send(np.arange(3, dtype=np.uint64), np.full(3, 2.0), incarnation)
        assert stream.flush(timeout=10) and stream.applied == 3  # the stream is open
        shard.process.send_signal(signal.SIGSTOP)
        # Every thread of it stopped before the update goes (a loaded machine delivers the stop late).
        wait_until(lambda: stopped(shard.process.pid), "the shard process is stopped", timeout=30)
        assert stream.send(np.arange(10, 17, dtype=np.uint64), np.full(7, 5.0), incarnation)
        assert not stream.flush(timeout=0.5)  # in flight: the frozen shard cannot answer
        shard.process.send_signal(signal.SIGKILL)
        shard.process.wait(10)
        assert stream.flush(timeout=10)  # the answer will never come: the update is dropped, not waited for
        assert (stream.applied, stream.dropped) == (3, 7) and stream.failures >= 1
        replacement = start_shard_process(tmp_path, "replacement", "--alpha", "1.0", "--port", str(port))
        with ReplayClient(replacement.address) as fresh:
            fresh.insert(cartpole_batch(100), priorities=np.ones(100))
            fresh.flush()
            new_incarnation = fresh.info().incarnation

        def resend() -> bool:
            stream.send(np.arange(10, 20, dtype=np.uint64), np.full(10, 4.0), new_incarnation)
            return stream.flush(timeout=5) and stream.applied > 3

        wait_until(resend, "the stream reconnected and an update was applied", timeout=20)
        with ReplayClient(replacement.address) as fresh:
            info = fresh.info()
        assert info.updated_total == stream.applied - 3  # what the stream counts is what the shard applied
        assert info.total_priority == pytest.approx(90 + 10 * 4.0)
    finally:
        stream.close()
        client.close()
        for proc in (shard, replacement):
            if proc is not None and proc.process.poll() is None:
                proc.process.kill()
                proc.process.wait(10)


def test_send_gives_up_at_its_deadline_when_the_stream_is_backed_up(filled):
    original = filled.table.apply_updates  # the stream's table call (one per step of queued requests)
    release = threading.Event()

    def held_update(*args, **kwargs):
        release.wait(10)
        return original(*args, **kwargs)

    filled.table.apply_updates = held_update
    with ReplayClient(filled.address) as client:
        stream = client.priority_stream(max_in_flight=2)
        try:
            incarnation = filled.table.incarnation
            assert stream.send(np.zeros(1, np.uint64), np.ones(1), incarnation)
            assert stream.send(np.ones(1, np.uint64), np.ones(1), incarnation)
            assert not stream.send(
                np.full(1, 2, np.uint64), np.ones(1), incarnation, timeout=0.2
            )  # not queued
            assert not stream.flush(timeout=0.2)
            release.set()
            assert stream.flush(timeout=10)
            assert stream.applied == 2 and stream.dropped == 0
        finally:
            release.set()
            stream.close()

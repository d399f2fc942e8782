"""The SDK's writer to many shards (replay_server/client/sharded_writer.py) against real shard processes: batches go
round-robin; a killed shard is passed over while its backlog holds, rows it acknowledged survive (its write-ahead
log) and its queued batches are resent once it is back, so every row lands exactly once; the backlog bound holds
under back pressure; and a `dns:///` name's shards join and leave the rotation."""

from __future__ import annotations

import signal
import socket
import threading

import numpy as np
import pytest

from apexrl.actor import ReplayClient, ShardedWriter
from apexrl.common.errors import DeadlineExceededError
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, start_shard_process, wait_until

ROWS = 10  # per batch
# How long an insert may take while some shard has room: failover is immediate; waiting instead is the bug.
FAILOVER_WITHIN = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def shard(tmp_path):
    """start(name, *extra, port=0, host=...) -> ShardProcess; all killed after the test."""
    started = []

    def start(name: str, *extra: str, port: int = 0, host: str = "127.0.0.1"):
        proc = start_shard_process(
            tmp_path, name, *(("--port", str(port)) if port else ()), *extra, host=host
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait(10)


class Feed:
    """Numbered batches into a writer: batch i holds rows i*ROWS .. i*ROWS + ROWS - 1 (the `action` column)."""

    def __init__(self, writer: ShardedWriter) -> None:
        self.writer = writer
        self.batches = 0

    def insert(self, **options):
        placed = self.writer.insert(cartpole_batch(ROWS, self.batches * ROWS), np.ones(ROWS), **options)
        if placed is not None:
            self.batches += 1
        return placed

    @property
    def rows(self) -> int:
        return self.batches * ROWS


def stored_ids(address: str) -> np.ndarray:
    """Every row id a shard holds, each once: a stratified sample of 4 draws per row over equal priorities
    reaches every row."""
    with ReplayClient(address, timeout=10) as client:
        size = client.info().size
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        return np.unique(client.sample(4 * size).columns["action"])


def assert_every_row_once(addresses: list[str], rows: int) -> None:
    sizes = []
    ids = []
    for address in addresses:
        with ReplayClient(address, timeout=10) as client:
            sizes.append(client.info().size)
        ids.append(stored_ids(address))
    assert sum(sizes) == rows, sizes  # no row twice ...
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(rows))  # ... and none missing


def test_bad_addresses_are_refused_before_any_dial():
    with pytest.raises(ValueError, match="at least one shard"):
        ShardedWriter([])
    with pytest.raises(ValueError, match=r"replay \('localhost'\) has no port"):
        ShardedWriter(["127.0.0.1:7000", "localhost"])
    with pytest.raises(ValueError, match="max_in_flight"):
        ShardedWriter("127.0.0.1:7000", max_in_flight=0)


@pytest.mark.timeout(120)
def test_batches_go_round_robin_from_the_first_shard(shard):
    shards = [shard(name) for name in ("a", "b", "c")]
    addresses = [s.address for s in shards]
    with ShardedWriter(addresses, first_shard=4) as writer:  # 4 mod 3: shard b first
        feed = Feed(writer)
        placed = [feed.insert() for _ in range(9)]
        writer.flush(timeout=30)
        assert [p.address for p in placed] == [addresses[(1 + i) % 3] for i in range(9)]
        assert not any(p.failed_over for p in placed)
        assert writer.backlog() == dict.fromkeys(addresses, 0)
    for i, address in enumerate(addresses):
        np.testing.assert_array_equal(
            stored_ids(address), [b * ROWS + r for b in range(9) if (1 + b) % 3 == i for r in range(ROWS)]
        )


@pytest.mark.timeout(180)
def test_a_killed_shard_is_passed_over_then_used_again_and_every_row_lands_once(shard, tmp_path):
    """b keeps a write-ahead log, so what it acknowledged survives SIGKILL; what the writer queued for it while it
    was down waits in its backlog (max_in_flight) and is resent when it is back on the same address."""
    durable = ("--checkpoint-dir", str(tmp_path / "b-checkpoints"), "--wal", str(tmp_path / "b-wal"))
    port = free_port()
    a, b, c = shard("a"), shard("b", *durable, port=port), shard("c")
    addresses = [a.address, b.address, c.address]
    with ShardedWriter(addresses, max_in_flight=2, timeout=30) as writer:
        feed = Feed(writer)
        for _ in range(6):
            feed.insert()
        writer.flush()
        b.stop(signal.SIGKILL)
        during = [feed.insert(timeout=10.0) for _ in range(12)]  # never waits on b: a and c have room
        assert writer.backlog()[b.address] == 2  # its backlog filled, then it was passed over
        assert sum(p.address == b.address for p in during) == 2
        assert any(p.failed_over for p in during)  # b's later turns went to the next shard
        b = shard("b-again", *durable, port=port)
        writer.flush(timeout=60)  # b's client reconnects and resends what it queued
        after = [feed.insert() for _ in range(6)]
        assert any(p.address == b.address for p in after)  # b takes its turns again
        writer.flush(timeout=30)
    assert_every_row_once(addresses, feed.rows)


@pytest.mark.timeout(60)
def test_the_batches_of_a_shard_with_a_full_backlog_go_to_the_next_shard_at_once(make_shard):
    """Failover without a process to kill: shard `held` takes no rows (its rate limiter waits for a sampler that
    never comes), so its backlog fills at max_in_flight; each later turn of it goes to `taker` straight away
    (failed_over), and `taker` stores those rows."""
    held = make_shard(
        TableConfig(
            capacity=1000,
            min_size_to_sample=1,
            samples_per_insert=1.0,
            samples_per_insert_tolerance=1.0,
            seed=0,
        )
    )
    held.table.insert(cartpole_batch(ROWS, start=1000), np.ones(ROWS))  # 10 rows, none sampled: inserts wait
    taker = make_shard()
    writer = ShardedWriter([held.address, taker.address], max_in_flight=2, timeout=30)
    try:
        feed = Feed(writer)
        placed = []
        for batch in range(8):
            try:
                placed.append(feed.insert(timeout=FAILOVER_WITHIN))
            except DeadlineExceededError as err:
                pytest.fail(
                    f"batch {batch} waited for the full backlog of {held.address} (backlogs {writer.backlog()}) "
                    f"instead of going to {taker.address}: no failover ({err})"
                )
            # taker acknowledges each batch before the next: only held's backlog is ever full
            wait_until(lambda: writer.backlog()[taker.address] == 0, "taker acknowledged its batches")
        where = ["held" if p.address == held.address else "taker" for p in placed]
        assert where == ["held", "taker", "held", "taker", "taker", "taker", "taker", "taker"], where
        assert [p.failed_over for p in placed] == [False] * 4 + [True, False, True, False]
        assert writer.backlog()[held.address] == 2  # full, and no further
        taken = [b * ROWS + r for b in (1, 3, 4, 5, 6, 7) for r in range(ROWS)]
        wait_until(
            lambda: taker.table.info().size == len(taken),
            "taker stored the 6 batches placed on it",
            timeout=10,
        )
        np.testing.assert_array_equal(stored_ids(taker.address), taken)
        assert held.table.info().size == ROWS  # only the rows it held before: its two batches still wait
    finally:
        writer.close()


@pytest.mark.timeout(120)
def test_back_pressure_holds_every_backlog_at_its_bound_until_the_shards_take_rows_again(shard):
    """Each shard's rate limiter admits 40 rows before anything samples (min size 20, tolerance 20): then the
    writer fills each backlog to max_in_flight and no further, waits (timeout: DeadlineExceededError; `stop`: None)
    and resumes once a learner samples."""
    limiter = (
        "--min-size-to-sample",
        "20",
        "--samples-per-insert",
        "1",
        "--samples-per-insert-tolerance",
        "20",
    )
    shards = [shard(name, *limiter) for name in ("a", "b")]
    addresses = [s.address for s in shards]
    with ShardedWriter(addresses, max_in_flight=3, timeout=30) as writer:
        feed = Feed(writer)
        peak = 0
        with pytest.raises(DeadlineExceededError, match="every backlog full"):
            for _ in range(100):
                feed.insert(timeout=2.0)
                peak = max(peak, *writer.backlog().values())
        assert peak <= 3 and writer.backlog() == dict.fromkeys(addresses, 3)

        def stored() -> int:
            total = 0
            for address in addresses:
                with ReplayClient(address, timeout=10) as client:
                    total += client.info().inserted_total
            return total

        # Nothing accepted was lost: stored or still waiting in a backlog.
        wait_until(
            lambda: stored() + ROWS * sum(writer.backlog().values()) == feed.rows,
            "admitted rows acknowledged",
        )
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        assert feed.insert(stop=stop) is None  # ended by `stop`, nothing queued
        assert writer.backlog() == dict.fromkeys(addresses, 3)
        for address in addresses:  # a learner samples: the limiters admit rows again
            with ReplayClient(address, timeout=10) as client:
                client.sample(40)
        writer.flush(timeout=30)
        assert stored() == feed.rows


class MutableName:
    """What a DNS name resolves to, changed by the test (a headless Service whose StatefulSet is scaled)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)

    def __call__(self, name: str, port: int) -> list[str]:
        assert name == "apexrl-replay"
        return [a.rsplit(":", 1)[0] for a in self.addresses if int(a.rsplit(":", 1)[1]) == port]


@pytest.mark.timeout(150)
def test_shards_a_name_gains_join_the_rotation_and_those_it_loses_leave_it(shard):
    port = free_port()
    # Two shards on one port and two loopback addresses, as pods of a StatefulSet share their port.
    a, b = (shard(name, port=port, host=f"127.0.0.{i}") for i, name in ((2, "a"), (3, "b")))
    name = MutableName(a.address)
    with ShardedWriter([f"dns:///apexrl-replay:{port}"], resolve_every=0.2, resolver=name) as writer:
        feed = Feed(writer)
        assert writer.addresses == [a.address]
        assert {feed.insert().address for _ in range(3)} == {a.address}
        name.addresses.append(b.address)  # scaled up
        wait_until(lambda: feed.insert().address == b.address, "a batch goes to the shard that joined")
        assert writer.addresses == [a.address, b.address]
        writer.flush(timeout=30)
        name.addresses.remove(a.address)  # scaled down

        def insert_and_flush() -> None:  # a leaves with an empty backlog: nothing of it is dropped
            feed.insert()
            writer.flush(timeout=30)

        wait_until(lambda: insert_and_flush() or writer.addresses == [b.address], "a leaves the rotation")
        assert {feed.insert().address for _ in range(3)} == {b.address}
        writer.flush(timeout=30)
        assert writer.dropped_batches == 0  # a's rows stay on a (its process lives on)
    assert_every_row_once([a.address, b.address], feed.rows)

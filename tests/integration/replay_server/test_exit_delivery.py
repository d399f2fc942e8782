"""No silent drop at exit (issue 31, item 5): a program that inserts and ends without flush() or close() has its
rows delivered within a bounded time (the SDK's ReplayClient and ShardedWriter alike), or is told on stderr how
many rows were lost and where. Real programs in their own processes, real shards on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from apexrl.replay_server import ReplayTable, TableConfig
from apexrl.replay_server.client.insert_stream import EXIT_DELIVERY_SECONDS
from apexrl.replay_server.server.service import create_replay_server

PROGRAM = """
import sys
import numpy as np
from apexrl.replay_server import ReplayClient, ShardedWriter
addresses = sys.argv[2:]
writer = ReplayClient(addresses[0], timeout=30) if sys.argv[1] == "client" else ShardedWriter(addresses)
for i in range(10):
    writer.insert({"x": np.full((100, 3), i, np.float32)})
print("inserted", flush=True)
"""  # and ends: no flush(), no close()


@pytest.fixture
def shards():
    started = []
    for _ in range(2):
        table = ReplayTable(TableConfig(capacity=10_000))
        started.append((table, create_replay_server(table, "127.0.0.1:0")))
    yield started
    for _, shard in started:
        shard.server.stop(0).wait(10)


def run(kind: str, *addresses: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, kind, *addresses],
        capture_output=True,
        text=True,
        timeout=EXIT_DELIVERY_SECONDS + 60,
    )


@pytest.mark.parametrize("kind", ["client", "sharded"])
def test_rows_a_program_inserted_and_never_flushed_are_delivered_when_it_ends(shards, kind):
    done = run(kind, *(f"127.0.0.1:{shard.port}" for _, shard in shards))
    assert done.returncode == 0 and done.stdout.strip() == "inserted", done.stderr[-2000:]
    assert sum(table.info().size for table, _ in shards) == 1000
    assert "apexrl:" not in done.stderr, done.stderr[-2000:]


def test_rows_no_shard_acknowledged_are_reported_on_stderr_when_the_program_ends():
    """A listener that accepts connections and never answers (a hung shard): the program waits the bounded time,
    then says how many rows were lost and where, and ends."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        done = run("client", address)
        took = time.monotonic() - started
    assert done.returncode == 0 and done.stdout.strip() == "inserted", done.stderr[-2000:]
    assert f"apexrl: 1000 rows in 10 batches inserted to {address} were not acknowledged" in done.stderr
    assert EXIT_DELIVERY_SECONDS <= took < EXIT_DELIVERY_SECONDS + 50, took

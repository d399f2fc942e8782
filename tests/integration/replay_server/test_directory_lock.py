"""Two real shard processes never share a directory: while one runs with --checkpoint-dir DIR, a second one given
DIR, as its checkpoint directory or as its write-ahead log's, exits with status 2 and one line naming DIR and the
holder's pid, before it reads or writes anything there; the first one goes on and checkpoints as before."""

from __future__ import annotations

import signal
import subprocess
import sys

from apexrl.actor import ReplayClient
from apexrl.replay_server.durability.checkpointer import Checkpointer
from apexrl.replay_server.durability.directory_lock import LOCK_NAME
from tests.conftest import cartpole_batch, start_shard_process


def refused_shard(*args: str) -> str:
    """The one line a second `apexrl replay ARGS` refuses with (exit status 2)."""
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "replay", "--port", "0", "--metrics-port", "-1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


def test_a_second_shard_is_refused_a_directory_a_running_shard_holds(tmp_path):
    directory = tmp_path / "ck"
    first = start_shard_process(tmp_path, "first", "--capacity", "500", "--checkpoint-dir", str(directory))
    try:
        with ReplayClient(first.address) as client:
            client.insert(cartpole_batch(100))
            client.flush()
        held = f"is in use by another replay shard (pid {first.process.pid} holds {directory / LOCK_NAME})"
        assert refused_shard("--capacity", "500", "--checkpoint-dir", str(directory)) == (
            f"apexrl replay: error: --checkpoint-dir {directory} {held}: give each shard its own directory"
        )
        assert refused_shard(
            "--capacity", "500", "--checkpoint-dir", str(tmp_path / "own"), "--wal", str(directory)
        ) == (f"apexrl replay: error: --wal {directory} {held}: give each shard its own directory")
        assert not Checkpointer.list_files(directory), "a refused shard wrote into the held directory"
        assert first.process.poll() is None
    finally:
        assert first.stop(signal.SIGTERM, timeout=30) == 0
    (saved,) = Checkpointer.list_files(directory)  # the first shard's final checkpoint, whole
    assert saved.name == "checkpoint-0000000001.apexrl"

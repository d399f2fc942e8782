"""A shard SIGKILLed while it writes a checkpoint (`apexrl replay --checkpoint-dir`): the file being written was a
temporary one, so nothing lies under its final name, the previous checkpoint is restored at the next start with no
corrupt file to set aside, and the stray temporary file is removed (docs/reliability.md §2, "Atomic and checked")."""

from __future__ import annotations

import signal
import threading

import pytest

from apexrl.actor import ReplayClient
from apexrl.replay_server.durability.checkpoint import CheckpointReader
from apexrl.replay_server.durability.checkpointer import Checkpointer
from apexrl.replay_server.durability.directory_lock import LOCK_NAME
from tests.conftest import cartpole_batch, start_shard_process, wait_until


@pytest.mark.timeout(120)
def test_a_shard_killed_mid_checkpoint_leaves_the_previous_one_and_nothing_under_the_new_name(tmp_path):
    directory = tmp_path / "ck"
    # Paced at 10 kB/s: a checkpoint's rows (one chunk of 10,000 slots, 560 kB) are written at once, then the pacing
    # holds the writer back for almost a minute before the footer and the rename: the kill lands in that pause.
    args = ["--capacity", "10000", "--checkpoint-dir", str(directory), "--checkpoint-every", "0"]
    args += ["--checkpoint-max-mb-per-s", "0.01"]
    shard = start_shard_process(tmp_path, "first", *args)
    port = shard.address.rsplit(":", 1)[1]
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100))
        client.flush(timeout=20)
    assert shard.stop(signal.SIGTERM, timeout=30) == 0  # the final checkpoint (unpaced): checkpoint 1
    (first,) = Checkpointer.list_files(directory)
    second_call: list[BaseException | None] = []
    caller: threading.Thread | None = None
    shard = start_shard_process(tmp_path, "second", *args, "--port", port)
    try:
        with ReplayClient(shard.address) as client:
            client.insert(cartpole_batch(200, 100))
            client.flush(timeout=20)

        def checkpoint_again() -> None:
            with ReplayClient(shard.address) as other:
                try:
                    other.checkpoint(timeout=90)
                    second_call.append(None)
                except Exception as err:  # noqa: BLE001 (the shard is killed under it: checked below)
                    second_call.append(err)

        caller = threading.Thread(target=checkpoint_again)
        caller.start()

        def partial() -> list:
            return [p for p in directory.iterdir() if p != first]

        wait_until(
            lambda: any(p.stat().st_size > 100_000 for p in partial()),
            "the second checkpoint half written",
            timeout=30,
        )
        shard.process.kill()
        shard.process.wait(10)
        caller.join(30)
        assert len(second_call) == 1 and second_call[0] is not None, (
            f"checkpoint 2 was not cut short: {second_call}"
        )
        left = sorted(p.name for p in directory.iterdir() if p.name != LOCK_NAME)
        assert left == [".checkpoint-0000000002.apexrl.tmp", "checkpoint-0000000001.apexrl"], (
            f"a shard killed while writing checkpoint 2 left {left}: nothing may lie under a checkpoint's final "
            f"name until it is whole"
        )
        with CheckpointReader(first) as reader:
            reader.verify()
            assert reader.state.next_key == 100

        shard = start_shard_process(tmp_path, "third", *args, "--port", port)
        with ReplayClient(shard.address) as client:
            info = client.info()
        assert (info.inserted_total, info.size) == (100, 100)
    finally:
        if caller is not None:
            caller.join(30)
        if shard.process.poll() is None:
            assert shard.stop(signal.SIGTERM, timeout=30) == 0
    log = (tmp_path / "third.log").read_text()
    assert "left by a checkpoint that never finished" in log and "restored 100 rows (keys 0..99)" in log
    assert "CORRUPT CHECKPOINT" not in log and not list(directory.glob("*.corrupt"))
    assert not (directory / ".checkpoint-0000000002.apexrl.tmp").exists()

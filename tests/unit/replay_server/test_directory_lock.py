"""One shard per directory (replay_server/durability/directory_lock.py): a held directory is refused with a message
naming it and its holder, a released one is free again, and a shard's write-ahead log may live in its own
checkpoint directory. `flock` locks belong to open files, so a second acquire in this process stands for a second
shard; tests/integration/replay_server/test_directory_lock.py shows it with real processes."""

from __future__ import annotations

import os

import pytest

from apexrl.common.settings import SettingsError
from apexrl.replay_server.durability.directory_lock import LOCK_NAME, DirectoryLock, lock_directories


def test_a_held_directory_is_refused_naming_it_and_its_holder(tmp_path):
    directory = tmp_path / "ck" / "shard-0"
    lock = DirectoryLock.acquire(directory, "--checkpoint-dir")  # created when missing
    assert (directory / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(SettingsError) as err:
        DirectoryLock.acquire(directory, "--checkpoint-dir")
    assert str(err.value) == (
        f"--checkpoint-dir {directory} is in use by another replay shard (pid {os.getpid()} holds "
        f"{directory / LOCK_NAME}): give each shard its own directory"
    )
    lock.release()
    lock.release()  # twice is harmless
    DirectoryLock.acquire(directory, "--checkpoint-dir").release()


def test_a_shards_log_in_its_checkpoint_directory_is_locked_once_and_a_refusal_keeps_no_lock(tmp_path):
    locks = lock_directories(
        [("--checkpoint-dir", tmp_path / "a"), ("--wal", tmp_path / "a"), ("--wal", None)]
    )
    assert len(locks) == 1
    with pytest.raises(SettingsError, match="--wal .*/a is in use"):
        lock_directories([("--checkpoint-dir", tmp_path / "b"), ("--wal", tmp_path / "a")])
    DirectoryLock.acquire(tmp_path / "b", "--checkpoint-dir").release()  # b was released with the refusal
    for lock in locks:
        lock.release()

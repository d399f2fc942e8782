"""With the write-ahead log, falling back past several bad checkpoints loses no acknowledged row: the log is truncated
only up to the oldest checkpoint kept (docs/reliability.md §2, "No silent loss"). With `--checkpoint-keep 3` a
shard can fall back two checkpoints, which tells "the oldest kept" from "the newest kept" (with 2 kept and one
fallback both choices keep the same segments)."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.replay_server.durability.checkpoint import CheckpointReader
from tests.conftest import cartpole_batch, start_shard_process
from tests.support.tampered import rewrite_checkpoint


def rows_of(path) -> dict[int, int]:
    """key -> the `action` id stored under it, of a checkpoint file."""
    with CheckpointReader(path) as reader:
        ids: dict[int, int] = {}
        for first, columns, _ in reader.blocks():
            ids.update(
                zip(range(first, first + len(columns["action"])), columns["action"].tolist(), strict=True)
            )
        return ids


@pytest.mark.timeout(120)
def test_falling_back_two_of_three_kept_checkpoints_loses_no_acknowledged_row(tmp_path):
    args = [
        "--capacity",
        "10000",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--wal",
        str(tmp_path / "wal"),
        "--checkpoint-every",
        "0",
        "--checkpoint-keep",
        "3",
    ]
    shard = start_shard_process(tmp_path, "first", *args)
    port = shard.address.rsplit(":", 1)[1]
    with ReplayClient(shard.address) as client:
        for start in (0, 100, 200, 300):
            client.insert(cartpole_batch(100, start))
            client.flush()  # acknowledged: logged and fsynced
            if start < 300:
                client.checkpoint()  # at keys 100, 200 and 300, all three kept
    shard.process.kill()
    shard.process.wait(10)
    kept = sorted((tmp_path / "ck").glob("checkpoint-*.apexrl"))
    assert [rows_of(p) for p in kept] == [{k: k for k in range(n)} for n in (100, 200, 300)]
    # The newest two are bad: one torn, one whose checksums hold over an impossible priority.
    newest, middle = kept[2], kept[1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    rewrite_checkpoint(middle, leaves=lambda leaves: np.where(leaves > 0, np.inf, leaves))

    shard = start_shard_process(tmp_path, "second", *args, "--port", port)
    try:
        with ReplayClient(shard.address) as client:
            info = client.info()
            assert (info.inserted_total, info.size) == (400, 400), (
                f"falling back two checkpoints, the shard got back {info.size} of the 400 acknowledged rows: the "
                f"log must be kept from the oldest checkpoint kept"
            )
            result = client.checkpoint()
    finally:
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    assert rows_of(result.path) == {key: key for key in range(400)}  # every acknowledged row, under its key
    log = (tmp_path / "second.log").read_text()
    assert log.count("CORRUPT CHECKPOINT skipped") == 2
    assert "restored 100 rows (keys 0..99)" in log and "replayed 300 rows from the write-ahead log" in log
    assert "WRITE-AHEAD LOG GAP" not in log

"""Compressed image columns through a real `apexrl replay` process: frames go in and come back as they were sent
(the shard never decompresses), with each row's writer; the shard's capacity in bytes evicts the oldest rows and
shows in Info and /metrics; a checkpoint keeps the frames across a restart; bad frames are refused at insert by
their length or magic number."""

from __future__ import annotations

import re
import signal
import socket
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from apexrl.common.compression import CompressedColumn, compress, decompress
from apexrl.common.errors import InvalidArgumentError
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import frame_ids, pixel_batch, pixel_frames, start_shard_process

SIGNATURE = (
    "obs:uint8[2,16,16]@zstd,action:int64[],reward:float32[],discount:float32[],next_obs:uint8[2,16,16]@zstd"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


@pytest.mark.timeout(120)
def test_frames_go_in_and_come_back_as_sent_within_the_bytes_limit_and_survive_a_restart(tmp_path):
    one = pixel_batch(1)
    row_bytes = 16 + one["obs"].nbytes + one["next_obs"].nbytes
    max_bytes = 300 * row_bytes
    metrics_port = _free_port()
    options = (
        "--capacity",
        "1000",
        "--max-bytes",
        str(max_bytes),
        "--signature",
        SIGNATURE,
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    shard = start_shard_process(tmp_path, "shard", *options, "--metrics-port", str(metrics_port))
    sent = {}
    with ReplayClient(shard.address, writer_id="actor-7") as client:
        for start in range(0, 500, 50):
            batch = pixel_batch(50, start)
            sent.update(zip(range(start, start + 50), batch["obs"].frames(), strict=True))
            client.insert(batch, priorities=np.ones(50))
        client.flush(timeout=30)
        info = client.info()
        sample = client.sample(256)
        result = client.checkpoint()

    # Bytes, not rows, bounded the shard: the oldest rows went first.
    assert info.signature is not None and str(info.signature) == SIGNATURE
    assert 270 <= info.size <= 300 and info.stored_bytes <= max_bytes and info.max_bytes == max_bytes
    assert info.evicted_total == 500 - info.size and info.capacity == 1000
    # The frames come back byte for byte, each with the id of the writer that stored it.
    obs = sample.columns["obs"]
    assert isinstance(obs, CompressedColumn) and obs.compression == "zstd"
    ids = sample.columns["action"]
    assert ids.min() >= 500 - info.size
    assert [obs.frame(i) for i in range(256)] == [sent[i] for i in ids.tolist()]
    np.testing.assert_array_equal(decompress(sample.columns["next_obs"])[0], pixel_frames(ids + 1))
    assert set(sample.writers) == {"actor-7"}
    m = _scrape(metrics_port)
    assert m["apexrl_replay_stored_bytes"] == info.stored_bytes and m["apexrl_replay_max_bytes"] == max_bytes
    assert m["apexrl_replay_size_rows"] == info.size
    assert m["apexrl_replay_inserted_bytes_total"] == sum(16 + len(f) for f in sent.values()) + sum(
        pixel_batch(50, s)["next_obs"].nbytes for s in range(0, 500, 50)
    )

    # A restart restores the frames and their writers from the checkpoint.
    assert shard.stop(signal.SIGTERM) == 0
    assert result.rows == info.size
    restarted = start_shard_process(tmp_path, "restarted", *options)
    try:
        with ReplayClient(restarted.address) as client:
            again = client.sample(64)
            assert client.info().stored_bytes == info.stored_bytes
        held = again.columns["obs"]
        assert [held.frame(i) for i in range(64)] == [sent[i] for i in again.columns["action"].tolist()]
        assert set(again.writers) == {"actor-7"}
    finally:
        restarted.stop(signal.SIGKILL)


@pytest.mark.timeout(60)
def test_frames_of_the_wrong_kind_are_refused_at_insert(tmp_path):
    shard = start_shard_process(tmp_path, "shard", "--capacity", "100", "--signature", SIGNATURE)
    try:
        good = pixel_batch(4)
        raw = dict(good, obs=pixel_frames(range(4)))  # pixels where frames are declared
        not_zstd = dict(
            good, obs=CompressedColumn("zstd", np.dtype(np.uint8), (2, 16, 16), b"\x00" * 40, np.full(4, 10))
        )
        lz4 = dict(good, obs=compress(pixel_frames(range(4)), "lz4"))
        for batch, message in (
            (
                raw,
                "column 'obs' is uint8[2, 16, 16] per row, the table signature wants uint8[2, 16, 16]@zstd",
            ),
            (not_zstd, "frame 0 does not start with the zstd magic number"),
            (lz4, "column 'obs' is uint8[2, 16, 16]@lz4 per row"),
        ):
            with ReplayClient(shard.address) as client:
                client.insert(batch)
                with pytest.raises(InvalidArgumentError, match=re.escape(message)):
                    client.flush(timeout=10)
        with ReplayClient(shard.address) as client:
            client.insert(good)
            client.flush(timeout=10)
            assert client.info().size == 4  # only the good batch was stored
            sample = client.sample(8)
            np.testing.assert_array_equal(
                frame_ids(decompress(sample.columns["obs"])[0]), sample.columns["action"]
            )
    finally:
        shard.stop(signal.SIGKILL)

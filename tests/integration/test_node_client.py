"""The .proto files are the whole contract: the Node.js reference clients (examples/node), written from them alone,
insert (transitions, and sequence items), are de-duplicated, sample and update priorities on a real shard process,
and the Python SDK then sees exactly what they did.

Needs `node` (>= 18) and `npm ci --prefix examples/node` (scripts/setup.sh runs it); without them this test fails,
on purpose: CI installs both.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from apexrl.actor import ReplayClient

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "examples" / "node"
TOKEN = "node-client-token"
BATCHES, ROWS, SAMPLE = 5, 64, 32
SIGNATURE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"


@pytest.fixture
def node() -> str:
    """The `node` executable; fails (does not skip) when Node.js or the client's packages are missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "`node` is not on PATH: install Node.js >= 18 to run the reference client (CI installs it)"
        )
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.fail(
            "examples/node/node_modules is missing: run `npm ci --prefix examples/node` "
            "(scripts/setup.sh does when npm is on PATH)"
        )
    return node


@contextlib.contextmanager
def shard_process(tmp_path, *extra: str) -> Iterator[str]:
    """A real `apexrl replay` process on a free port, requiring a token; stopped with SIGTERM afterwards."""
    port_file, log_file = tmp_path / "shard.port", tmp_path / "shard.log"
    with open(log_file, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "replay",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-port",
                "-1",
                "--port-file",
                str(port_file),
                "--token",
                TOKEN,
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():  # written (atomically) once the shard serves
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the shard did not start:\n{log_file.read_text()}")
            time.sleep(0.05)
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture
def shard_address(tmp_path) -> Iterator[str]:
    with shard_process(tmp_path) as address:
        yield address


def run_node(node: str, script: str, *args: str) -> dict:
    """Run a client script of examples/node; its last line of output, as JSON (fails the test if it failed)."""
    try:
        run = subprocess.run([node, script, *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the node client did not finish within 60 s:\n{err.stdout}\n{err.stderr}")
    assert run.returncode == 0, f"the node client failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_node_client_speaks_the_protocol_from_the_protos_alone(node, shard_address):
    result = run_node(
        node,
        "replay_client.js",
        shard_address,
        "--token",
        TOKEN,
        "--batches",
        str(BATCHES),
        "--rows",
        str(ROWS),
        "--sample",
        str(SAMPLE),
    )
    assert result["rows_inserted"] == BATCHES * ROWS
    assert (result["merged_batches"], result["merged_acks"]) == (
        2,
        1,
    )  # batches 4 and 5 in one request, one ack
    assert result["duplicates_acked"] == 1
    assert (result["sampled_rows"], result["applied_updates"], result["stale_updates"]) == (SAMPLE, SAMPLE, 0)

    with ReplayClient(shard_address, token=TOKEN) as client:
        info = client.info()
        # The 64-bit incarnation went through JavaScript as a string, without rounding.
        assert info.incarnation == int(result["incarnation"])
        assert str(info.signature) == SIGNATURE
        # Exactly the rows Node inserted, the resent batch counted as a duplicate and not stored twice.
        assert (info.size, info.inserted_total, info.duplicate_batches_total) == (BATCHES * ROWS,) * 2 + (1,)
        assert (info.sampled_total, info.updated_total, info.stale_updates_total) == (SAMPLE, SAMPLE, 0)
        # Node's float32 priorities were 0.5 + (row % 4); its updates were in [2, 3): the largest raw priority is 3.5.
        assert info.max_priority == 3.5

        # Every row holds what Node encoded under its key (little-endian float32 / int64 bytes, C order).
        batch = client.sample(1024)
    keys = batch.keys.astype(np.int64)
    np.testing.assert_array_equal(batch.columns["action"], keys)
    np.testing.assert_array_equal(
        batch.columns["obs"], np.repeat(keys[:, None], 4, axis=1).astype(np.float32)
    )
    np.testing.assert_array_equal(batch.columns["next_obs"], batch.columns["obs"] + 1)
    np.testing.assert_array_equal(batch.columns["reward"], np.ones(1024, np.float32))
    np.testing.assert_array_equal(batch.columns["discount"], np.full(1024, 0.97, np.float32))


def test_node_client_writes_sequence_items(node, tmp_path):
    """examples/node/sequence_client.js writes an episode's overlapping windows to a sequence shard from the protos
    alone; the Python SDK then samples exactly those windows."""
    with shard_process(tmp_path, "--max-sequence-length", "8") as address:
        result = run_node(node, "sequence_client.js", address, "--token", TOKEN, "--steps", "30")
        assert (result["steps_inserted"], result["items_inserted"], result["refused_code"]) == (30, 7, 3)
        assert result["applied_updates"] == result["sampled_items"]
        with ReplayClient(address, token=TOKEN) as client:
            info = client.info()
            batch = client.sample(64)
    assert (info.size, info.steps, info.max_sequence_length) == (7, 30, 8)
    assert str(info.item_signature) == "state:float32[3]"
    obs = batch.columns["obs"].reshape(64, 8, 2)[:, :, 0]
    starts = batch.keys.astype(int)  # one episode on a fresh shard: an item's key is its first step number
    np.testing.assert_array_equal(batch.item_columns["state"][:, 0], starts)
    for row, start, length in zip(obs, starts, batch.lengths, strict=True):
        np.testing.assert_array_equal(row[:length], start + np.arange(length))
    assert set(starts.tolist()) == {0, 4, 8, 12, 16, 20, 24}

"""Shared fixtures: real replay shards on 127.0.0.1, in this process or as child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from apexrl.common.grpc_util import wait_for_health
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.server.service import create_replay_server

# On CI (CI=true) a skip fails the run unless tests/allowed_skips.py lists it with its reason.
# time_budget: every test within its budget, the slowest named at the end; reaper: what a test left running is stopped;
# worker_groups: a module (the container tests: all of them) on one xdist worker.
pytest_plugins = (
    "tests.support.skip_policy",
    "tests.support.time_budget",
    "tests.support.reaper",
    "tests.support.worker_groups",
)


def wait_until(condition, what: str, timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds. Tests synchronise on conditions
    like this one, never on sleeps."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting until {what}"
        time.sleep(0.01)


@dataclass
class Shard:
    address: str
    table: ReplayTable
    server: object
    registry: object


@pytest.fixture
def make_shard():
    """Start in-process shards with a given TableConfig (and server options); all stopped after the test."""
    started: list[Shard] = []

    def make(config: TableConfig | None = None, **server_options) -> Shard:
        table = ReplayTable(config or TableConfig(capacity=1000, seed=0))
        made = create_replay_server(table, "127.0.0.1:0", **server_options)
        server, port, registry = made.server, made.port, made.registry
        shard = Shard(f"127.0.0.1:{port}", table, server, registry)
        started.append(shard)
        return shard

    yield make
    for shard in started:
        shard.table.close()
        shard.server.stop(0)


@pytest.fixture
def shard(make_shard) -> Shard:
    return make_shard()


def cartpole_batch(rows: int, start: int = 0) -> dict[str, np.ndarray]:
    """A CartPole-shaped batch whose `action` column numbers the rows (start, start+1, ...), to track them."""
    ids = np.arange(start, start + rows)
    return {
        "obs": np.tile(ids[:, None], (1, 4)).astype(np.float32),
        "action": ids.astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.97, dtype=np.float32),
        "next_obs": np.tile(ids[:, None] + 1, (1, 4)).astype(np.float32),
    }


def pixel_frames(ids, shape: tuple[int, ...] = (2, 16, 16)) -> np.ndarray:
    """uint8 images [len(ids), *shape] that name their row: a flat background with the id's two low bytes in the
    first two pixels (and a block that moves with it, so frames differ like real ones)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full((len(ids), *shape), 87, dtype=np.uint8)
    flat = out.reshape(len(ids), -1)
    flat[:, 0], flat[:, 1] = ids % 256, ids // 256 % 256
    for i, row in zip(ids.tolist(), flat, strict=True):
        row[8 + i % 64 : 12 + i % 64] = 236
    return out


def frame_ids(frames: np.ndarray) -> np.ndarray:
    """The ids pixel_frames wrote into decompressed frames."""
    flat = frames.reshape(len(frames), -1).astype(np.int64)
    return flat[:, 0] + 256 * flat[:, 1]


def pixel_batch(rows: int, start: int = 0, compression: str = "zstd") -> dict:
    """A batch like cartpole_batch's (`action` numbers the rows) with compressed image observations: obs names
    its row's id, next_obs the id + 1 (see pixel_frames)."""
    from apexrl.common.compression import compress

    ids = np.arange(start, start + rows)
    return {
        "obs": compress(pixel_frames(ids), compression),
        "action": ids.astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.97, dtype=np.float32),
        "next_obs": compress(pixel_frames(ids + 1), compression),
    }


@dataclass
class ShardProcess:
    address: str
    process: subprocess.Popen

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def start_shard_process(tmp_path: Path, name: str, *extra: str, host: str = "127.0.0.1") -> ShardProcess:
    """Run `apexrl replay` as a child process on `host` and a free port (or --port in `extra`); wait until it
    reports SERVING."""
    port_file = tmp_path / f"{name}.port"
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (kept open for the child's lifetime)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "replay",
            "--host",
            host,
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--port-file",
            str(port_file),
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"shard {name} did not start: {(tmp_path / f'{name}.log').read_text()}")
        time.sleep(0.05)
    address = f"{host}:{int(port_file.read_text())}"
    wait_for_health(address, timeout=20)
    return ShardProcess(address, process)


@pytest.fixture
def shard_processes(tmp_path) -> Iterator[callable]:
    started: list[ShardProcess] = []

    def start(n: int, *extra: str) -> list[ShardProcess]:
        procs = [start_shard_process(tmp_path, f"shard{len(started) + i}", *extra) for i in range(n)]
        started.extend(procs)
        return procs

    yield start
    for proc in started:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait(10)

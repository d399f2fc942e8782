"""`apexrl learner` (learner/main.py) as a real process against a real shard: it trains, writes priorities back,
serves its weights from the parameter service it hosts, checkpoints and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from apexrl.actor import ParameterClient, ReplayClient
from apexrl.algorithms.checkpoint import load_checkpoint, save_checkpoint
from apexrl.algorithms.dqn.acting import NumpyDuelingPolicy
from apexrl.replay_server.core.table import TableConfig
from tests.support.checkpoints import dqn_checkpoint


def wait_until(condition, what: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the learner exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def filled_shard(make_shard, rows: int, seed: int):
    """An in-process shard holding `rows` random CartPole-shaped transitions."""
    shard = make_shard(TableConfig(capacity=1000, alpha=0.6, seed=0))
    rng = np.random.default_rng(seed)
    with ReplayClient(shard.address) as client:
        client.insert(
            {
                "obs": rng.normal(size=(rows, 4)).astype(np.float32),
                "action": rng.integers(0, 2, rows),
                "reward": np.ones(rows, np.float32),
                "discount": np.full(rows, 0.97, np.float32),
                "next_obs": rng.normal(size=(rows, 4)).astype(np.float32),
            }
        )
        client.flush()
    return shard


def learner_process(tmp_path, *argv: str) -> subprocess.Popen:
    log = open(tmp_path / "learner.log", "w")  # noqa: SIM115 (kept open for the child's lifetime)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "learner",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--seed",
            "0",
            *argv,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.timeout(120)
def test_a_learner_process_trains_from_a_shard_serves_weights_and_checkpoints_on_sigterm(
    tmp_path, make_shard
):
    shard = filled_shard(make_shard, rows=500, seed=0)
    port_file = tmp_path / "learner.port"
    process = learner_process(
        tmp_path,
        "--replay",
        shard.address,
        "--run-dir",
        str(tmp_path / "run"),
        "--port-file",
        str(port_file),
        "--min-replay-size",
        "100",
        "--batch-size",
        "32",
        "--hidden-sizes",
        "16",
        "--publish-every",
        "5",
        "--sample-batches-per-call",
        "1",
    )
    try:
        wait_until(port_file.exists, "it wrote its port file", process)
        with ParameterClient(f"127.0.0.1:{int(port_file.read_text())}", timeout=5) as params:
            wait_until(lambda: params.version() >= 3, "it published 3 versions", process)
            version, weights = params.fetch(0)
        assert version >= 3
        policy = NumpyDuelingPolicy(weights)  # what actors run: CartPole's 4 inputs, 2 actions
        assert (policy.obs_dim, policy.num_actions) == (4, 2)
        wait_until(lambda: shard.table.info().updated_total > 0, "priorities came back to the shard", process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = (tmp_path / "learner.log").read_text()
    assert "received SIGTERM" in log and "final checkpoint" in log and "Traceback" not in log
    checkpoint = load_checkpoint(tmp_path / "run")
    assert (
        checkpoint.updates >= 10
        and checkpoint.weight_version >= version
        and checkpoint.architecture["hidden_sizes"] == [16]
    )
    info = shard.table.info()
    assert info.sampled_total >= 32 * checkpoint.updates and info.stale_updates_total == 0


@pytest.mark.timeout(60)
def test_a_checkpoint_of_another_shape_is_refused_with_exit_status_2(tmp_path):
    import torch

    from apexrl.algorithms.dqn.networks import DuelingQNetwork

    torch.manual_seed(0)
    save_checkpoint(
        tmp_path / "checkpoints" / "checkpoint.pt",
        dqn_checkpoint(DuelingQNetwork(4, 2, (8,)), (8,), updates=5, weight_version=2),
    )
    process = learner_process(tmp_path, "--replay", "127.0.0.1:1", "--run-dir", str(tmp_path))
    code = process.wait(60)
    log = (tmp_path / "learner.log").read_text()
    assert "has another network: hidden_sizes [8] there, [256, 256] in the configuration" in log
    assert code == 2 and "apexrl learner: error:" in log and "Traceback" not in log


@pytest.mark.timeout(120)
def test_a_restarted_learner_publishes_above_what_a_standalone_parameter_service_holds(tmp_path, make_shard):
    """A standalone parameter service outlives the learner and may hold newer versions than the learner's last
    checkpoint: the restarted learner resumes from its checkpoint and publishes above the service's version
    (a lower one would be refused, and the learner would crash)."""
    from apexrl.parameter_server.service import create_parameter_server

    shard = filled_shard(make_shard, rows=300, seed=1)
    made = create_parameter_server("127.0.0.1:0")
    server, port, store = made.server, made.port, made.store
    args = (
        "--replay",
        shard.address,
        "--params",
        f"127.0.0.1:{port}",
        "--run-dir",
        str(tmp_path / "run"),
        "--min-replay-size",
        "100",
        "--batch-size",
        "32",
        "--hidden-sizes",
        "16",
        "--publish-every",
        "5",
        "--sample-batches-per-call",
        "1",
        "--max-updates",
        "20",
    )
    try:
        first = learner_process(tmp_path, *args)
        assert first.wait(60) == 0
        resumed_from = load_checkpoint(tmp_path / "run").weight_version
        assert store.version == resumed_from >= 4
        store.publish({"w": np.zeros(3, np.float32)}, version=resumed_from + 50)  # newer than the checkpoint
        second = learner_process(tmp_path, *args[:-1], "40")
        assert second.wait(60) == 0, (tmp_path / "learner.log").read_text()[-2000:]
        assert store.version > resumed_from + 50
        assert load_checkpoint(tmp_path / "run").weight_version == store.version
    finally:
        server.stop(0)

"""`apexrl replay` (replay_server/server/main.py) as an operator runs it: Prometheus metrics with the shard's real
numbers, clean SIGTERM, exit status 2 for a bad configuration."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from apexrl.actor import ReplayClient
from tests.conftest import cartpole_batch, start_shard_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_shard_process_exports_metrics_and_stops_cleanly_on_sigterm(tmp_path):
    metrics_port = _free_port()
    shard = start_shard_process(
        tmp_path, "cli", "--capacity", "300", "--alpha", "1.0", "--metrics-port", str(metrics_port)
    )
    try:
        check_metrics_and_sigterm(shard, metrics_port, tmp_path)
    finally:
        if shard.process.poll() is None:  # a failed check must not leave the shard running
            shard.process.kill()
            shard.process.wait(10)


def check_metrics_and_sigterm(shard, metrics_port: int, tmp_path) -> None:
    with ReplayClient(shard.address) as client:
        for start in range(0, 400, 100):
            client.insert(cartpole_batch(100, start), priorities=np.full(100, 2.0))
        client.flush()
        batch = client.sample(64)
        client.update_priorities(batch.keys, np.full(64, 3.0), incarnation=batch.incarnation)
        client.update_priorities(
            np.array([0, 1], dtype=np.uint64), np.ones(2), incarnation=batch.incarnation
        )  # evicted: stale

    m = _scrape(metrics_port)
    assert m[("apexrl_replay_inserted_rows_total", ())] == 400
    assert m[("apexrl_replay_evicted_rows_total", ())] == 100
    assert m[("apexrl_replay_size_rows", ())] == 300
    assert m[("apexrl_replay_capacity_rows", ())] == 300
    assert m[("apexrl_replay_sampled_rows_total", ())] == 64
    assert m[("apexrl_replay_priority_updates_total", ())] == 64
    assert m[("apexrl_replay_stale_priority_updates_total", ())] == 2
    assert m[("apexrl_replay_inserted_bytes_total", ())] == 400 * 48
    distinct = len(set(batch.keys.tolist()))
    assert m[("apexrl_replay_total_priority", ())] == 2.0 * (300 - distinct) + 3.0 * distinct
    # One Insert message may carry several batches (the SDK merges batches queued behind an unanswered one).
    inserts = m[("apexrl_replay_request_duration_seconds_count", (("method", "Insert"),))]
    assert 1 <= inserts <= 4
    for method, calls in (("Insert", inserts), ("Sample", 1), ("UpdatePriorities", 2)):
        assert m[("apexrl_replay_request_duration_seconds_count", (("method", method),))] == calls
        assert (
            m[("apexrl_replay_request_duration_seconds_bucket", (("le", "+Inf"), ("method", method)))]
            == calls
        )

    assert shard.stop(signal.SIGTERM, timeout=15) == 0
    log = (tmp_path / "cli.log").read_text()
    assert (
        "received SIGTERM" in log and "replay shard stopped: 300 rows held, 400 inserted, 64 sampled" in log
    )


def test_bad_configuration_exits_2_with_the_reason(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "replay",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--capacity",
            "10",
            "--min-size-to-sample",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert (
        "apexrl replay: error: --min-size-to-sample: min_size_to_sample (20) exceeds capacity (10)"
        in run.stderr
    )
    assert "serving" not in run.stderr

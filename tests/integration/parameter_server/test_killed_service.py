"""kill -9 of a standalone parameter service (`apexrl params`) under a real learner and a real actor, all separate
processes: the actor keeps acting on its last weights, the learner keeps training, and once the service is back on
its address both use it again (the learner publishes, the actor pulls newer weights). What is lost: the versions
the service held (a restarted service starts empty; the learner's next publish fills it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apexrl.parameter_server.client import ParameterClient
from tests.conftest import start_shard_process, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def role(tmp_path: Path, name: str, *argv: str) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.log", "a")  # noqa: SIM115 (kept open for the child's lifetime)
    return subprocess.Popen(
        [sys.executable, "-m", "apexrl.launcher", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.timeout(180)
def test_a_killed_standalone_parameter_service_is_survived_by_learner_and_actor(tmp_path):
    params_port, learner_metrics, actor_metrics = free_port(), free_port(), free_port()
    params_argv = ("params", "--port", str(params_port), "--metrics-port", "-1")
    shard = start_shard_process(tmp_path, "shard", "--samples-per-insert", "0")
    processes = {"params": role(tmp_path, "params", *params_argv)}
    client = ParameterClient(f"127.0.0.1:{params_port}", timeout=2)
    try:
        processes["learner"] = role(
            tmp_path,
            "learner",
            "learner",
            "--replay",
            shard.address,
            "--params",
            f"127.0.0.1:{params_port}",
            "--port",
            "0",
            "--metrics-port",
            str(learner_metrics),
            "--min-replay-size",
            "200",
            "--batch-size",
            "32",
            "--publish-every",
            "5",
            "--seed",
            "0",
        )
        processes["actor"] = role(
            tmp_path,
            "actor",
            "actor",
            "--params",
            f"127.0.0.1:{params_port}",
            "--replay",
            shard.address,
            "--metrics-port",
            str(actor_metrics),
            "--pull-every",
            "50",
            "--max-steps-per-second",
            "2000",
            "--seed",
            "1",
        )

        def alive_and(condition):
            def check() -> bool:
                for name, process in processes.items():
                    assert process.poll() is None, (
                        f"{name} exited: {(tmp_path / f'{name}.log').read_text()[-2000:]}"
                    )
                try:
                    return condition()
                except OSError:  # metrics not served yet
                    return False

            return check

        wait_until(
            alive_and(lambda: metric(actor_metrics, "apexrl_actor_weight_version") >= 5),
            "the actor pulls versions the learner publishes",
            timeout=90,
        )
        processes.pop("params").kill()  # kill -9
        killed_at = time.monotonic()
        steps = metric(actor_metrics, "apexrl_actor_env_steps_total")
        updates = metric(learner_metrics, "apexrl_learner_updates_total")
        held = metric(actor_metrics, "apexrl_actor_weight_version")
        wait_until(
            alive_and(
                lambda: (
                    metric(actor_metrics, "apexrl_actor_weight_fetch_failures_total") >= 2
                    and metric(actor_metrics, "apexrl_actor_env_steps_total") > steps + 500
                    and metric(learner_metrics, "apexrl_learner_publish_failures_total") >= 2
                    and metric(learner_metrics, "apexrl_learner_updates_total") > updates + 20
                )
            ),
            "the actor acts on its last weights and the learner trains on while the service is down",
            timeout=60,
        )
        assert metric(actor_metrics, "apexrl_actor_weight_version") == held

        processes["params"] = role(tmp_path, "params", *params_argv)  # back on its address, empty
        restarted_at = time.monotonic()
        wait_until(
            alive_and(lambda: metric(actor_metrics, "apexrl_actor_weight_version") > held),
            "the actor takes the weights the learner publishes to the restarted service",
            timeout=60,
        )
        now = time.monotonic()
        print(
            f"\nFAULT parameter service (standalone) kill -9: down {restarted_at - killed_at:.1f} s (by the test), "
            f"whole again {now - restarted_at:.1f} s after its restart; lost: the versions it held"
        )
        assert client.version() > held  # the learner's versions keep increasing across the restart
    finally:
        client.close()
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(30) for name, process in processes.items()}
        shard.stop()
    assert codes == {"learner": 0, "actor": 0, "params": 0}, codes

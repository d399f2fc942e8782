"""The images run as a Kubernetes pod of the manifests runs them: user 10001, read-only root filesystem, every
capability dropped, no new privileges, a writable /tmp only (engine.POD_LIKE), on the host's loopback (`--network
host`, ports chosen free: containers never use podman's bridge).

- A replay container serves gRPC health, reflection and /metrics, stores what a client inserts, and stops with
  status 0 on SIGTERM; its process has the user, capabilities and writable paths the pod spec says.
- A fleet of containers (2 shards, the learner with its parameter service, 2 actors, the evaluator) trains CartPole:
  both shards are written and sampled, the weights version advances and reaches the evaluator; `podman stop` (SIGTERM,
  SIGKILL after the pod's terminationGracePeriodSeconds) stops every container with status 0 well within it; the
  shards' last checkpoints, on volumes, restore in new containers.
"""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apexrl.common.grpc_util import wait_for_health
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import cartpole_batch
from tests.integration.containers import engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# terminationGracePeriodSeconds of the manifests (k8s/base): shards and learner 60 s, actors and evaluator 30 s.
GRACE = {"replay": 60, "learner": 60, "actor": 30, "evaluator": 30}
# Paths a process in the image might try to write; under POD_LIKE only /tmp (and a mounted volume) may be writable.
PROBE_PATHS = ("/", "/opt/apexrl", "/opt/apexrl/lib", "/etc", "/var/tmp", "/run", "/home", "/src", "/tmp")
WRITABLE_PROBE = (
    "import os, sys, tempfile\n"
    "ok = []\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    "        tempfile.TemporaryFile(dir=p).close(); ok.append(p)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(' '.join(ok))\n"
)


def process_status(container: engine.Container) -> dict[str, str]:
    """/proc/PID/status of the container's main process, read from this machine."""
    pid = container.inspect()["State"]["Pid"]
    with open(f"/proc/{pid}/status") as status:
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)


def check_pod_like(container: engine.Container, volumes: tuple[str, ...] = ()) -> None:
    status = process_status(container)
    assert status["Uid"].split()[:2] == ["10001", "10001"] and status["Gid"].split()[:2] == ["10001", "10001"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
    assert status["NoNewPrivs"] == "1", status
    result = container.exec("/opt/apexrl/bin/python", "-c", WRITABLE_PROBE, *PROBE_PATHS, *volumes)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["/tmp", *volumes], f"writable: {result.stdout.split()}"


def services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        return {s.name for answer in answers for s in answer.list_services_response.service}


def metrics(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(engine.http_get(f"http://127.0.0.1:{port}/metrics")):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_a_replay_container_serves_health_reflection_and_metrics_as_a_pod_runs_it(images):
    grpc_port, metrics_port = engine.free_ports(2)
    shard = engine.run_detached(
        images.replay,
        f"apexrl-test-replay-{grpc_port}",
        [
            "replay",
            "--host",
            "127.0.0.1",
            "--port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--capacity",
            "1000",
        ],
    )
    address = f"127.0.0.1:{grpc_port}"
    engine.wait_until(
        lambda: wait_for_health(address, timeout=2) or True,
        "the shard reports SERVING",
        60,
        check=shard.check_alive,
    )
    found = services(address)
    assert {
        "apexrl.v1.ReplayService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= found, found
    with ReplayClient(address) as client:
        client.insert(cartpole_batch(100))
        client.flush(timeout=20)
        assert client.info(timeout=10).size == 100
    values = engine.wait_until(
        lambda: (v := metrics(metrics_port)).get("apexrl_replay_size_rows") == 100 and v,
        "/metrics reports the 100 rows",
        30,
    )
    check_pod_like(shard)
    code, took = shard.stop(GRACE["replay"])
    print(
        f"\nreplay container: services {sorted(found)}; {len(values)} metric samples; SIGTERM -> exit {code} "
        f"in {took:.1f} s"
    )
    assert code == 0 and took < GRACE["replay"], shard.logs()
    logs = shard.logs(200)
    assert "Traceback" not in logs, logs[-4000:]


def test_a_fleet_of_containers_trains_stops_on_sigterm_and_restores_shard_checkpoints(images):
    ports = iter(engine.free_ports(12))
    started = time.monotonic()
    run = f"apexrl-test-{next(ports)}"
    fleet: dict[str, engine.Container] = {}
    shard_ports: dict[str, tuple[int, int]] = {}

    def check() -> None:
        for container in fleet.values():
            container.check_alive()

    # Two shards, each checkpointing to a volume of its own (a claim from volumeClaimTemplates in the manifests).
    for k in range(2):
        grpc_port, metrics_port = next(ports), next(ports)
        volume = engine.create_volume(f"{run}-checkpoints-{k}")
        shard_ports[f"replay-{k}"] = (grpc_port, metrics_port)
        fleet[f"replay-{k}"] = engine.run_detached(
            images.replay,
            f"{run}-replay-{k}",
            [
                "replay",
                "--host",
                "127.0.0.1",
                "--port",
                str(grpc_port),
                "--metrics-port",
                str(metrics_port),
                "--capacity",
                "20000",
                "--min-size-to-sample",
                "300",
                "--checkpoint-dir",
                "/var/lib/apexrl/replay",
            ],
            options=["--volume", f"{volume}:/var/lib/apexrl/replay"],
        )
    shards = ",".join(f"127.0.0.1:{g}" for g, _m in shard_ports.values())
    params_port, learner_metrics = next(ports), next(ports)
    fleet["learner"] = engine.run_detached(
        images.train,
        f"{run}-learner",
        [
            "learner",
            "--host",
            "127.0.0.1",
            "--port",
            str(params_port),
            "--metrics-port",
            str(learner_metrics),
            "--replay",
            shards,
            "--run-dir",
            "/tmp/learner",
            "--device",
            "cpu",
            "--torch-threads",
            "1",
            "--min-replay-size",
            "500",
            "--batch-size",
            "64",
            "--hidden-sizes",
            "64",
            "--publish-every",
            "10",
            "--seed",
            "0",
        ],
    )
    actor_metrics = {}
    for k in range(2):
        actor_metrics[f"actor-{k}"] = next(ports)
        fleet[f"actor-{k}"] = engine.run_detached(
            images.train,
            f"{run}-actor-{k}",
            [
                "actor",
                "--host",
                "127.0.0.1",
                "--metrics-port",
                str(actor_metrics[f"actor-{k}"]),
                "--replay",
                shards,
                "--params",
                f"127.0.0.1:{params_port}",
                "--actor-index",
                str(k),
                "--num-actors",
                "2",
                "--batch-size",
                "32",
                "--pull-every",
                "50",
                "--seed",
                str(k),
            ],
        )
    actor_metrics["evaluator"] = next(ports)
    fleet["evaluator"] = engine.run_detached(
        images.train,
        f"{run}-evaluator",
        [
            "actor",
            "--evaluate",
            "--host",
            "127.0.0.1",
            "--metrics-port",
            str(actor_metrics["evaluator"]),
            "--params",
            f"127.0.0.1:{params_port}",
            "--seed",
            "9",
        ],
    )

    params = ParameterClient(f"127.0.0.1:{params_port}", timeout=3)
    clients = {name: ReplayClient(f"127.0.0.1:{g}", timeout=3) for name, (g, _m) in shard_ports.items()}
    try:
        engine.wait_until(
            lambda: all(
                c.info(timeout=3).inserted_total > 0 and c.info(timeout=3).sampled_total > 0
                for c in clients.values()
            ),
            "both shards written by the actors and sampled by the learner",
            240,
            check=check,
        )
        first = engine.wait_until(params.version, "the learner publishes weights", 120, check=check)
        version = engine.wait_until(
            lambda: (v := params.version()) >= first + 3 and v,
            f"the weights version advances past {first}",
            180,
            check=check,
        )
        engine.wait_until(
            lambda: metrics(actor_metrics["evaluator"]).get("apexrl_actor_weight_version", 0) > 0,
            "the evaluator acts with published weights",
            120,
            check=check,
        )
        for name, port in actor_metrics.items():
            assert any(k.startswith("apexrl_actor_") for k in metrics(port)), name
        trained = time.monotonic() - started
        check_pod_like(fleet["replay-0"], volumes=("/var/lib/apexrl/replay",))
        check_pod_like(fleet["learner"])
        sizes = {name: c.info(timeout=5).size for name, c in clients.items()}
    finally:
        params.close()
        for c in clients.values():
            c.close()
    print(
        f"\nfleet of 6 containers: weights version {first} -> {version} after {trained:.0f} s; shard rows {sizes}"
    )

    # SIGTERM as the kubelet sends it: clients first (the actors stop writing), then the learner, then the shards.
    stops = {}
    for name in ("evaluator", "actor-0", "actor-1", "learner", "replay-0", "replay-1"):
        grace = GRACE[name.split("-")[0]]
        code, took = fleet[name].stop(grace)
        stops[name] = (code, round(took, 1))
        assert code == 0, f"{name} exited {code} after SIGTERM:\n{fleet[name].logs()}"
        assert took < grace, f"{name} took {took:.1f} s of its {grace} s grace period"
    print(f"SIGTERM -> (exit status, seconds): {stops}")
    for name, container in fleet.items():
        logs = container.logs(400)
        assert "Traceback" not in logs, f"{name}:\n{logs[-4000:]}"

    # The shards' checkpoints (written at SIGTERM, on their volumes) restore in new containers.
    for k in range(2):
        name = f"replay-{k}"
        grpc_port = engine.free_ports(1)[0]
        restored = engine.run_detached(
            images.replay,
            f"{run}-replay-{k}-again",
            [
                "replay",
                "--host",
                "127.0.0.1",
                "--port",
                str(grpc_port),
                "--metrics-port",
                "-1",
                "--capacity",
                "20000",
                "--checkpoint-dir",
                "/var/lib/apexrl/replay",
            ],
            options=["--volume", f"{run}-checkpoints-{k}:/var/lib/apexrl/replay"],
        )
        with ReplayClient(f"127.0.0.1:{grpc_port}", timeout=3) as client:
            size = engine.wait_until(
                lambda c=client: c.info(timeout=3).size,
                f"{name} restores its rows",
                90,
                check=restored.check_alive,
            )
        assert size >= sizes[name], (name, size, sizes[name])
        assert "restor" in restored.logs(), restored.logs()
        code, _took = restored.stop(GRACE["replay"])
        assert code == 0, restored.logs()
        print(f"{name}: {size} rows restored from its volume in a new container")

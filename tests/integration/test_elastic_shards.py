"""Elastic shards, as a Kubernetes StatefulSet behind a headless Service scales them: real processes, real name
resolution. Three shard "pods" (network namespaces with their own addresses, each shard on port 7000) and a fleet
namespace running a learner and an actor that know the shards only as `dns:///apexrl-replay:7000`; the test
changes what that name resolves to in the fleet's /etc/hosts, as the cluster DNS would. A shard added to the name
is written to and sampled, one removed from it is no longer used, with no restart of the learner or the actor.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import wait_until

pytest_plugins = ("tests.support.fixtures",)

PORT = 7000
RESOLVE_SECONDS = 1.0
NAME = "apexrl-replay"


def apexrl(*argv: str) -> list[str]:
    return [sys.executable, "-m", "apexrl.launcher", *argv]


@pytest.mark.timeout(240)
def test_learner_and_actor_follow_the_shards_a_headless_service_name_resolves_to(netns_network, tmp_path):
    network = netns_network(["s1", "s2", "s3", "fleet"], reach_from_host=True)
    shards = {name: network.address(name) for name in ("s1", "s2", "s3")}
    network.set_hosts({NAME: [shards["s1"], shards["s2"]]}, only=["fleet"])
    processes = {}
    logs = {}

    def start(where: str, role: str, *argv: str) -> None:
        logs[role] = open(tmp_path / f"{role}.log", "w")  # noqa: SIM115 (closed at the end of the test)
        processes[role] = network.popen(where, apexrl(*argv), stdout=logs[role], stderr=logs[role])

    clients = {name: ReplayClient(f"{address}:{PORT}", timeout=3) for name, address in shards.items()}
    try:
        for name in shards:
            start(name, name, "replay", "--host", "0.0.0.0", "--port", str(PORT), "--metrics-port", "-1")
        wait_until(lambda: all(_serving(c) for c in clients.values()), "the shards serve", timeout=60)
        target = f"dns:///{NAME}:{PORT}"
        start(
            "fleet",
            "learner",
            "learner",
            "--replay",
            target,
            "--replay-resolve-seconds",
            str(RESOLVE_SECONDS),
            "--host",
            "127.0.0.1",
            "--port",
            "7100",
            "--metrics-port",
            "-1",
            "--min-replay-size",
            "200",
            "--batch-size",
            "32",
            "--seed",
            "0",
        )
        start(
            "fleet",
            "actor",
            "actor",
            "--params",
            "127.0.0.1:7100",
            "--replay",
            target,
            "--replay-resolve-seconds",
            str(RESOLVE_SECONDS),
            "--metrics-port",
            "-1",
            "--max-steps-per-second",
            "1500",
            "--seed",
            "1",
        )

        def info(name: str):
            for role, process in processes.items():
                assert process.poll() is None, (
                    f"{role} exited: {(tmp_path / f'{role}.log').read_text()[-2000:]}"
                )
            return clients[name].info()

        def used(name: str, inserted: int = 0, sampled: int = 0) -> bool:
            now = info(name)
            return now.inserted_total > inserted and now.sampled_total > sampled

        wait_until(lambda: used("s1") and used("s2"), "the fleet writes to and samples s1 and s2", timeout=90)
        assert info("s3").inserted_total == 0 and info("s3").sampled_total == 0  # not in the name yet

        network.set_hosts({NAME: list(shards.values())}, only=["fleet"])  # scaled up to 3
        wait_until(
            lambda: used("s3"), "the fleet writes to and samples s3 once the name resolves to it", timeout=30
        )

        network.set_hosts({NAME: [shards["s1"], shards["s3"]]}, only=["fleet"])  # s2 removed
        # Within a resolution period (plus calls already in flight), s2 is no longer used.
        wait_until(
            lambda: _quiet(info, "s2", RESOLVE_SECONDS * 2),
            "s2 no longer used after leaving the name",
            timeout=30,
        )
        left = info("s2")
        s1, s3 = info("s1"), info("s3")
        wait_until(
            lambda: (
                used("s1", s1.inserted_total + 500, s1.sampled_total + 500)
                and used("s3", s3.inserted_total + 500, s3.sampled_total + 500)
            ),
            "the fleet goes on with s1 and s3",
            timeout=60,
        )
        assert _same_counts(left, info("s2")), "s2 was used after it left the name"
    finally:
        for client in clients.values():
            client.close()
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = {role: process.wait(30) for role, process in processes.items()}
        for log in logs.values():
            log.close()
    assert codes == dict.fromkeys(processes, 0), codes


def _serving(client: ReplayClient) -> bool:
    try:
        client.info(timeout=1)
        return True
    except Exception:  # noqa: BLE001 (not up yet)
        return False


def _same_counts(a, b) -> bool:
    return (a.inserted_total, a.sampled_total, a.updated_total) == (
        b.inserted_total,
        b.sampled_total,
        b.updated_total,
    )


def _quiet(info, name: str, seconds: float) -> bool:
    """True when `name`'s counters did not move for `seconds` (while the rest of the fleet runs)."""
    before = info(name)
    time.sleep(seconds)  # the observation window of "no traffic", not a synchronisation
    return _same_counts(before, info(name))

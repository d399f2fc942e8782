"""TLS and mutual TLS on real `apexrl replay` and `apexrl params` processes and on a launched fleet.

The SDK clients given the right CA (and, under mutual TLS, a client certificate) insert, sample, update, publish
and fetch. Every wrong credential is refused with the status code documented in common/grpc_util.py and README
("TLS"), and changes nothing on the server: a shard's counters and the parameter service's version are read
before and after each refused attempt. A server's plaintext health port answers SERVING (and serves nothing
else) while its TLS port refuses plaintext. Servers whose certificate names only a DNS name (a Kubernetes fleet's,
dialled by pod IP) are reached by clients that check `tls_server_name` instead of the address, and refused, with
the reason, by clients that do not or that check another name. `apexrl launch` with [fleet] TLS files and
tls_server_name trains with every server port refusing plaintext.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apexrl.actor.config import ActorConfig
from apexrl.common.errors import ApexError, DeadlineExceededError, UnauthenticatedError, UnavailableError
from apexrl.common.free_ports import pick_free_port
from apexrl.common.grpc_util import make_channel, wait_for_health
from apexrl.common.tls import TlsFiles, tls_of
from apexrl.learner.sharded_client import ShardedReplayClient
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import cartpole_batch, wait_until
from tests.integration.launcher.test_main import Launch
from tests.support.certs import SERVER_NAME, Certs, make_certs

TOKEN = "s3cret"
WEIGHTS = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, dtype=np.float32)}


def free_port() -> int:
    """Below the ephemeral range: no connecting socket takes it before the process that will bind it starts."""
    return pick_free_port("127.0.0.1")


@dataclass
class Server:
    """A role process serving on 127.0.0.1 (TLS port `address`, plaintext health-only port `health`)."""

    role: str
    address: str
    health: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)


def start(directory: Path, role: str, name: str, *extra: str) -> Server:
    """`apexrl ROLE` on a free port with a plaintext health port; waits until the health port says SERVING."""
    port_file, log_path, health_port = directory / f"{name}.port", directory / f"{name}.log", free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                role,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-port",
                "-1",
                "--port-file",
                str(port_file),
                "--health-port",
                str(health_port),
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
            raise RuntimeError(f"{name} did not start: {log_path.read_text()}")
        time.sleep(0.05)
    server = Server(
        role, f"127.0.0.1:{int(port_file.read_text())}", f"127.0.0.1:{health_port}", process, log_path
    )
    wait_for_health(server.health, timeout=20)
    return server


@dataclass
class Fleet:
    certs: Certs
    tls_shard: Server  # server-only TLS
    mtls_shard: Server  # mutual TLS and a bearer token
    tls_params: Server
    mtls_params: Server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("tls")
    certs = make_certs(directory / "certs")
    server_tls = ("--tls-cert", certs.cert, "--tls-key", certs.key)
    mutual = (*server_tls, "--tls-ca", certs.ca, "--token", TOKEN)
    started: list[Server] = []
    try:
        for role, name, extra in [
            ("replay", "tls-shard", server_tls),
            ("replay", "mtls-shard", mutual),
            ("params", "tls-params", server_tls),
            ("params", "mtls-params", mutual),
        ]:
            started.append(start(directory, role, name, *extra))
        yield Fleet(certs, *started)
        for server in started:  # a clean stop closes the health port too
            assert server.stop() == 0, server.log.read_text()[-2000:]
    finally:
        for server in started:
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(10)


def good_tls(fleet: Fleet, *, mutual: bool) -> dict:
    """The client options each server accepts: its CA; under mutual TLS also a client certificate and the token."""
    c = fleet.certs
    if mutual:
        return {"tls": TlsFiles.read(c.cert, c.key, c.ca), "token": TOKEN}
    return {"tls": TlsFiles.read(ca=c.ca)}


# ------------------------------------------------------------------------------------------ the SDK over TLS
@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_replay_clients_insert_sample_and_update_over_tls(fleet, mutual):
    shard = fleet.mtls_shard if mutual else fleet.tls_shard
    options = good_tls(fleet, mutual=mutual)
    with ReplayClient(shard.address, **options) as client:
        before = client.info().inserted_total
        client.insert(cartpole_batch(32), priorities=np.ones(32))
        client.flush(timeout=10)
        assert client.info().inserted_total == before + 32
        batch = client.sample(8)
        assert len(batch.keys) == 8
        result = client.update_priorities(batch.keys, np.full(8, 2.0), incarnation=batch.incarnation)
        assert result.applied == 8
    sampler = ShardedReplayClient([shard.address], **options)  # the learner's client, over the same options
    try:
        batch = sampler.sample(16, beta=0.4)
        assert len(batch.keys) == 16
        sampler.update_priorities(batch, np.full(16, 3.0))
        sampler.flush_updates(timeout=10)
        assert sampler.updates_applied >= 16 and sampler.update_errors == 0
    finally:
        sampler.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_parameter_clients_publish_and_fetch_over_tls(fleet, mutual):
    service = fleet.mtls_params if mutual else fleet.tls_params
    with ParameterClient(service.address, **good_tls(fleet, mutual=mutual)) as client:
        version = client.publish(WEIGHTS)
        fetched = client.fetch(have_version=0)
        assert fetched is not None and fetched[0] == version == client.version()
        np.testing.assert_array_equal(fetched[1]["w"], WEIGHTS["w"])
        assert client.fetch(have_version=version) is None


# ------------------------------------------------------------------------------------ wrong credentials
# (case, server, client options) -> the status code the client sees. Handshake failures are UNAVAILABLE whichever
# side refuses (gRPC reports no finer code); a bad token over a good TLS connection is UNAUTHENTICATED.
CASES = {
    "no client certificate under mutual TLS": (
        "mtls",
        lambda c: {"tls": TlsFiles.read(ca=c.ca), "token": TOKEN},
        grpc.StatusCode.UNAVAILABLE,
    ),
    "client certificate from another CA": (
        "mtls",
        lambda c: {"tls": TlsFiles.read(c.foreign_cert, c.foreign_key, c.ca), "token": TOKEN},
        grpc.StatusCode.UNAVAILABLE,
    ),
    "server certificate from a CA the client does not trust": (
        "tls",
        lambda c: {"tls": TlsFiles.read(ca=c.foreign_ca)},
        grpc.StatusCode.UNAVAILABLE,
    ),
    "plaintext client to a TLS server": ("tls", lambda c: {}, grpc.StatusCode.UNAVAILABLE),
    "plaintext client to a mutual-TLS server": (
        "mtls",
        lambda c: {"token": TOKEN},
        grpc.StatusCode.UNAVAILABLE,
    ),
    "TLS client to a plaintext server": (
        "plain",
        lambda c: {"tls": TlsFiles.read(ca=c.ca)},
        grpc.StatusCode.UNAVAILABLE,
    ),
    "missing token over mutual TLS": (
        "mtls",
        lambda c: {"tls": TlsFiles.read(c.cert, c.key, c.ca)},
        grpc.StatusCode.UNAUTHENTICATED,
    ),
    "wrong token over mutual TLS": (
        "mtls",
        lambda c: {"tls": TlsFiles.read(c.cert, c.key, c.ca), "token": "wrong"},
        grpc.StatusCode.UNAUTHENTICATED,
    ),
}
ERRORS = {
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def assert_refused(call, code: grpc.StatusCode) -> None:
    with pytest.raises(ApexError) as info:
        call()
    assert isinstance(info.value, ERRORS[code]) and info.value.code == code, info.value


@pytest.mark.parametrize("case", list(CASES))
def test_a_shard_refuses_wrong_credentials_and_changes_nothing(fleet, make_shard, case):
    kind, options, code = CASES[case]
    if kind == "plain":
        address, good = make_shard().address, {}
    else:
        address, good = (
            (fleet.mtls_shard if kind == "mtls" else fleet.tls_shard).address,
            good_tls(fleet, mutual=kind == "mtls"),
        )
    with ReplayClient(address, **good) as client:
        client.insert(cartpole_batch(8), priorities=np.ones(8))
        client.flush(timeout=10)
        sampled = client.sample(4)
        before = client.info()
    bad = ReplayClient(address, timeout=2.0, **options(fleet.certs))
    try:
        assert_refused(bad.info, code)
        assert_refused(lambda: bad.sample(4), code)
        assert_refused(
            lambda: bad.update_priorities(sampled.keys, np.full(4, 50.0), incarnation=sampled.incarnation),
            code,
        )
        bad.insert(cartpole_batch(8, start=100), priorities=np.ones(8))
        # The insert stream: UNAUTHENTICATED ends it at once; a refused handshake is retried until the deadline.
        expected = UnauthenticatedError if code == grpc.StatusCode.UNAUTHENTICATED else DeadlineExceededError
        with pytest.raises(expected):
            bad.flush(timeout=2.0)
    finally:
        bad.close()
    with ReplayClient(address, **good) as client:
        after = client.info()
    assert (after.size, after.inserted_total, after.sampled_total, after.total_priority) == (
        before.size,
        before.inserted_total,
        before.sampled_total,
        before.total_priority,
    )


@pytest.fixture
def plaintext_params() -> Iterator[str]:
    made = create_parameter_server("127.0.0.1:0")
    server, port, _store = made.server, made.port, made.store
    yield f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize("case", list(CASES))
def test_a_parameter_service_refuses_wrong_credentials_and_changes_nothing(fleet, plaintext_params, case):
    kind, options, code = CASES[case]
    if kind == "plain":
        address, good = plaintext_params, {}
    else:
        address, good = (
            (fleet.mtls_params if kind == "mtls" else fleet.tls_params).address,
            good_tls(fleet, mutual=kind == "mtls"),
        )
    with ParameterClient(address, **good) as client:
        client.publish(WEIGHTS)
        version = client.version()
    with ParameterClient(address, timeout=2.0, **options(fleet.certs)) as bad:
        assert_refused(lambda: bad.publish({"w": np.zeros(3, dtype=np.float32)}), code)
        assert_refused(lambda: bad.publish({"w": np.zeros(3, dtype=np.float32)}, version=version + 100), code)
        assert_refused(lambda: bad.fetch(0), code)
        assert_refused(bad.version, code)
    with ParameterClient(address, **good) as client:
        assert client.version() == version
        np.testing.assert_array_equal(client.fetch(0)[1]["w"], WEIGHTS["w"])


# ------------------------------------------------------------------------------------------- tls_server_name
@pytest.fixture(scope="module")
def named(tmp_path_factory) -> Iterator[tuple[Certs, dict[str, Server]]]:
    """A mutual-TLS shard and parameter service on 127.0.0.1 whose certificate names SERVER_NAME and nothing else
    (no IP address, no localhost): a Kubernetes fleet's servers, dialled by pod IP."""
    directory = tmp_path_factory.mktemp("named")
    certs = make_certs(directory / "certs")
    flags = ("--tls-cert", certs.named_cert, "--tls-key", certs.named_key, "--tls-ca", certs.ca)
    started: dict[str, Server] = {}
    try:
        for role in ("replay", "params"):
            started[role] = start(directory, role, f"named-{role}", *flags)
        yield certs, started
        for server in started.values():
            assert server.stop() == 0, server.log.read_text()[-2000:]
    finally:
        for server in started.values():
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(10)


def call_named(role: str, address: str, tls: TlsFiles) -> object:
    """One call to the server at `address` (its ADDRESS is an IP the certificate does not name)."""
    if role == "replay":
        with ReplayClient(address, timeout=3.0, tls=tls) as client:
            return client.info().inserted_total
    with ParameterClient(address, timeout=3.0, tls=tls) as client:
        client.publish(WEIGHTS)
        return client.version()


@pytest.mark.parametrize("role", ["replay", "params"])
def test_clients_check_the_certificate_against_tls_server_name_instead_of_the_address(named, role):
    certs, servers = named
    address = servers[role].address
    assert address.startswith("127.0.0.1:")

    def tls(server_name: str | None) -> TlsFiles:
        return TlsFiles.read(certs.named_cert, certs.named_key, certs.ca, server_name=server_name)

    call_named(role, address, tls(SERVER_NAME))  # the name the certificate holds: accepted
    for name in (None, "apexrl-learner.apexrl.svc"):  # the address dialled, another name: refused, saying why
        with pytest.raises(UnavailableError) as info:
            call_named(role, address, tls(name))
        assert "Hostname Verification Check failed" in str(info.value), info.value
    # What the roles dial with: the TlsFiles of their settings (tls_of), here an actor's --tls-server-name.
    actor = ActorConfig(
        params=address,
        replay=(address,),
        tls_cert=certs.named_cert,
        tls_key=certs.named_key,
        tls_ca=certs.ca,
        tls_server_name=SERVER_NAME,
    )
    assert tls_of(actor) == tls(SERVER_NAME)
    if role == "replay":  # the learner's sampler, over the same files
        with ReplayClient(address, tls=tls_of(actor)) as client:
            client.insert(cartpole_batch(32), priorities=np.ones(32))
            client.flush(timeout=10)
        sampler = ShardedReplayClient([address], tls=tls(SERVER_NAME))
        try:
            assert len(sampler.sample(8, beta=0.4).keys) == 8
        finally:
            sampler.close()


# ----------------------------------------------------------------------------------------- health port
@pytest.mark.parametrize("name", ["tls_shard", "mtls_shard", "tls_params", "mtls_params"])
def test_the_plaintext_health_port_answers_and_the_tls_port_requires_tls(fleet, name):
    server = getattr(fleet, name)
    service = "apexrl.v1.ReplayService" if server.role == "replay" else "apexrl.v1.ParameterService"
    with make_channel(server.health) as channel:  # plaintext, no token: what a Kubernetes probe sends
        stub = health_pb2_grpc.HealthStub(channel)
        for asked in ("", service):
            assert (
                stub.Check(health_pb2.HealthCheckRequest(service=asked), timeout=5).status
                == health_pb2.HealthCheckResponse.SERVING
            )
        # Only health is served there: the service itself and reflection are not.
        with pytest.raises(grpc.RpcError) as info:
            replay_pb2_grpc.ReplayServiceStub(channel).Info(replay_pb2.InfoRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with make_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # Over TLS the main port keeps its health service (the launcher checks it there).
    wait_for_health(
        server.address, timeout=5, tls=TlsFiles.read(fleet.certs.cert, fleet.certs.key, fleet.certs.ca)
    )
    assert "TLS, plaintext health on port" in server.log.read_text()


def test_wrong_health_service_names_stay_unknown(fleet):
    with make_channel(fleet.tls_shard.health) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------------------------------- a launched fleet
@pytest.mark.timeout(150)
def test_a_launched_fleet_trains_over_mutual_tls(tmp_path):
    """`apexrl launch` with [fleet] TLS files and tls_server_name (here as flags): every role gets the files, every
    role that dials the name, the servers refuse plaintext, and the fleet trains: the learner updates and the
    actor receives weights. The certificate names SERVER_NAME only, not 127.0.0.1 where the roles dial each
    other: every client (the launcher's health checks too) checks the name instead of the address."""
    certs = make_certs(tmp_path / "certs")
    tls = TlsFiles.read(certs.named_cert, certs.named_key, certs.ca, server_name=SERVER_NAME)
    run = Launch(
        tmp_path,
        "--tls-cert",
        certs.named_cert,
        "--tls-key",
        certs.named_key,
        "--tls-ca",
        certs.ca,
        "--tls-server-name",
        SERVER_NAME,
    )
    try:
        run.wait_running(timeout=90)
        roles = {r["name"]: r for r in run.config()["roles"]}
        for name, role in roles.items():
            command = role["command"]
            assert [command[command.index(f) + 1] for f in ("--tls-cert", "--tls-key", "--tls-ca")] == [
                certs.named_cert,
                certs.named_key,
                certs.ca,
            ], name
            dials = not name.startswith("shard-")
            assert ("--tls-server-name" in command) == dials, name
            if dials:
                assert command[command.index("--tls-server-name") + 1] == SERVER_NAME, name
        servers = {
            "shard-0": int((run.run_dir / "ports" / "shard-0.port").read_text()),
            "learner": roles["learner"]["port"],
        }
        for name, port in servers.items():
            address = f"127.0.0.1:{port}"
            with make_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name  # plaintext is refused
            wait_for_health(address, timeout=5, tls=tls)
        assert "mutual TLS" in run.log("shard-0") and re.search(
            r"\(hosted, [^)]*, mutual TLS", run.log("learner")
        )
        # It trains: the learner updates from what the actor inserted, and both clients of its weights get them.
        wait_until(
            lambda: (
                re.search(r"updates [1-9][\d,]* ", run.out_path.read_text())
                and "got weights version" in run.log("actor-0")
                and "got weights version" in run.log("evaluator")
            ),
            "the learner updated and the actor and the evaluator got weights, over TLS",
            timeout=90,
        )
        run.process.send_signal(signal.SIGTERM)
        code, result, err = run.wait(timeout=90)
        assert code == 1 and result["reason"] == "signal", err[
            -3000:
        ]  # stopped before its (unreachable) target
        assert result["updates"] > 0 and result["env_steps"] > 0, result
        print(
            f"\nmutual-TLS fleet: {result['updates']} updates, {result['env_steps']} env steps in "
            f"{result['wall_seconds']:.0f} s"
        )
        assert "got weights version" in run.log("actor-0") and "got weights version" in run.log("evaluator")
        for name in ("actor-0", "evaluator"):  # no client refused a certificate (the servers log our probes)
            assert "Handshake failed" not in run.log(name), run.log(name)[-3000:]
        run.assert_no_role_left()
    finally:
        run.cleanup()

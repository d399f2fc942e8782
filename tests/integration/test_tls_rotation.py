"""Certificates renewed on disk while servers and clients run (common/tls_reload.py): real grpc.aio servers (replay
shards and a parameter service on AioServerThread) and SDK clients on loopback, their files in a Kubernetes-style
Secret volume whose `..data` link a renewal swaps (tests/support/certs.py).

- A shard serves its renewed certificate to the next connection, without a restart: a client that trusts only the
  new CA is refused before the renewal and served after it, one that trusts only the old CA the other way round;
  a connection opened before the renewal keeps working.
- A mutual-TLS shard takes a renewed CA bundle: client certificates of the new CA are accepted from then on.
- Renewed files that are not usable (a key that is not the certificate's, a cut-off certificate, an empty key)
  are logged once as an error, and the shard goes on serving the previous certificate until a good renewal.
- A client whose own certificate or CA bundle is renewed reconnects with the new files when its server restarts
  with the new trust, without a restart of its own: a ReplayClient's insert stream, and a ParameterClient.
- apexrl_tls_certificate_expiry_timestamp_seconds follows the renewals of a server's and a client's files.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trustme
from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from apexrl.common.errors import UnavailableError
from apexrl.common.metrics import add_process_metrics
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.server.service import create_replay_server
from tests.conftest import cartpole_batch
from tests.support.certs import Identity, SecretVolume, issue

GAUGE = "apexrl_tls_certificate_expiry_timestamp_seconds"
TOKEN = "s3cret"


def days_from_now(days: int) -> datetime.datetime:
    return (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days)).replace(
        microsecond=0
    )


def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    """condition()'s first truthy value, polled until `timeout` seconds have passed (then the test fails)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def served(address: str, ca: bytes, client: Identity | None = None, attempts: int = 3) -> bool:
    """Whether a new connection that trusts only `ca` (presenting `client`'s certificate: mutual TLS) is served.
    A refused handshake is refused at every attempt; the attempts only ride out a connection that failed for
    another reason (a loaded machine)."""
    tls = TlsFiles(ca=ca) if client is None else TlsFiles(cert=client.cert, key=client.key, ca=ca)
    for _ in range(attempts):
        with ReplayClient(address, timeout=5.0, tls=tls) as replay:
            if answers(replay):
                return True
    return False


def answers(replay: ReplayClient) -> bool:
    try:
        replay.info()
    except UnavailableError:
        return False
    return True


def server_tls(server: Identity, clients: trustme.CA | None = None) -> TlsFiles:
    """A server's files given as bytes (not followed): `server`'s certificate, client certificates of `clients`."""
    return TlsFiles(
        cert=server.cert, key=server.key, ca=None if clients is None else clients.cert_pem.bytes()
    )


def gauge(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {
        (s.labels["file"], s.labels["path"]): s.value for f in families if f.name == GAUGE for s in f.samples
    }


# ---------------------------------------------------------------------------------------------------- servers
def test_a_shard_serves_its_renewed_certificate_to_new_connections(make_shard, tmp_path):
    old, new = issue(), issue()
    volume = SecretVolume(tmp_path / "tls")
    volume.write(cert=old.cert, key=old.key, ca=old.ca_pem)
    address = make_shard(tls=TlsFiles.read(volume.cert, volume.key)).address
    assert served(address, old.ca_pem) and not served(address, new.ca_pem)
    with ReplayClient(address, timeout=5.0, tls=TlsFiles(ca=old.ca_pem)) as opened_before:
        opened_before.insert(cartpole_batch(8), priorities=np.ones(8))
        opened_before.flush(timeout=10)
        volume.write(cert=new.cert, key=new.key, ca=new.ca_pem)
        assert served(address, new.ca_pem) and not served(address, old.ca_pem)
        assert opened_before.info().inserted_total == 8  # its connection, made before the renewal, goes on


def test_a_mutual_tls_shard_takes_a_renewed_ca_bundle(make_shard, tmp_path):
    server, old_clients, new_clients = issue(), trustme.CA(), trustme.CA()
    old_client, new_client = issue(old_clients), issue(new_clients)
    volume = SecretVolume(tmp_path / "tls")
    volume.write(cert=server.cert, key=server.key, ca=old_clients.cert_pem.bytes())
    address = make_shard(tls=TlsFiles.read(volume.cert, volume.key, volume.ca)).address
    assert served(address, server.ca_pem, old_client) and not served(address, server.ca_pem, new_client)
    volume.write(cert=server.cert, key=server.key, ca=new_clients.cert_pem.bytes())
    assert served(address, server.ca_pem, new_client) and not served(address, server.ca_pem, old_client)


BROKEN = {  # a renewal caught half way, or gone wrong -> (files, what the logged error says)
    "a key that is not the certificate's": (
        lambda old, new: {"cert": new.cert, "key": old.key, "ca": new.ca_pem},
        "is not the private key of the first certificate",
    ),
    "a cut-off certificate": (
        lambda old, new: {"cert": new.cert[: len(new.cert) // 2], "key": new.key, "ca": new.ca_pem},
        "does not parse as PEM certificates",
    ),
    "an empty key": (
        lambda old, new: {"cert": new.cert, "key": b"", "ca": new.ca_pem},
        "holds no PEM private key",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_renewal_that_is_not_usable_is_logged_once_and_the_previous_certificate_served(
    make_shard, tmp_path, caplog, broken
):
    old, new = issue(), issue()
    volume = SecretVolume(tmp_path / "tls")
    volume.write(cert=old.cert, key=old.key, ca=old.ca_pem)
    address = make_shard(tls=TlsFiles.read(volume.cert, volume.key)).address
    files, says = BROKEN[broken]
    caplog.set_level(logging.ERROR, logger="apexrl.common.tls_reload")
    volume.write(**files(old, new))
    for _ in range(3):  # every new connection looks at the files again
        assert served(address, old.ca_pem) and not served(address, new.ca_pem)
    errors = [r.getMessage() for r in caplog.records if "changed but are not usable" in r.getMessage()]
    assert len(errors) == 1 and says in errors[0] and volume.directory.name in errors[0], errors
    volume.write(cert=new.cert, key=new.key, ca=new.ca_pem)  # the renewal done right
    assert served(address, new.ca_pem) and not served(address, old.ca_pem)


# ---------------------------------------------------------------------------------------------------- clients
class RestartingShard:
    """A shard on a fixed loopback port, restarted with other files (a pod rescheduled after a renewal)."""

    def __init__(self, tls: TlsFiles) -> None:
        self.port = 0
        self._server = None
        self.start(tls)

    def start(self, tls: TlsFiles) -> None:
        self.table = ReplayTable(TableConfig(capacity=1000, seed=0))
        made = create_replay_server(self.table, f"127.0.0.1:{self.port}", tls=tls, token=TOKEN)
        self._server, self.port, _registry = made.server, made.port, made.registry

    def stop(self) -> None:
        self._server.stop(0).wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


RENEWALS = {  # what is renewed -> (client before, server before, client after, server after)
    "its own certificate": lambda s, c1, c2: ((c1, s), (s, c1.ca), (c2, s), (s, c2.ca)),
    "its CA bundle": lambda s, c1, c2: ((c1, s), (s, c1.ca), (c1, c2), (c2, c1.ca)),
}


def renewal(what: str) -> tuple[tuple[Identity, Identity], ...]:
    """The client's files (its certificate, the server identity whose CA it trusts) and the server's (its
    certificate, the CA of the client certificates it accepts), before and after `what` is renewed."""
    return RENEWALS[what](issue(), issue(), issue())


@pytest.mark.parametrize("what", list(RENEWALS))
def test_a_replay_client_reconnects_with_its_renewed_files_when_its_shard_restarts(tmp_path, what):
    (client, trusted), (server, accepted), (client2, trusted2), (server2, accepted2) = renewal(what)
    volume = SecretVolume(tmp_path / "client")
    volume.write(cert=client.cert, key=client.key, ca=trusted.ca_pem)
    shard = RestartingShard(server_tls(server, accepted))
    try:
        with ReplayClient(
            shard.address,
            timeout=5.0,
            token=TOKEN,  # the token: an intercepted ReloadingChannel
            tls=TlsFiles.read(volume.cert, volume.key, volume.ca),
        ) as replay:
            replay.insert(cartpole_batch(8), priorities=np.ones(8))
            replay.flush(timeout=10)
            volume.write(cert=client2.cert, key=client2.key, ca=trusted2.ca_pem)
            shard.stop()
            shard.start(server_tls(server2, accepted2))  # the old files no longer pass its handshake
            assert not served(shard.address, trusted.ca_pem, client)
            replay.insert(cartpole_batch(8, start=8), priorities=np.ones(8))
            replay.flush(timeout=30)  # the insert stream reconnected, with the renewed files
            assert replay.info().inserted_total == 8 and replay.reconnects >= 1
    finally:
        shard.stop()


def test_a_parameter_client_reconnects_with_its_renewed_certificate(tmp_path):
    (client, trusted), (server, accepted), (client2, trusted2), (server2, accepted2) = renewal(
        "its own certificate"
    )
    volume = SecretVolume(tmp_path / "client")
    volume.write(cert=client.cert, key=client.key, ca=trusted.ca_pem)
    made = create_parameter_server("127.0.0.1:0", tls=server_tls(server, accepted))
    params, port, _store = made.server, made.port, made.store
    weights = {"w": np.arange(6, dtype=np.float32)}
    try:
        with ParameterClient(
            f"127.0.0.1:{port}", timeout=5.0, tls=TlsFiles.read(volume.cert, volume.key, volume.ca)
        ) as params_client:

            def publishes() -> bool:
                try:
                    params_client.publish(weights)
                except UnavailableError:
                    return False
                return True

            until(publishes, "the client publishes with its first certificate")
            volume.write(cert=client2.cert, key=client2.key, ca=trusted2.ca_pem)
            params.stop(0).wait(10)
            params = create_parameter_server(f"127.0.0.1:{port}", tls=server_tls(server2, accepted2)).server
            until(publishes, "the client publishes to the restarted service with its renewed certificate")
    finally:
        params.stop(0).wait(10)


# ------------------------------------------------------------------------------------------------ expiry gauge
def test_the_expiry_gauge_follows_renewals_of_a_servers_and_a_clients_files(make_shard, tmp_path):
    registry = CollectorRegistry()
    add_process_metrics(registry)  # what serve_metrics adds to every role's registry
    first, renewed = days_from_now(30), days_from_now(90)
    old, new = issue(not_after=first), issue(not_after=renewed)
    volume = SecretVolume(tmp_path / "tls")
    volume.write(cert=old.cert, key=old.key, ca=old.ca_pem)
    address = make_shard(tls=TlsFiles.read(volume.cert, volume.key)).address

    def ca_expiry(identity: Identity) -> float:
        return x509.load_pem_x509_certificate(identity.ca_pem).not_valid_after_utc.timestamp()

    def ours() -> dict[tuple[str, str], float]:
        return {
            key: value for key, value in gauge(registry).items() if Path(key[1]).parent == volume.directory
        }

    with ReplayClient(address, timeout=5.0, tls=TlsFiles.read(ca=volume.ca)) as replay:
        assert ours() == {("cert", volume.cert): first.timestamp(), ("ca", volume.ca): ca_expiry(old)}
        volume.write(cert=new.cert, key=new.key, ca=new.ca_pem)
        assert served(address, new.ca_pem)  # the server took the renewal at this connection
        assert ours()[("cert", volume.cert)] == renewed.timestamp()
        until(
            lambda: answers(replay) and ours()[("ca", volume.ca)] == ca_expiry(new),
            "the client took its renewed CA bundle",
        )

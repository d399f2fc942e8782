"""TLS settings (common/tls.py, the tls_* settings of every role and of [fleet]): a bad combination or a bad file is
refused before anything starts, with the flag and the path named; the launcher gives every role the machine's
files and refuses them in a role's table."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from apexrl.actor.config import ActorConfig
from apexrl.common import grpc_util
from apexrl.common.settings import SettingsError, parse_argv
from apexrl.common.tls import TlsFiles, describe, tls_of
from apexrl.launcher.commands import check_commands, role_config
from apexrl.launcher.fleet import Fleet
from apexrl.launcher.fleet_config import ConfigError, FleetSettings
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.topology import Wiring, local_fleet, roles
from apexrl.learner.config import LearnerConfig
from apexrl.parameter_server.config import ParamsConfig
from apexrl.replay_server.server.config import ReplayConfig
from tests.support.certs import make_certs
from tests.unit.launcher.fleets import error, fleet

SERVERS = [ReplayConfig, ParamsConfig]
REPLAY = ("127.0.0.1:7000",)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def make(cls, **tls):
    """A config of `cls` with the given TLS settings and otherwise its defaults (plus what it requires)."""
    required = {
        LearnerConfig: {"replay": REPLAY},
        ActorConfig: {"params": "127.0.0.1:7200", "replay": REPLAY},
    }
    return cls(**required.get(cls, {}), **tls)


@pytest.mark.parametrize("cls", [*SERVERS, LearnerConfig, ActorConfig])
def test_every_role_reads_its_tls_files(cls, certs):
    config = make(cls, tls_cert=certs.cert, tls_key=certs.key, tls_ca=certs.ca)
    tls = tls_of(config)
    assert tls.cert.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" in tls.key
    assert tls.mutual and describe(tls) == "mutual TLS"
    assert tls_of(make(cls)) is None  # TLS is off by default


@pytest.mark.parametrize("cls", [*SERVERS, LearnerConfig, ActorConfig])
@pytest.mark.parametrize("given", ["tls_cert", "tls_key"])
def test_a_certificate_and_its_key_go_together(cls, certs, given):
    missing = "tls_key" if given == "tls_cert" else "tls_cert"
    with pytest.raises(ValueError, match=f"^{missing} is missing: {given} "):
        make(cls, **{given: certs.cert if given == "tls_cert" else certs.key})


@pytest.mark.parametrize("cls", [*SERVERS, LearnerConfig, ActorConfig])
def test_unreadable_or_wrong_files_are_named(cls, certs, tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=r"^tls_cert \(.*nope.pem\) cannot be read: No such file"):
        make(cls, tls_cert=missing, tls_key=certs.key)
    with pytest.raises(ValueError, match=r"^tls_key \(.*cert.pem\) holds no PEM private key"):
        make(cls, tls_cert=certs.cert, tls_key=certs.cert)  # a certificate where the key belongs
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"^tls_ca \(.*garbage.pem\) holds no PEM CA certificate"):
        make(cls, tls_cert=certs.cert, tls_key=certs.key, tls_ca=str(garbage))
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(ValueError, match=r"^tls_key \(.*encrypted.pem\) is encrypted"):
        make(cls, tls_cert=certs.cert, tls_key=str(encrypted))


def test_a_directory_is_not_a_file(certs, tmp_path):
    with pytest.raises(ValueError, match=r"^tls_ca \(.*\) cannot be read"):
        make(ActorConfig, tls_ca=str(tmp_path))


def test_a_client_may_have_a_ca_alone_a_server_may_not(certs):
    """tls_ca alone: a client verifying servers (server-auth TLS). A server given a CA requires client
    certificates, which it can only do while serving TLS itself."""
    assert tls_of(make(ActorConfig, tls_ca=certs.ca)) == TlsFiles(ca=Path(certs.ca).read_bytes())
    assert describe(tls_of(make(ActorConfig, tls_ca=certs.ca))) == "plaintext"  # as a server would serve
    learner = LearnerConfig(replay=REPLAY, params="127.0.0.1:7100", tls_ca=certs.ca)  # hosts no service
    assert tls_of(learner).ca is not None
    for cls in [*SERVERS, LearnerConfig]:
        with pytest.raises(ValueError, match=r"^tls_ca \(.*\) needs tls_cert and tls_key on a server"):
            make(cls, tls_ca=certs.ca)
    server_only = tls_of(make(ReplayConfig, tls_cert=certs.cert, tls_key=certs.key))
    assert not server_only.mutual and describe(server_only) == "TLS"


@pytest.mark.parametrize("cls", SERVERS)
def test_flags_name_the_bad_setting(cls, certs, tmp_path):
    with pytest.raises(SettingsError, match=r"^--tls-key: tls_key is missing"):
        parse_argv(cls, ["--tls-cert", certs.cert], prog="test")
    with pytest.raises(SettingsError, match=r"^--tls-ca: tls_ca \(.*missing.pem\) cannot be read"):
        parse_argv(
            cls,
            ["--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-ca", str(tmp_path / "missing.pem")],
            prog="test",
        )
    config = parse_argv(
        cls,
        ["--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-ca", certs.ca, "--health-port", "8123"],
        prog="test",
    )
    assert (config.tls_cert, config.tls_key, config.tls_ca, config.health_port) == (
        certs.cert,
        certs.key,
        certs.ca,
        8123,
    )


@pytest.mark.parametrize("cls", [*SERVERS, LearnerConfig])
def test_health_port_is_a_port_other_than_the_service_port(cls):
    assert make(cls, health_port=8123).health_port == 8123
    for bad in (0, 70000, 7777):
        with pytest.raises(
            ValueError, match=rf"^health_port \({bad}\) must be a port in 1..65535 other than port"
        ):
            cls(**({"replay": REPLAY} if cls is LearnerConfig else {}), port=7777, health_port=bad)


def test_a_learner_publishing_elsewhere_serves_no_health_port():
    with pytest.raises(ValueError, match=r"^health_port \(8123\) belongs to the hosted parameter service"):
        LearnerConfig(replay=REPLAY, params="127.0.0.1:7100", health_port=8123)


def test_credentials_build_from_the_files(certs):
    tls = TlsFiles.read(certs.cert, certs.key, certs.ca)
    assert isinstance(grpc_util.server_credentials(tls), grpc.ServerCredentials)
    assert isinstance(grpc_util.channel_credentials(tls), grpc.ChannelCredentials)
    assert isinstance(grpc_util.channel_credentials(TlsFiles.read(ca=certs.ca)), grpc.ChannelCredentials)
    with pytest.raises(ValueError, match="a TLS server needs tls_cert and tls_key"):
        grpc_util.server_credentials(TlsFiles.read(ca=certs.ca))


# ------------------------------------------------------------------------------------------- launcher, fleet file
def test_the_fleet_checks_its_tls_files(certs, tmp_path):
    assert FleetSettings(tls_cert=certs.cert, tls_key=certs.key, tls_ca=certs.ca).tls_files().mutual
    assert FleetSettings().tls_files() is None
    with pytest.raises(ConfigError, match="^tls_key is missing"):
        FleetSettings(tls_cert=certs.cert)
    message = error(fleet(fleet={"tls_cert": certs.cert, "tls_key": str(tmp_path / "gone.pem")}))
    assert message.startswith("[fleet]: tls_key (") and "cannot be read" in message


def test_every_role_gets_the_machines_tls_files(certs, tmp_path):
    config = local_fleet(num_shards=2, num_actors=2, tls_cert=certs.cert, tls_key=certs.key, tls_ca=certs.ca)
    check_commands(config, config.learner.host, tmp_path, {})
    by_name = {r.name: r for r in roles(config)}
    links = Wiring(("127.0.0.1:7000", "127.0.0.1:7001"), "127.0.0.1:7100")
    for name in ("shard-0", "learner", "actor-1", "evaluator"):
        role_settings = role_config(config, by_name[name], links, tmp_path)
        assert (role_settings.tls_cert, role_settings.tls_key, role_settings.tls_ca) == (
            certs.cert,
            certs.key,
            certs.ca,
        ), name


def test_a_server_machine_needs_a_certificate_with_its_ca(certs, tmp_path):
    config = local_fleet(num_shards=1, num_actors=1, tls_ca=certs.ca)  # fine for [fleet]: clients may do this
    with pytest.raises(
        ConfigError, match=r"^shard-0: .*tls_ca \(.*\) needs tls_cert and tls_key on a server"
    ):
        check_commands(config, config.learner.host, tmp_path, {})


def test_a_role_table_may_not_set_its_own_tls_files(certs):
    message = error(fleet(shard=[{"host": "m1", "port": 7000, "tls_cert": certs.cert}]))
    assert "tls_cert is set by the launcher from [fleet] tls_cert" in message


def test_health_ports_may_not_collide(certs):
    data = fleet(
        shard=[
            {"host": "m1", "port": 7000, "health_port": 8000},
            {"host": "m1", "port": 7001, "health_port": 8000},
        ]
    )
    assert "port 8000 on host 'm1' is used by both shard-0 (health_port) and shard-1 (health_port)" in error(
        data
    )
    data = fleet(learner={"host": "m1", "port": 7100, "health_port": 7000})
    assert "used by both shard-0 (port) and learner (health_port)" in error(data)


def test_the_launcher_checks_health_over_tls_or_on_the_health_port(certs, tmp_path):
    """The launcher's own health checks use the machine's TLS files, or a server's plaintext health port."""
    tls = {"tls_cert": certs.cert, "tls_key": certs.key, "tls_ca": certs.ca}
    config = parse_config(
        fleet(
            fleet=tls, shard=[{"host": "m1", "port": 7000, "health_port": 8000}, {"host": "m1", "port": 7001}]
        )
    )
    launcher = Fleet(config, "m2", tmp_path, extra_args={}, stop=threading.Event())
    assert launcher._probe("m1", 7000, launcher._health_port(0)) == ("10.0.0.1:8000", None)
    assert launcher._probe("m1", 7001, launcher._health_port(1)) == ("10.0.0.1:7001", config.tls_files())
    assert launcher._probe("m1", 7100, launcher._health_port(None))[1].mutual


def test_a_key_that_is_not_the_certificates_is_refused_when_binding(certs):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    with pytest.raises(
        OSError, match=r"cannot serve TLS on 127.0.0.1:0: .*is tls_key the private key of tls_cert"
    ):
        grpc_util.bind(server, "127.0.0.1:0", tls=TlsFiles.read(certs.cert, certs.foreign_key))


# ------------------------------------------------------------------------------------------------ tls_server_name
@pytest.mark.parametrize("cls", [LearnerConfig, ActorConfig])
def test_a_client_checks_certificates_against_tls_server_name(cls, certs):
    config = make(
        cls,
        tls_ca=certs.ca,
        tls_server_name="apexrl-replay.apexrl.svc",
        **({"params": "127.0.0.1:7100"} if cls is LearnerConfig else {}),
    )
    assert tls_of(config).server_name == "apexrl-replay.apexrl.svc"
    parsed = parse_argv(
        cls,
        [
            "--replay",
            "dns:///apexrl-replay:7000",
            "--params",
            "127.0.0.1:7200",
            "--tls-ca",
            certs.ca,
            "--tls-server-name",
            "apexrl-replay.apexrl.svc",
        ],
        prog="test",
    )
    assert tls_of(parsed).server_name == "apexrl-replay.apexrl.svc"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("apexrl-replay.apexrl.svc", None),
        ("10.0.0.7", None),
        ("*.apexrl.svc", "must be a name the certificate covers, not a wildcard"),
        ("apexrl-replay:7000", "must be a host name"),
        ("dns:///apexrl-replay", "must be a host name"),
        ("two words", "must be a host name"),
        ("", "must be a host name"),
    ],
)
def test_tls_server_name_is_a_host_name(certs, name, expected):
    if expected is None:
        assert TlsFiles.read(ca=certs.ca, server_name=name).server_name == name
        return
    with pytest.raises(ValueError, match=rf"^tls_server_name \(.*\) {expected}"):
        make(ActorConfig, tls_ca=certs.ca, tls_server_name=name)


def test_tls_server_name_needs_tls_files(certs):
    with pytest.raises(ValueError, match=r"^tls_server_name \(apexrl.svc\) needs tls_ca or tls_cert"):
        make(ActorConfig, tls_server_name="apexrl.svc")
    with pytest.raises(ConfigError, match=r"^tls_server_name \(apexrl.svc\) needs tls_ca or tls_cert"):
        FleetSettings(tls_server_name="apexrl.svc")


@pytest.mark.parametrize("cls", SERVERS)
def test_a_pure_server_has_no_tls_server_name(cls, certs):
    with pytest.raises(SettingsError, match="unknown flag --tls-server-name"):
        parse_argv(
            cls, ["--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-server-name", "x"], prog="test"
        )


def test_the_launcher_gives_tls_server_name_to_every_role_that_dials(certs, tmp_path):
    config = local_fleet(
        num_shards=2,
        num_actors=2,
        tls_cert=certs.named_cert,
        tls_key=certs.named_key,
        tls_ca=certs.ca,
        tls_server_name="apexrl-replay.apexrl.svc",
    )
    check_commands(config, config.learner.host, tmp_path, {})
    assert config.tls_files().server_name == "apexrl-replay.apexrl.svc"  # the launcher's own health checks
    by_name = {r.name: r for r in roles(config)}
    links = Wiring(("127.0.0.1:7000", "127.0.0.1:7001"), "127.0.0.1:7100")
    for name in ("learner", "actor-1", "evaluator"):
        assert (
            role_config(config, by_name[name], links, tmp_path).tls_server_name == "apexrl-replay.apexrl.svc"
        )
    assert not hasattr(role_config(config, by_name["shard-0"], links, tmp_path), "tls_server_name")
    message = error(fleet(learner={"host": "m1", "port": 7100, "tls_server_name": "x.svc"}))
    assert "tls_server_name is set by the launcher from [fleet] tls_server_name" in message

"""Roles and the method access list on real servers (loopback): each attack of a stolen actor credential is
refused with PERMISSION_DENIED naming the role and the method, changes nothing, and is audited.

Every test here fails on a server without roles (one token allowed every call)."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import trustme

from apexrl.common.access import AccessPolicy
from apexrl.common.errors import ApexError, PermissionDeniedError, UnauthenticatedError
from apexrl.common.grpc_util import wait_for_health
from apexrl.common.process import TOKEN_VARIABLE
from apexrl.common.signature import Signature
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, start_shard_process, wait_until
from tests.integration.launcher.test_main import Launch

TOKENS = {
    "actor.m1": "t-actor-m1",
    "actor.evil": "t-actor-evil",
    "learner": "t-learner",
    "evaluator": "t-evaluator",
    "operator": "t-operator",
}


@pytest.fixture
def tokens_dir(tmp_path) -> Path:
    directory = tmp_path / "tokens"
    directory.mkdir(mode=0o700)
    for name, token in TOKENS.items():
        (directory / name).write_text(token)
        (directory / name).chmod(0o600)
    return directory


# What `cartpole_batch` writes, pinned as a fleet pins it (--signature) so actors can write the first rows.
CARTPOLE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"


@pytest.fixture
def role_shard(make_shard, tokens_dir):
    def make(*, pinned: bool = True):
        config = TableConfig(capacity=1000, seed=0, signature=Signature.parse(CARTPOLE) if pinned else None)
        return make_shard(config, access=AccessPolicy.from_settings(None, str(tokens_dir), False))

    return make


def client(address: str, identity: str, **options) -> ReplayClient:
    return ReplayClient(address, token=TOKENS[identity], timeout=10.0, **options)


def filled(address: str, rows: int = 64) -> None:
    with client(address, "actor.m1", writer_id="w") as actor:
        actor.insert(cartpole_batch(rows), priorities=np.ones(rows))
        actor.flush(timeout=20)


def denied(call, method: str, identity: str = "actor.m1 (role actor)") -> PermissionDeniedError:
    with pytest.raises(PermissionDeniedError) as info:
        call()
    assert f"{identity} may not call ReplayService/{method}" in str(info.value), info.value
    return info.value


def test_an_actor_cannot_sample_update_priorities_or_checkpoint_and_nothing_changes(role_shard, caplog):
    shard = role_shard()
    filled(shard.address)
    with client(shard.address, "learner") as learner:
        batch = learner.sample(8)
        before = learner.info()
    caplog.set_level(logging.INFO, logger="apexrl.audit")
    with client(shard.address, "actor.m1") as actor:
        denied(lambda: actor.sample(256), "Sample")
        # One key at 1e25 would make every later Sample(256) return that row 256 times.
        denied(
            lambda: actor.update_priorities(batch.keys[:1], np.array([1e25]), incarnation=batch.incarnation),
            "UpdatePriorities",
        )
        stream = actor.priority_stream()
        try:
            assert stream.send(batch.keys[:1], np.array([1e25]), incarnation=batch.incarnation)
            assert stream.flush(timeout=20) and (stream.applied, stream.dropped) == (0, 1)
        finally:
            stream.close()
        denied(actor.checkpoint, "Checkpoint")
        assert actor.info().size == 64  # what it needs still works
    with client(shard.address, "learner") as learner:
        after = learner.info()
    assert (after.sampled_total, after.total_priority, after.max_priority, after.updated_total) == (
        before.sampled_total,
        before.total_priority,
        before.max_priority,
        before.updated_total,
    )
    refused = [
        r.getMessage() for r in caplog.records if r.name == "apexrl.audit" and "refused" in r.getMessage()
    ]
    assert any(
        "refused ReplayService/Sample from ipv4:127.0.0.1:" in line and "actor.m1" in line for line in refused
    ), refused
    assert any("refused ReplayService/Checkpoint" in line for line in refused), refused


def test_the_learner_cannot_checkpoint_and_the_evaluator_cannot_write(role_shard):
    shard = role_shard()
    filled(shard.address)
    with client(shard.address, "learner") as learner:
        denied(learner.checkpoint, "Checkpoint", "learner")
    with client(shard.address, "evaluator", writer_id="e") as evaluator:
        evaluator.insert(cartpole_batch(4, start=500), priorities=np.ones(4))
        with pytest.raises(PermissionDeniedError, match="evaluator may not call ReplayService/Insert"):
            evaluator.flush(timeout=10)
    with client(shard.address, "operator") as operator:
        # Allowed through the access list; this shard has no checkpoint directory, which the shard says itself.
        with pytest.raises(ApexError, match="no checkpoint directory") as info:
            operator.checkpoint()
        assert not isinstance(info.value, PermissionDeniedError)
        assert operator.info().size == 64


def test_an_unknown_token_is_unauthenticated_and_health_stays_open(role_shard):
    shard = role_shard()
    with (
        ReplayClient(shard.address, token="t-guess", timeout=5.0) as stranger,
        pytest.raises(UnauthenticatedError),
    ):
        stranger.info()
    with ReplayClient(shard.address, timeout=5.0) as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.info()
    wait_for_health(shard.address, timeout=10)  # probes carry no credential


def test_one_actor_cannot_poison_another_actors_de_duplication(role_shard):
    shard = role_shard()
    # The attacker stores a row under the victim's writer id with the largest sequence there is: on a server
    # without identities every later batch of the victim came back "duplicate" and nothing was stored.
    with client(shard.address, "actor.evil", writer_id="victim") as evil:
        evil._next_sequence = (1 << 64) - 1  # noqa: SLF001 (what a hand-made InsertRequest would carry)
        evil.insert(cartpole_batch(1, start=900), priorities=np.ones(1))
        evil.flush(timeout=10)
    assert shard.table.info().size == 1
    with client(shard.address, "actor.m1", writer_id="victim") as victim:
        victim.insert(cartpole_batch(8), priorities=np.ones(8))
        victim.flush(timeout=10)
    assert shard.table.info().size == 9 and shard.table.info().duplicate_batches_total == 0


def test_only_the_learner_or_an_operator_fixes_a_tables_signature_by_a_first_insert(role_shard):
    shard = role_shard(pinned=False)  # no --signature: the first insert fixes the columns
    hijack = {"obs": np.zeros((1, 2), dtype=np.int8)}
    with client(shard.address, "actor.evil", writer_id="h") as evil:
        evil.insert(hijack, priorities=np.ones(1))
        with pytest.raises(PermissionDeniedError, match="may not fix the columns of this table"):
            evil.flush(timeout=10)
    assert shard.table.signature is None and shard.table.info().size == 0
    with client(shard.address, "learner", writer_id="seed") as learner:
        learner.insert(cartpole_batch(2), priorities=np.ones(2))
        learner.flush(timeout=10)
    assert shard.table.signature is not None
    filled(shard.address, 8)  # actors write once the columns are fixed
    assert shard.table.info().size == 10


# ----------------------------------------------------------------------------------- certificate roles
@pytest.fixture(scope="module")
def role_certs(tmp_path_factory) -> dict[str, TlsFiles]:
    """A CA, a server certificate for 127.0.0.1 and client certificates whose common names are roles."""
    directory = tmp_path_factory.mktemp("role-certs")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))

    def write(name: str, cert) -> tuple[str, str]:
        chain, key = directory / f"{name}.pem", directory / f"{name}.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return str(chain), str(key)

    files = {"server": write("server", ca.issue_cert("localhost", "127.0.0.1"))}
    for name in ("learner", "actor.pod-3", "robot"):
        files[name] = write(name, ca.issue_cert("localhost", common_name=name))
    return {name: TlsFiles.read(cert, key, str(directory / "ca.pem")) for name, (cert, key) in files.items()}


def test_under_mutual_tls_the_certificates_common_name_names_the_role(make_shard, role_certs):
    shard = make_shard(
        TableConfig(capacity=1000, seed=0),
        tls=role_certs["server"],
        access=AccessPolicy(certificate_roles=True),
    )
    with ReplayClient(shard.address, tls=role_certs["actor.pod-3"], writer_id="w", timeout=10.0) as actor:
        actor.insert(cartpole_batch(16), priorities=np.ones(16))
        with pytest.raises(PermissionDeniedError, match="may not fix the columns"):
            actor.flush(timeout=10)
    with ReplayClient(shard.address, tls=role_certs["learner"], writer_id="seed", timeout=10.0) as learner:
        learner.insert(cartpole_batch(16), priorities=np.ones(16))
        learner.flush(timeout=10)
        assert len(learner.sample(4).keys) == 4
    with ReplayClient(shard.address, tls=role_certs["actor.pod-3"], timeout=10.0) as actor:
        denied(lambda: actor.sample(4), "Sample", "actor.pod-3 (role actor)")
    with (
        ReplayClient(shard.address, tls=role_certs["robot"], timeout=10.0) as robot,
        pytest.raises(PermissionDeniedError, match="common name 'robot' names no role"),
    ):
        robot.info()


# ----------------------------------------------------------------------------------- the shard process
def test_a_shard_process_serves_role_tokens_and_audits_refusals(tmp_path, tokens_dir):
    shard = start_shard_process(tmp_path, "roles", "--role-tokens", str(tokens_dir), "--signature", CARTPOLE)
    try:
        filled(shard.address, 8)
        with client(shard.address, "actor.m1") as actor:
            denied(lambda: actor.sample(4), "Sample")
    finally:
        assert shard.stop() == 0
    log = (tmp_path / "roles.log").read_text()
    assert "refused ReplayService/Sample from ipv4:127.0.0.1:" in log and "PERMISSION_DENIED" in log, log
    assert "t-actor" not in log  # tokens never reach a log


def test_a_fleet_token_beside_role_tokens_is_refused_in_one_line(tmp_path, tokens_dir):
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "replay", "--port", "0", "--role-tokens", str(tokens_dir)],
        env={"APEXRL_TOKEN": "s3cret", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--token and --role-tokens" in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
        done.stderr
    )


# ----------------------------------------------------------------------------------- the parameter service
WEIGHTS = {"w": np.arange(6, dtype=np.float32)}


@pytest.fixture
def role_params(tokens_dir):
    made = create_parameter_server(
        "127.0.0.1:0", access=AccessPolicy.from_settings(None, str(tokens_dir), False)
    )
    server, port, _store = made.server, made.port, made.store
    yield f"127.0.0.1:{port}"
    server.stop(0).wait(10)


def test_only_the_learner_publishes_weights(role_params, caplog):
    caplog.set_level(logging.INFO, logger="apexrl.audit")
    with ParameterClient(role_params, token=TOKENS["learner"]) as learner:
        assert learner.publish(WEIGHTS) == 1
    with ParameterClient(role_params, token=TOKENS["actor.evil"]) as actor:
        # With any credential, a publish once made every actor fetch the attacker's weights (at version 2^64-1,
        # every later publish of the learner failed too). Versions are bounded now; publishing is the learner's.
        for version in (None, 2, 1 << 20):
            with pytest.raises(
                PermissionDeniedError,
                match=r"actor.evil \(role actor\) may not call "
                r"ParameterService/Publish \(allowed: learner\)",
            ):
                actor.publish({"w": np.zeros(6, dtype=np.float32)}, version=version)
        version, weights = actor.fetch(0)  # what actors need still works, and it is the learner's
    assert version == 1 and np.array_equal(weights["w"], WEIGHTS["w"])
    with ParameterClient(role_params, token=TOKENS["evaluator"]) as evaluator:
        assert evaluator.version() == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "apexrl.audit"]
    assert any(
        line.startswith("allowed ParameterService/Publish from ipv4:127.0.0.1:") and "learner" in line
        for line in lines
    ), lines
    assert any(
        line.startswith("refused ParameterService/Publish") and "actor.evil" in line for line in lines
    ), lines


def test_a_learner_hosting_the_service_with_role_tokens_refuses_an_actors_and_its_own_tokens_publish(
    tmp_path, tokens_dir
):
    port_file = tmp_path / "learner.port"
    log = tmp_path / "learner.log"
    with open(log, "w") as out:
        learner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "learner",
                "--replay",
                "127.0.0.1:1",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--metrics-port",
                "-1",
                "--role-tokens",
                str(tokens_dir),
                "--token-file",
                str(tokens_dir / "learner"),
                "--run-dir",
                str(tmp_path / "run"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert learner.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        with ParameterClient(address, token=TOKENS["actor.m1"], timeout=30.0) as actor:
            with pytest.raises(PermissionDeniedError, match="may not call ParameterService/Publish"):
                actor.publish(WEIGHTS, version=2)
            assert actor.version() >= 0
        # The learner publishes in-process: its own token is no credential for this service over the network.
        with (
            ParameterClient(address, token=TOKENS["learner"], timeout=30.0) as stolen,
            pytest.raises(UnauthenticatedError),
        ):
            stolen.publish(WEIGHTS, version=1_000_000)
    finally:
        learner.terminate()
        learner.wait(60)
    text = log.read_text()
    assert f"(hosted, roles from role tokens in {tokens_dir}, plaintext" in text, text
    assert "refused ParameterService/Publish" in text and "actor.m1" in text, text


# ----------------------------------------------------------------------------------- a launched fleet
@pytest.mark.timeout(300)
def test_a_launched_fleet_trains_with_role_tokens_and_each_role_holds_only_its_own(tmp_path, tokens_dir):
    (tokens_dir / "actor.0").write_text("t-actor-0")  # actor 0's own token: used instead of the shared one
    run = Launch(tmp_path, "--role-tokens", str(tokens_dir))
    try:
        pids = run.wait_running(timeout=180)
        held = {
            name: dict(
                v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v
            ).get(TOKEN_VARIABLE.encode())
            for name, pid in pids.items()
        }
        assert held == {
            "shard-0": None,
            "learner": b"t-learner",
            "actor-0": b"t-actor-0",
            "evaluator": b"t-evaluator",
        }, held
        ports = {r["name"]: r["port"] for r in run.config()["roles"]}
        shard = f"127.0.0.1:{ports['shard-0']}"
        with ReplayClient(shard, timeout=10, token=TOKENS["operator"]) as operator:
            wait_until(
                lambda: operator.info().sampled_total > 0,
                "the learner sampled what the actor inserted",
                timeout=150,
            )  # every role could do its job with its own token
        with ParameterClient(
            f"127.0.0.1:{ports['learner']}", token=TOKENS["evaluator"], timeout=10
        ) as reader:
            wait_until(lambda: reader.version() > 1, "the learner published new weights", timeout=150)
        with client(shard, "actor.m1") as actor:
            denied(lambda: actor.sample(4), "Sample")
        run.process.send_signal(signal.SIGTERM)
        _code, result, _err = run.wait(120)
        assert result["reason"] == "signal"
        run.assert_no_role_left()
    finally:
        run.cleanup()
    assert "refused ReplayService/Sample" in run.log("shard-0")
    for path in [p for p in run.run_dir.rglob("*") if p.is_file()]:
        assert b"t-learner" not in path.read_bytes() and b"t-actor-0" not in path.read_bytes(), path
    signature = run.config()["roles"][0]["command"]
    assert "--signature" in signature and "--role-tokens" in signature  # shards pinned, in role mode


def test_a_role_token_directory_missing_a_roles_token_is_refused_before_anything_starts(tmp_path):
    directory = tmp_path / "tokens"
    directory.mkdir()
    (directory / "learner").write_text("t-learner")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "launch",
            "--num-actors",
            "1",
            "--role-tokens",
            str(directory),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"{directory} has no token for evaluator" in done.stderr
        or f"{directory} has no token for actor 0" in done.stderr
    ), done.stderr
    assert not (tmp_path / "run").exists()


def test_a_shards_only_machine_in_role_mode_without_the_columns_is_refused_before_anything_starts(tmp_path):
    """With roles on, no actor may fix a shard's columns by its first insert: a machine that cannot pin them (no
    gymnasium to read the environment's spaces) must say so and how to fix it, not start shards no actor can fill."""
    core_only = tmp_path / "core-only"
    core_only.mkdir()
    (core_only / "sitecustomize.py").write_text(
        "import sys\nfor name in ('torch', 'gymnasium', 'matplotlib'):\n    sys.modules[name] = None\n"
    )
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "learner.sha256").write_text(hashlib.sha256(b"t-learner").hexdigest())
    fleet = Path(__file__).resolve().parents[2] / "examples" / "fleets" / "three_machines.toml"
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", "--config", str(fleet), "--host-name", "m1"]
        + ["--role-tokens", str(tokens), "--max-seconds", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(core_only), os.environ.get("PYTHONPATH")])),
        },
    )
    assert done.returncode == 2, done.stderr
    assert "set [[shard]] signature" in done.stderr and "apexrl signature --env CartPole-v1" in done.stderr
    assert not list(tmp_path.glob("runs/*/logs/*.log"))  # nothing started

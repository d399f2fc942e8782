"""The bearer token kept out of sight, on real role processes and a launched fleet.

Every role takes the token from --token, else --token-file, else APEXRL_TOKEN; a token file that gives none is
one line and exit status 2. `apexrl launch` hands the token to its roles through their environment: it is on no
process's command line and in no file of the run directory, and the fleet still trains with it while a client
without it is refused UNAUTHENTICATED. A server that requires a token over plaintext on a non-loopback address
warns at start. Run directories, logs and checkpoints (learner, shard, write-ahead log) are their owner's alone.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from apexrl.common.errors import UnauthenticatedError
from apexrl.common.spaces import EnvSpaces
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpoint import write_snapshot
from apexrl.replay_server.durability.snapshot import Snapshot
from apexrl.replay_server.durability.wal import WriteAheadLog
from apexrl.replay_server.server.service import create_replay_server
from tests.conftest import cartpole_batch, wait_until
from tests.integration.launcher.test_main import Launch
from tests.support.certs import make_certs

TOKEN_VARIABLE = "APEXRL_TOKEN"  # the documented name (common.process.TOKEN_VARIABLE)
IN_CLEAR = "with a bearer token over plaintext: the token crosses the network in clear"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_token(path: Path, token: str) -> str:
    path.write_text(f"{token}\n")
    path.chmod(0o600)
    return str(path)


def environment(**variables: str) -> dict[str, str]:
    """This process's environment without any APEXRL_TOKEN, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE}
    return {**env, "PYTHONUNBUFFERED": "1", **variables}


class Shard:
    """`apexrl replay` in a child process on a free port, its stderr in a file; stopped with SIGTERM."""

    def __init__(self, tmp_path: Path, *argv: str, host: str = "127.0.0.1", env: dict[str, str]) -> None:
        self.port_file, self.err_path = tmp_path / "shard.port", tmp_path / "shard.err"
        with open(self.err_path, "w") as err:
            self.process = subprocess.Popen(
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
                    str(self.port_file),
                    *argv,
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        wait_until(
            lambda: self.port_file.exists() or self.process.poll() is not None,
            "the shard wrote its port",
            timeout=60,
        )
        assert self.process.poll() is None, self.err_path.read_text()
        self.address = f"127.0.0.1:{int(self.port_file.read_text())}"

    def accepts(self, token: str | None) -> bool:
        try:
            with ReplayClient(self.address, timeout=10, token=token) as client:
                client.info()
            return True
        except UnauthenticatedError:
            return False

    def stop(self) -> str:
        """SIGTERM, wait, and return its stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.err_path.read_text()


@pytest.fixture
def start_shard(tmp_path) -> Iterator:
    started: list[Shard] = []

    def start(*argv: str, **options) -> Shard:
        started.append(Shard(tmp_path, *argv, **options))
        return started[-1]

    yield start
    for shard in started:
        shard.stop()


# --- where a role's token comes from -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("source", "accepted", "refused"),
    [
        ("flag", "A", ("B", "C", None)),  # --token A --token-file B, APEXRL_TOKEN=C
        ("file", "B", ("C", None)),  # --token-file B, APEXRL_TOKEN=C
        ("variable", "C", ("wrong", None)),  # APEXRL_TOKEN=C
    ],
)
def test_a_role_takes_the_flag_then_the_file_then_the_variable(
    start_shard, tmp_path, source, accepted, refused
):
    tokens = {"A": "token-a", "B": "token-b", "C": "token-c", "wrong": "wrong", None: None}
    argv = {
        "flag": ["--token", "token-a", "--token-file", write_token(tmp_path / "b", "token-b")],
        "file": ["--token-file", write_token(tmp_path / "b", "token-b")],
        "variable": [],
    }[source]
    shard = start_shard(*argv, env=environment(**{TOKEN_VARIABLE: "token-c"}))
    assert shard.accepts(tokens[accepted])
    assert not any(shard.accepts(tokens[t]) for t in refused)
    assert IN_CLEAR not in shard.stop()  # 127.0.0.1: nothing crosses a network


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role", ["replay", "params", "learner", "actor", "launch"])
def test_a_missing_token_file_is_one_line_and_exit_status_2(tmp_path, role):
    missing = tmp_path / "no-such-token"
    required = {
        "learner": ["--replay", "127.0.0.1:1"],
        "actor": ["--replay", "127.0.0.1:1", "--params", "127.0.0.1:2"],
    }.get(role, [])
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", role, *required, "--token-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env=environment(**{TOKEN_VARIABLE: "not-a-fallback"}),
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr
        == f"apexrl {role}: error: --token-file: cannot read {missing}: No such file or directory\n"
    )


# --- the plaintext warning -----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_shard_serving_its_token_in_clear_on_every_interface_says_so(start_shard):
    shard = start_shard(host="0.0.0.0", env=environment(**{TOKEN_VARIABLE: "s3cret"}))
    assert shard.accepts("s3cret")
    err = shard.stop()
    port = shard.address.rpartition(":")[2]
    assert f"WARNING apexrl.common.grpc_util: serving 0.0.0.0:{port} {IN_CLEAR}" in err, err


@pytest.mark.parametrize(
    ("address", "token", "tls", "warns"),
    [
        ("0.0.0.0:0", "s3cret", False, True),
        ("127.0.0.1:0", "s3cret", False, False),
        ("0.0.0.0:0", None, False, False),
        ("0.0.0.0:0", "s3cret", True, False),
    ],
)
@pytest.mark.parametrize("server", ["thread-pool (parameter service)", "asyncio (replay shard)"])
def test_only_a_token_in_clear_on_a_non_loopback_bind_warns(
    tmp_path, caplog, server, address, token, tls, warns
):
    caplog.set_level(logging.WARNING, logger="apexrl.common.grpc_util")
    files = None
    if tls:
        certs = make_certs(tmp_path)
        files = TlsFiles.read(certs.cert, certs.key)
    if server.startswith("thread-pool"):
        stop = create_parameter_server(address, token=token, tls=files).server.stop
    else:
        stop = create_replay_server(
            ReplayTable(TableConfig(capacity=10)), address, token=token, tls=files
        ).server.stop
    try:
        assert (IN_CLEAR in caplog.text) is warns, caplog.text
    finally:
        stop(0).wait(10)


# --- file modes ------------------------------------------------------------------------------------------------------


def test_shard_checkpoints_write_ahead_logs_and_learner_checkpoints_are_owner_only(tmp_path):
    previous = os.umask(0o000)  # even a permissive umask leaves them private
    try:
        table = ReplayTable(TableConfig(capacity=100, seed=0))
        log = WriteAheadLog(tmp_path / "wal")
        log.open(table)
        table.insert(cartpole_batch(10), np.ones(10), writer_id="w", sequence=0)
        log.close()
        with Snapshot.take(table, 16) as snapshot:
            write_snapshot(tmp_path / "shard.ckpt", snapshot)
        from apexrl.algorithms.checkpoint import Checkpoint, save_checkpoint

        learner = save_checkpoint(
            tmp_path / "checkpoints" / "checkpoint.pt",
            Checkpoint(
                env_id="CartPole-v1",
                algorithm="dqn",
                spaces=EnvSpaces.vector(4, 2),
                architecture={},
                state={},
                acting_weights={},
                updates=0,
                weight_version=0,
            ),
        )
    finally:
        os.umask(previous)
    segments = list((tmp_path / "wal").glob("wal-*.log"))
    assert segments and all(mode(s) == 0o600 for s in segments)
    assert mode(tmp_path / "shard.ckpt") == 0o600
    assert mode(learner) == 0o600


# --- a launched fleet ----------------------------------------------------------------------------------------------


def command_lines() -> dict[int, bytes]:
    """pid -> command line of every process this user can see."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return lines


@pytest.mark.timeout(240)
def test_a_fleet_keeps_its_token_out_of_command_lines_and_files_and_still_trains(tmp_path, monkeypatch):
    token, decoy = f"fleet-{secrets.token_hex(16)}", f"decoy-{secrets.token_hex(16)}"
    monkeypatch.setenv(TOKEN_VARIABLE, decoy)  # --token-file comes first: the variable is not used
    run = Launch(tmp_path, "--token-file", write_token(tmp_path / "token", token))
    try:
        pids = run.wait_running(timeout=180)
        leaks = {
            pid: line
            for pid, line in command_lines().items()
            if token.encode() in line or decoy.encode() in line
        }
        assert not leaks, leaks
        for name, pid in pids.items():  # each role got the file's token in its environment
            variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"{TOKEN_VARIABLE}={token}".encode() in variables, name
        ports = {r["name"]: r["port"] for r in run.config()["roles"]}
        shard, params = f"127.0.0.1:{ports['shard-0']}", f"127.0.0.1:{ports['learner']}"
        with ReplayClient(shard, timeout=10, token=token) as client:  # authenticated, the fleet trains
            wait_until(
                lambda: client.info().sampled_total > 0,
                "the learner sampled what the actor inserted",
                timeout=120,
            )
        for wrong in (None, decoy):
            with ReplayClient(shard, timeout=10, token=wrong) as client, pytest.raises(UnauthenticatedError):
                client.info()
            with (
                ParameterClient(params, timeout=10, token=wrong) as client,
                pytest.raises(UnauthenticatedError),
            ):
                client.version()
        run.process.send_signal(signal.SIGTERM)
        code, result, err = run.wait(120)
        assert result["reason"] == "signal"
        run.assert_no_role_left()
    finally:
        run.cleanup()
    files = [p for p in [*run.run_dir.rglob("*"), run.out_path, run.err_path] if p.is_file()]
    assert run.run_dir / "config.json" in files and run.run_dir / "logs" / "learner.log" in files
    for path in files:
        data = path.read_bytes()
        assert token.encode() not in data and decoy.encode() not in data, path
    assert mode(run.run_dir) == mode(run.run_dir / "logs") == mode(run.run_dir / "checkpoints") == 0o700
    logs = list((run.run_dir / "logs").iterdir())
    assert len(logs) == 4 and all(mode(log) == 0o600 for log in logs), {p.name: oct(mode(p)) for p in logs}
    assert mode(run.run_dir / "checkpoints" / "checkpoint.pt") == 0o600  # the learner's final checkpoint

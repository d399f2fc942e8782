"""A local fleet given no token makes one of its own (launcher/run_token.py), with real processes: its shard and
its parameter service refuse a client without it (UNAUTHENTICATED) and serve one that reads it from RUN_DIR/token
(0600), as examples/custom_actor.py does with --token-file; it is on no command line and in no config.json or log;
a resume uses it again; `open=True` runs open. Each fleet is small (one shard, one actor) and stopped once its
check is made."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import apexrl
from apexrl.common.errors import DeadlineExceededError, UnauthenticatedError, UnavailableError
from apexrl.common.process import TOKEN_VARIABLE
from apexrl.launcher.api import plan_new, plan_resume, start
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import cartpole_batch, wait_until
from tests.integration.launcher.test_main import Launch, pid_of
from tests.integration.test_secrets import command_lines

CUSTOM_ACTOR = Path(__file__).resolve().parents[3] / "examples" / "custom_actor.py"
FAST = ("--samples-per-insert", "0", "--min-replay-size", "64")  # our Sample need not wait for the learner
# Every role runs and the evaluator holds weights: the roles pass the token to each other.
RUNNING = {
    "shard-0": "replay shard serving on",
    "learner": "learner for CartPole-v1",
    "actor-0": "first environment step",
    "evaluator": "got weights version",
}


def rows(n: int) -> dict[str, np.ndarray]:
    """Rows of the columns the launcher pins on a CartPole DQN shard."""
    return {**cartpole_batch(n), "weight_version": np.zeros(n, np.int64)}


def ports(config: dict) -> dict[str, int]:
    return {r["name"]: r["port"] for r in config["roles"] if r["port"]}


def assert_refused_without_and_served_with(token: str, shard: str, params: str) -> None:
    for wrong in (None, "guess"):
        with ReplayClient(shard, timeout=10, token=wrong) as client:
            with pytest.raises(UnauthenticatedError):
                client.sample(8)
            client.insert(rows(8))
            with pytest.raises(UnauthenticatedError):
                client.flush(timeout=10)
        with ParameterClient(params, timeout=10, token=wrong) as client, pytest.raises(UnauthenticatedError):
            client.version()
    with ReplayClient(shard, timeout=30, token=token) as client:
        client.insert(rows(8))
        client.flush(timeout=30)
        assert len(client.sample(8).keys) == 8
        wait_until(lambda: client.info().sampled_total > 8, "the learner samples with the token", timeout=60)
    with ParameterClient(params, timeout=10, token=token) as client:
        assert client.version() >= 1


@pytest.mark.timeout(180)
def test_a_local_fleet_requires_the_token_it_made(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    run = Launch(tmp_path, *FAST)
    try:
        pids = run.wait_running(timeout=150, running=RUNNING)
        path = run.run_dir / "token"
        token = run.token()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) >= 43
        said = f"its bearer token is in {path} (your own clients: --token-file {path})"
        assert said in run.err_path.read_text()
        variable = f"{TOKEN_VARIABLE}={token}".encode()
        for name, pid in pids.items():  # each role holds it in its environment, none on its command line
            assert variable in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"), name
        assert not [pid for pid, line in command_lines().items() if token.encode() in line]
        found = ports(run.config())
        shard, params = f"127.0.0.1:{found['shard-0']}", f"127.0.0.1:{found['learner']}"
        assert_refused_without_and_served_with(token, shard, params)
        custom = [
            sys.executable,
            str(CUSTOM_ACTOR),
            "--replay",
            shard,
            "--params",
            params,
            "--token-file",
            str(path),
        ]
        done = subprocess.run([*custom, "--steps", "128"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "1 shards hold" in done.stdout, done.stderr[
            -3000:
        ]  # as docs/security.md says
        run.process.send_signal(signal.SIGTERM)
        assert run.wait(120)[1]["reason"] == "signal"
        run.assert_no_role_left()
    finally:
        run.cleanup()
    for file in [*run.run_dir.rglob("*"), run.out_path, run.err_path]:
        if file.is_file() and file != path:
            assert token.encode() not in file.read_bytes(), file
    assert json.loads((run.run_dir / "config.json").read_text())["fleet_file"]["fleet"]["token"] is None


@pytest.mark.timeout(180)
def test_the_python_launch_keeps_its_token_and_a_resume_hands_it_to_the_roles_again(tmp_path, monkeypatch):
    """`apexrl.launch`'s path (plan_new, start; its stop set before the first role starts) keeps the token where
    the CLI does; `apexrl launch --resume` hands the same one to the restarted roles, so a client holding it keeps
    working; once the file is removed a resume makes a new one."""
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    run_dir = tmp_path / "run"
    config = apexrl.local_fleet(num_shards=1, num_actors=1, evaluator=False, run_dir=str(run_dir))
    stopped = threading.Event()
    stopped.set()
    plan = plan_new(config, "local", {})
    token = plan.config.token
    assert plan.run_token and token and not run_dir.exists()  # planning writes nothing
    fleet = start(plan, stop=stopped)
    assert fleet.wait(60).reason == "signal"
    path = fleet.token_file
    assert path == run_dir / "token" and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    argv = [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--resume",
        str(run_dir),
        "--max-seconds",
        "90",
    ]
    with open(tmp_path / "resume.err", "w") as err:
        resumed = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        shard_pid: list[int] = []

        def shard_serving() -> bool:
            assert resumed.poll() is None, (tmp_path / "resume.err").read_text()[-3000:]
            try:
                recorded = json.loads((run_dir / "config.json").read_text())
            except (OSError, ValueError):
                return False
            command = next(r["command"] for r in recorded["roles"] if r["name"] == "shard-0")
            if not recorded["resumed_at"] or not command or not (pid := pid_of(command)):
                return False
            shard_pid[:] = [pid]
            try:
                with ReplayClient(
                    f"127.0.0.1:{ports(recorded)['shard-0']}", timeout=5, token=token
                ) as client:
                    client.info()
                return True
            except (UnavailableError, DeadlineExceededError):  # not serving yet
                return False

        wait_until(shard_serving, "the resumed shard serves the run's token", timeout=120)
        assert f"{TOKEN_VARIABLE}={token}".encode() in Path(f"/proc/{shard_pid[0]}/environ").read_bytes()
        assert path.read_text().strip() == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        resumed.send_signal(signal.SIGTERM)
        try:
            resumed.wait(90)
        except subprocess.TimeoutExpired:
            resumed.kill()
            resumed.wait(10)
    assert resumed.returncode in (0, 1), (tmp_path / "resume.err").read_text()[-3000:]
    path.unlink()
    assert plan_resume(run_dir, {}).config.token not in (None, token)


@pytest.mark.timeout(180)
def test_an_open_fleet_serves_a_client_without_a_token(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    caplog.set_level("INFO", logger="apexrl.launch")
    run_dir = tmp_path / "run"
    config = apexrl.local_fleet(
        num_shards=1, num_actors=1, evaluator=False, run_dir=str(run_dir), open=True, max_seconds=120
    )
    with apexrl.launch(config) as fleet:
        assert fleet.token_file is None

        def shard_serves() -> bool:
            assert fleet.running, fleet.wait()
            try:
                port = int((run_dir / "ports" / "shard-0.port").read_text())
                with ReplayClient(f"127.0.0.1:{port}", timeout=5) as client:
                    client.info()
                return True
            except (OSError, ValueError, UnavailableError, DeadlineExceededError):  # not serving yet
                return False

        wait_until(shard_serves, "the open shard serves a client without a token", timeout=120)
    assert not (run_dir / "token").exists()
    assert any("open: no bearer token" in r.getMessage() for r in caplog.records), caplog.text

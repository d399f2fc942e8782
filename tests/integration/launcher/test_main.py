"""`apexrl launch` (launcher/main.py, fleet.py) as a real process running a tiny local fleet of real role processes:
SIGTERM stops every role cleanly, a role that dies stops the fleet, a role that cannot start fails the launch; in
every case no child process outlives the launcher and the last line on stdout is the JSON result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apexrl.common.errors import DeadlineExceededError, UnavailableError
from tests.conftest import wait_until

ROLES = ["shard-0", "learner", "actor-0", "evaluator"]
# What each role logs once it runs (signal handlers in place, dependencies reached).
# Actors start while the learner starts, so an actor runs once it holds the learner's first weights.
RUNNING = {
    "shard-0": "replay shard serving on",
    "learner": "learner for CartPole-v1",
    "actor-0": "actor 0 got weights version",
    "evaluator": "evaluator 0/1 on CartPole-v1",
}
# A target no run reaches: these fleets are stopped by the test (a fault, a signal, --max-seconds), and the default
# fleet can solve CartPole within 15 s.
UNREACHABLE_TARGET = ("--target-return", "1000000")


class Launch:
    """`apexrl launch --num-shards 1 --num-actors 1` in a child process, output in files."""

    def __init__(self, tmp_path: Path, *argv: str) -> None:
        self.run_dir = tmp_path / "run"
        self.out_path, self.err_path = tmp_path / "launch.out", tmp_path / "launch.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "apexrl.launcher",
                    "launch",
                    "--num-shards",
                    "1",
                    "--num-actors",
                    "1",
                    "--seed",
                    "0",
                    "--max-seconds",
                    "90",
                    "--progress-seconds",
                    "1",
                    "--run-dir",
                    str(self.run_dir),
                    *UNREACHABLE_TARGET,
                    *argv,
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.pids: dict[str, int] = {}

    def config(self) -> dict | None:
        try:
            return json.loads((self.run_dir / "config.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_running(self, timeout: float = 60, running: dict[str, str] = RUNNING) -> dict[str, int]:
        """Wait until every role in `running` runs (its start line is in its log), and find each role's pid by
        its exact command line (config.json records the commands)."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"launcher exited early: {self.err_path.read_text()[-3000:]}"
            config = self.config()
            commands = {r["name"]: r["command"] for r in config["roles"]} if config else {}
            if (
                commands
                and all(commands.values())
                and all(line in self.log(name) for name, line in running.items())
            ):
                self.pids = {name: pid_of(command) for name, command in commands.items()}
                assert all(self.pids.values()), self.pids
                return self.pids
            assert time.monotonic() < deadline, "the fleet did not start"
            time.sleep(0.1)

    def token(self) -> str:
        """The bearer token the local fleet made for itself (RUN_DIR/token): its shards and its parameter service
        refuse a client without it."""
        return (self.run_dir / "token").read_text().strip()

    def log(self, role: str) -> str:
        try:
            return (self.run_dir / "logs" / f"{role}.log").read_text()
        except FileNotFoundError:
            return ""

    def assert_no_role_left(self) -> None:
        """No process runs the command of any role the launcher started (config.json records them)."""
        commands = [r["command"] for r in self.config()["roles"] if r["command"]]
        assert commands
        deadline = time.monotonic() + 10
        while left := [c[3] for c in commands if pid_of(c)]:
            assert time.monotonic() < deadline, f"roles still running after the launcher exited: {left}"
            time.sleep(0.05)

    def wait(self, timeout: float = 60) -> tuple[int, dict, str]:
        """The launcher's exit status, its final JSON line and its stderr."""
        code = self.process.wait(timeout)
        lines = self.out_path.read_text().strip().splitlines()
        assert lines, self.err_path.read_text()[-3000:]
        return code, json.loads(lines[-1]), self.err_path.read_text()

    def cleanup(self) -> None:
        """Leave no process behind, whatever the test did: the launcher stops its roles on SIGTERM; any role still
        running after that (the launcher was killed, or a test failed before it learnt the pids) is found by its
        command line and killed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        config = self.config()
        commands = [r["command"] for r in config["roles"] if r["command"]] if config else []
        pids = set(self.pids.values()) | {pid_of(command) for command in commands}
        for pid in pids:
            if pid and alive(pid):
                os.kill(pid, signal.SIGCONT)  # a stopped process is killed only once it runs again
                os.kill(pid, signal.SIGKILL)


def report_fault(what: str, killed_at: float, lost: str) -> None:
    """One line per fault for the record (`pytest -s`): what was killed, how long until the fleet was whole again
    (the restarted role serves and its peers use it), what was lost."""
    print(f"\nFAULT {what}: whole again {time.monotonic() - killed_at:.1f} s after the kill; lost: {lost}")


def pid_of(command: list[str]) -> int | None:
    """The pid of the running process whose argv is exactly `command`."""
    wanted = "\0".join(command).encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted:
                    return int(entry.name)
            except OSError:
                continue
    return None


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def assert_all_gone(pids: dict[str, int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while [name for name, pid in pids.items() if alive(pid)]:
        assert time.monotonic() < deadline, f"still running: {[n for n, p in pids.items() if alive(p)]}"
        time.sleep(0.05)


@pytest.fixture
def launch(tmp_path):
    started: list[Launch] = []

    def start(*argv: str) -> Launch:
        started.append(Launch(tmp_path, *argv))
        return started[-1]

    yield start
    for run in started:
        run.cleanup()


@pytest.mark.timeout(150)
def test_sigterm_stops_every_role_cleanly_and_prints_the_result(launch):
    run = launch()
    pids = run.wait_running()
    assert sorted(pids) == sorted(ROLES) and len(set(pids.values())) == len(ROLES)
    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    assert code == 1  # the local fleet checks the target return, and a signal is not "solved"
    assert result["reason"] == "signal" and result["solved"] is False
    assert result["run_dir"] == str(run.run_dir) and result["wall_seconds"] > 0
    assert_all_gone(pids)
    # Every role shut down on its SIGTERM (none had to be killed after the grace period).
    assert "killing" not in err
    run.assert_no_role_left()
    logs = {name: run.log(name) for name in ROLES}
    for name, text in logs.items():
        assert "received SIGTERM; shutting down" in text, name
        assert "Traceback" not in text, name
    assert "replay shard stopped" in logs["shard-0"] and "learner stopped after" in logs["learner"]
    assert "actor 0 stopped after" in logs["actor-0"] and "evaluator 0 stopped after" in logs["evaluator"]
    for name in ("progress.csv", "episodes.csv", "config.json"):
        assert (run.run_dir / name).is_file(), name


@pytest.mark.timeout(150)
def test_roles_shut_down_cleanly_when_their_launcher_is_killed(launch):
    """Roles run in their own sessions, so a launcher killed with SIGKILL (or by the OOM killer) cannot stop them:
    each notices that its launcher is gone and shuts down as on SIGTERM, instead of training on unsupervised and
    holding the run directory's lock."""
    run = launch()
    pids = run.wait_running()
    launcher = run.process.pid
    run.process.kill()
    run.process.wait(10)
    assert_all_gone(pids, timeout=60)
    for name in ROLES:
        text = run.log(name)
        assert f"the launcher (pid {launcher}) is gone; shutting down" in text, (name, text[-2000:])
        assert "Traceback" not in text, name
    logs = {name: run.log(name) for name in ROLES}
    assert "replay shard stopped" in logs["shard-0"] and "learner stopped after" in logs["learner"]
    assert "actor 0 stopped after" in logs["actor-0"] and "evaluator 0 stopped after" in logs["evaluator"]


@pytest.mark.timeout(150)
def test_a_role_that_dies_is_restarted_while_the_rest_of_the_fleet_runs_on(launch):
    run = launch()
    pids = run.wait_running()
    os.kill(pids["actor-0"], signal.SIGKILL)
    killed_at = time.monotonic()
    command = {r["name"]: r["command"] for r in run.config()["roles"]}["actor-0"]
    deadline = time.monotonic() + 30
    while (pid_of(command) in (None, pids["actor-0"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    restarted = pid_of(command)
    assert restarted not in (None, pids["actor-0"]), "actor-0 was not restarted"
    others = {name: pid for name, pid in pids.items() if name != "actor-0"}
    assert all(alive(pid) for pid in others.values())  # nothing else was touched
    wait_log = time.monotonic() + 30
    while run.log("actor-0").count("got weights version") < 2 and time.monotonic() < wait_log:
        time.sleep(0.1)
    assert run.log("actor-0").count("got weights version") >= 2  # the new actor works
    report_fault(
        "actor kill -9", killed_at, "its unacknowledged batches (at most 8 per shard) and its episode"
    )
    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    assert (
        result["reason"] == "signal"
        and result["restarts"] == 1
        and result["restarts_by_role"] == {"actor-0": 1}
    )
    assert "actor-0 was killed by SIGKILL" in err and "restarting it now (restart 1 of at most 5" in err
    assert_all_gone({**others, "actor-0": restarted})
    run.assert_no_role_left()


@pytest.mark.timeout(150)
def test_a_killed_shard_comes_back_on_its_address_and_both_sides_use_it_again(launch):
    from apexrl.replay_server.client.replay_client import ReplayClient

    run = launch()
    pids = run.wait_running()
    port = next(r["port"] for r in run.config()["roles"] if r["name"] == "shard-0")
    with ReplayClient(f"127.0.0.1:{port}", timeout=5, token=run.token()) as shard:

        def inserted() -> bool:
            try:
                return shard.info().inserted_total > 0
            except (UnavailableError, DeadlineExceededError):  # a connect that timed out under load: again
                return False

        wait_until(inserted, "the actor inserted", timeout=30)
        first = shard.info()
        os.kill(pids["shard-0"], signal.SIGKILL)
        killed_at = time.monotonic()

        def fresh_and_used() -> bool:
            try:
                info = shard.info(timeout=1)
            except Exception:  # noqa: BLE001 (down until the launcher restarts it)
                return False
            return (
                info.incarnation != first.incarnation and info.inserted_total > 0 and info.sampled_total > 0
            )

        wait_until(
            fresh_and_used,
            "the restarted shard was written to by the actor and sampled by the learner",
            timeout=60,
        )
        report_fault("only shard kill -9", killed_at, f"the {first.size} rows it held (no checkpoint yet)")
    assert all(alive(pid) for name, pid in pids.items() if name != "shard-0")
    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    assert result["restarts_by_role"] == {"shard-0": 1}
    run.assert_no_role_left()


@pytest.mark.timeout(150)
def test_one_of_three_shards_killed_while_training_loses_only_its_rows(launch):
    """kill -9 one shard of three while actors insert and the learner trains: the learner keeps training on the
    live shards, the actor's batches for the dead shard wait in its client (acknowledged inserts) and reach the
    restarted shard; what is lost is exactly the rows the dead shard held (no checkpoint yet)."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    run = launch("--num-shards", "3")
    pids = run.wait_running()
    ports = {r["name"]: r["port"] for r in run.config()["roles"] if r["kind"] == "replay"}
    clients = {
        name: ReplayClient(f"127.0.0.1:{port}", timeout=5, token=run.token()) for name, port in ports.items()
    }
    try:
        wait_until(
            lambda: all(c.info().sampled_total > 0 for c in clients.values()),
            "the learner sampled every shard",
            timeout=60,
        )
        before = {name: c.info() for name, c in clients.items()}
        os.kill(pids["shard-1"], signal.SIGKILL)
        killed_at = time.monotonic()
        lost = before["shard-1"].size
        # The live shards keep being written to and sampled while shard-1 is down or restarting.
        live = {name: before[name].sampled_total for name in ("shard-0", "shard-2")}
        wait_until(
            lambda: all(clients[n].info().sampled_total > live[n] for n in live),
            "the learner kept sampling the live shards",
            timeout=30,
        )

        def restarted_and_used() -> bool:
            try:
                info = clients["shard-1"].info(timeout=1)
            except Exception:  # noqa: BLE001 (down until the launcher restarts it)
                return False
            return info.incarnation != before["shard-1"].incarnation and info.sampled_total > 0

        wait_until(restarted_and_used, "shard-1 came back and the learner samples it again", timeout=60)
        report_fault("1 of 3 shards kill -9", killed_at, f"the {lost} rows it held (no checkpoint yet)")
        after = clients["shard-1"].info()
        assert after.inserted_total > 0  # the actor writes to it again (its held batches first)
        assert all(clients[n].info().incarnation == before[n].incarnation for n in live)  # untouched
    finally:
        for client in clients.values():
            client.close()
    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    assert result["restarts_by_role"] == {"shard-1": 1}
    assert lost > 0  # the documented loss: the rows shard-1 held when it died
    run.assert_no_role_left()


@pytest.mark.timeout(150)
def test_a_killed_learner_resumes_from_its_checkpoint_and_actors_follow_its_versions(launch):
    from apexrl.actor import ParameterClient
    from apexrl.algorithms.checkpoint import load_checkpoint

    run = launch("--learner-arg=--checkpoint-every=20")
    pids = run.wait_running()
    port = next(r["port"] for r in run.config()["roles"] if r["name"] == "learner")
    checkpoint = run.run_dir / "checkpoints"
    wait_until(lambda: (checkpoint / "checkpoint.pt").exists(), "the learner wrote a checkpoint", timeout=60)
    with ParameterClient(f"127.0.0.1:{port}", timeout=2, token=run.token()) as params:
        wait_until(
            lambda: params.version() > load_checkpoint(checkpoint, weights="last").weight_version,
            "versions newer than the checkpoint were published",
            timeout=60,
        )
        os.kill(pids["learner"], signal.SIGKILL)
        killed_at = time.monotonic()
        saved = load_checkpoint(checkpoint, weights="last")

        def training_again() -> bool:
            try:
                return params.version() > saved.weight_version + 2
            except Exception:  # noqa: BLE001 (down until the launcher restarts it)
                return False

        wait_until(training_again, "the restarted learner published again", timeout=60)
        report_fault(
            "learner (hosting the parameter service) kill -9",
            killed_at,
            f"updates after its last checkpoint (at update {saved.updates})",
        )
    log = run.log("learner")
    assert f"resumed from {checkpoint / 'checkpoint.pt'} at update {saved.updates}" in log
    # The actors hold versions from before the kill, above what the restarted learner publishes at first: they
    # must still take its weights.
    wait_until(
        lambda: run.log("actor-0").count("weights version") >= 1, "the actor logs its weights", timeout=5
    )
    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    assert result["restarts_by_role"] == {"learner": 1}
    assert result["updates"] > saved.updates
    run.assert_no_role_left()


@pytest.mark.timeout(150)
def test_a_role_that_dies_past_its_restart_budget_ends_the_run(launch):
    run = launch("--max-restarts", "0")
    pids = run.wait_running()
    os.kill(pids["actor-0"], signal.SIGKILL)
    code, result, err = run.wait()
    assert code == 1
    assert result["reason"] == "restart_budget_exhausted" and result["solved"] is False
    assert (
        "apexrl launch: actor-0 died unexpectedly and its restart budget (0 in 300s) is spent: actor-0 was "
        "killed by SIGKILL; last lines of" in err
    )
    assert str(run.run_dir / "logs" / "actor-0.log") in err
    assert_all_gone(pids)
    run.assert_no_role_left()
    for name in ("shard-0", "learner", "evaluator"):
        assert "received SIGTERM; shutting down" in run.log(name), name


@pytest.mark.timeout(150)
def test_a_learner_that_cannot_start_fails_the_launch_and_stops_the_shards(launch, tmp_path):
    from apexrl.algorithms.checkpoint import save_checkpoint
    from apexrl.algorithms.dqn.networks import DuelingQNetwork
    from tests.support.checkpoints import dqn_checkpoint

    save_checkpoint(
        tmp_path / "run" / "checkpoints" / "checkpoint.pt",  # the fleet's learner wants (256, 256)
        dqn_checkpoint(DuelingQNetwork(4, 2, (8,)), (8,), updates=5, weight_version=2),
    )
    run = launch()
    code, result, err = run.wait(timeout=90)
    assert code == 1 and result["solved"] is False
    # The learner reports SERVING before it loads its checkpoint, so the launcher may already have started the
    # actors when it dies (reason role_exited) or not (startup_failed): either way it is named with its log tail.
    assert result["reason"] in ("startup_failed", "role_exited"), result
    assert (
        "apexrl launch: fleet did not start: learner exited with status" in err
        or "apexrl launch: learner died unexpectedly: learner exited with status" in err
    ), err
    assert (
        "has another network: hidden_sizes [8] there, [256, 256] in the configuration" in err
    )  # its log tail
    run.assert_no_role_left()
    assert "received SIGTERM; shutting down" in run.log("shard-0")
    # Actors act (at random) before the learner serves, so the shard may hold their rows by then: it stopped cleanly.
    assert "replay shard stopped: " in run.log("shard-0")

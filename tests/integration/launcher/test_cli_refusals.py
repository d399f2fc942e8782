"""Every role refuses what cannot work before it starts anything, in one line naming the setting, with exit status 2:
a bad address (no port, a space, a port out of range or not a number), a port another process holds, an unknown
environment. Real `apexrl` processes; each must answer within seconds (before these checks, `--params localhost`
failed after 120 s and `--replay localhost:abc` retried forever)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ANSWER_SECONDS = 60  # generous for a loaded machine: the refusals themselves take an import's time


def apexrl(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", *argv],
        capture_output=True,
        text=True,
        timeout=ANSWER_SECONDS,
    )


def refused(done: subprocess.CompletedProcess, role: str | None) -> str:
    """The one line of a refusal (asserted: exit status 2, one line on stderr, nothing on stdout); `role` None: the
    top-level command's."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and done.stdout == "", done.stderr[-2000:]
    assert lines[0].startswith("apexrl: error: " if role is None else f"apexrl {role}: error: "), lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process (this test) listens on, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


ANY = "127.0.0.1:1"  # a well-formed address nothing answers on


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["actor", "--params", "localhost", "--replay", ANY], "--params: params ('localhost') has no port"),
        (
            ["actor", "--params", "127.0.0.1:99999", "--replay", ANY],
            "--params: params ('127.0.0.1:99999') has a port out of range (99999; ports are 1..65535)",
        ),
        (
            ["actor", "--params", ANY, "--replay", "localhost:abc"],
            "--replay: replay ('localhost:abc') has a port that is not a number ('abc')",
        ),
        (
            ["actor", "--params", ANY, "--replay", f"{ANY},dns:///apexrl-replay"],
            "--replay: replay ('dns:///apexrl-replay') is not dns:///NAME:PORT",
        ),
        (
            ["actor", "--params", "::1:7200", "--evaluate"],
            "must put an IPv6 address in brackets: [IPV6]:PORT",
        ),
        (
            ["learner", "--replay", "localhost:abc"],
            "--replay: replay ('localhost:abc') has a port that is not a number",
        ),
        (
            ["learner", "--replay", ANY, "--params", "my host:7100"],
            "--params: params ('my host:7100') holds a space",
        ),
        (["learner", "--replay", ANY, "--port", "70000"], "--port: port (70000) must be a port in 1..65535"),
        (["replay", "--host", "my host"], "--host: host ('my host') holds a space"),
        (["replay", "--metrics-port", "-2"], "--metrics-port: metrics_port (-2) must be a port in 1..65535"),
        (["params", "--port", "65536"], "--port: port (65536) must be a port in 1..65535"),
        (
            ["replay", "--host", "10.255.255.254", "--port", "0", "--metrics-port", "-1"],
            "--host: cannot listen on 10.255.255.254: it is not an address of this machine",
        ),
    ],
)
def test_a_bad_address_is_one_line_naming_the_setting_and_exit_2(argv, message):
    line = refused(apexrl(*argv), argv[0])
    assert message in line, line


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["replay", "--port", "{port}", "--metrics-port", "-1"], "--port"),
        (["replay", "--port", "0", "--metrics-port", "{port}"], "--metrics-port"),
        (["replay", "--port", "0", "--metrics-port", "-1", "--health-port", "{port}"], "--health-port"),
        (["params", "--port", "{port}", "--metrics-port", "-1"], "--port"),
        (["learner", "--replay", ANY, "--port", "{port}", "--metrics-port", "-1"], "--port"),
        (["learner", "--replay", ANY, "--port", "0", "--metrics-port", "{port}"], "--metrics-port"),
        (["actor", "--params", ANY, "--replay", ANY, "--metrics-port", "{port}"], "--metrics-port"),
        (["actor", "--params", ANY, "--evaluate", "--metrics-port", "{port}"], "--metrics-port"),
    ],
)
def test_a_busy_port_is_one_line_naming_the_port_and_the_flag_and_exit_2(busy_port, argv, flag):
    role = argv[0]
    line = refused(apexrl(*(a.format(port=busy_port) for a in argv)), role)
    assert line == (
        f"apexrl {role}: error: {flag}: port {busy_port} on 127.0.0.1 is already in use by another "
        f"process (choose another port, or 0 for a free one)"
    )


def test_a_learner_that_publishes_elsewhere_does_not_check_the_port_it_would_have_served(busy_port):
    """With --params the learner hosts no parameter service, so its --port is not bound (nor checked): it gets as
    far as the environment check."""
    line = refused(
        apexrl(
            "learner",
            "--replay",
            ANY,
            "--params",
            ANY,
            "--port",
            str(busy_port),
            "--metrics-port",
            "-1",
            "--env",
            "NoSuchEnv-v0",
        ),
        "learner",
    )
    assert "--env: cannot make environment 'NoSuchEnv-v0'" in line, line


def test_launch_refuses_a_busy_port_its_fleet_file_fixes_before_starting_anything(tmp_path, busy_port):
    fleet = tmp_path / "fleet.toml"
    with socket.socket() as sock:  # the learner's port: free (the check stops at the first busy one anyway)
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    fleet.write_text(
        f"[[shard]]\nhost = 'm1'\nport = {busy_port}\n\n[learner]\nhost = 'm1'\nport = {free}\n\n"
        f"[[actors]]\nhost = 'm1'\ncount = 1\n"
    )
    run_dir = tmp_path / "run"
    line = refused(apexrl("launch", "--config", str(fleet), "--run-dir", str(run_dir)), "launch")
    assert f"shard-0 port: port {busy_port} on 127.0.0.1 is already in use" in line, line
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("argv", "role", "message"),
    [
        (["launch", "--seed", "zero"], "launch", "--seed: expected an integer, got 'zero'"),
        (
            ["launch", "--env-kwargs", "map_name=8x8"],
            "launch",
            """--env-kwargs: expected a JSON object such as '{"map_name": "8x8"}', got 'map_name=8x8' (not JSON""",
        ),
        (["launch", "--num-shards", "two"], "launch", "--num-shards: expected an integer, got 'two'"),
        (["launch", "--max-secs", "5"], "launch", "unknown flag --max-secs (did you mean --max-seconds?)"),
        (["launch", "--algorithm", "dqm"], "launch", "--algorithm: expected one of "),
        (
            ["actor", "--params", ANY, "--evaluate", "--epsilom", "0.1"],
            "actor",
            "unknown flag --epsilom (did you mean --epsilon?)",
        ),
        (["replay", "--port"], "replay", "--port: expected a value"),
        (["lanch"], None, "unknown command 'lanch' (did you mean launch?)"),
        (["replay", "--log-levl", "INFO"], "replay", "unknown flag --log-levl (did you mean --log-level?)"),
        (["learner"], "learner", "the following arguments are required: --replay"),
    ],
)
def test_argparse_errors_are_one_line_naming_the_flag_and_the_expected_form(argv, role, message):
    """argparse's own errors too: no usage block, no Python type name, the nearest flag or command suggested."""
    line = refused(apexrl(*argv), role)
    assert message in line and "EnvKwargs" not in line and "usage" not in line, line
    if argv[1:2] == ["--algorithm"]:
        assert line.endswith(", got 'dqm' (did you mean dqn?)"), line


@pytest.mark.parametrize(
    "argv",
    [
        ["actor", "--params", ANY, "--replay", ANY, "--metrics-port", "-1"],
        ["actor", "--params", ANY, "--evaluate", "--metrics-port", "-1"],
        ["learner", "--replay", ANY, "--port", "0", "--metrics-port", "-1"],
    ],
)
def test_every_role_refuses_an_unknown_environment_in_one_line(argv):
    line = refused(apexrl(*argv, "--env", "NoSuchEnv-v0"), argv[0])
    assert line.endswith(
        "--env: cannot make environment 'NoSuchEnv-v0': Environment `NoSuchEnv` doesn't exist."
    ), line


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version

    done = apexrl("--version")
    assert done.returncode == 0 and done.stdout == f"apexrl {version('apexrl')}\n", done


def test_log_level_is_taken_after_the_subcommand_too(tmp_path: Path):
    """The evaluator gives up waiting for weights at once and exits 1; its INFO lines show only at INFO."""
    argv = ["actor", "--params", ANY, "--evaluate", "--metrics-port", "-1", "--weights-wait-seconds", "0.2"]
    quiet = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", *argv, "--log-level", "ERROR"],
        capture_output=True,
        text=True,
        timeout=ANSWER_SECONDS,
    )
    assert quiet.returncode == 1 and " ERROR apexrl: actor failed: no weights" in quiet.stderr, quiet.stderr
    assert " INFO " not in quiet.stderr, quiet.stderr
    # Given on both sides, the one after the subcommand wins.
    chatty = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "--log-level", "ERROR", *argv, "--log-level", "INFO"],
        capture_output=True,
        text=True,
        timeout=ANSWER_SECONDS,
    )
    assert chatty.returncode == 1 and " INFO apexrl.actor: evaluator 0 stopped" in chatty.stderr, (
        chatty.stderr
    )


def test_r2d2_refuses_a_box_action_space_and_a_period_longer_than_its_window_in_one_line(tmp_path):
    """Issue 30: `--algorithm r2d2` on continuous actions, and sequences started further apart than they are long
    (steps in no sequence), each end the launch in one line with exit status 2, nothing started."""
    line = refused(
        apexrl("launch", "--algorithm", "r2d2", "--env", "Pendulum-v1", "--run-dir", str(tmp_path / "a")),
        "launch",
    )
    assert "algorithm r2d2 needs a Discrete action space" in line, line
    fleet = tmp_path / "fleet.toml"
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    fleet.write_text(
        f"[fleet]\nalgorithm = 'r2d2'\nenv = 'CartPoleNoVel-v1'\n\n[[shard]]\nhost = 'm1'\nport = {ports[0]}\n\n"
        f"[learner]\nhost = 'm1'\nport = {ports[1]}\n\n[[actors]]\nhost = 'm1'\ncount = 1\nburn_in = 2\n"
        "train_length = 4\nsequence_period = 10\n"
    )
    run_dir = tmp_path / "run"
    line = refused(apexrl("launch", "--config", str(fleet), "--run-dir", str(run_dir)), "launch")
    assert "sequence_period (10) must be in [1, burn_in + train_length (6)]" in line, line
    assert not run_dir.exists()

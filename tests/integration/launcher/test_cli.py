"""The `apexrl` command (launcher/cli.py): every subcommand's real --help documents every setting of its config
dataclass next to its flag, and `apexrl launch` refuses a bad configuration with exit status 2 before starting
anything."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from apexrl.common.settings import settings_of
from apexrl.launcher import cli
from apexrl.launcher.fleet_config import FleetSettings


def help_output(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", *argv, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # argparse wraps lines, also after a hyphen ("item-" / "signature"): compare with normalised whitespace.
    return " ".join(re.sub(r"(?<=\w)-\n\s*", "-", done.stdout).split())


def documented(setting) -> str:
    """How `--help` shows a setting: its flag (and metavar), then its help text."""
    text = " ".join(setting.help.split())
    metavar = setting.metavar or setting.name.upper()
    if setting.positional:
        return f"{metavar} {text}"
    if setting.base_type is bool:
        return f"{setting.flag}, --no-{setting.flag[2:]} {text}"
    return f"{setting.flag} {metavar} {text}"


def config_of(subcommand: str) -> type:
    module = importlib.import_module(cli.SUBCOMMANDS[subcommand])
    return module.CONFIG if hasattr(module, "CONFIG") else FleetSettings


def test_top_level_help_lists_every_subcommand_with_its_summary():
    text = help_output()
    for name, module_name in cli.SUBCOMMANDS.items():
        summary = " ".join(importlib.import_module(module_name).HELP.split())
        assert f"{name} {summary}" in text, name
    assert "Exit status: 0 clean stop, 1 failure, 2 bad configuration." in text


@pytest.mark.parametrize("subcommand", sorted(cli.SUBCOMMANDS))
def test_subcommand_help_documents_every_setting_beside_its_flag(subcommand):
    text = help_output(subcommand)
    settings = settings_of(config_of(subcommand))
    assert settings  # a config without settings would make this test pass on nothing
    for s in settings:
        assert documented(s) in text, f"'apexrl {subcommand} --help' does not show {documented(s)!r}"
        if s.wiring and subcommand != "launch":
            assert f"[set by `apexrl launch` from {' '.join(s.wiring.split())}]" in text, s.flag
    if subcommand == "launch":  # its own flags beside the [fleet] settings
        for flag in (
            "--config FILE",
            "--host-name NAME",
            "--num-shards NUM_SHARDS",
            "--num-actors NUM_ACTORS",
            "--replay-arg ARGS",
            "--learner-arg ARGS",
            "--actor-arg ARGS",
            "--evaluator-arg ARGS",
        ):
            assert flag in text, flag
    if subcommand == "replay":
        assert "http://HOST:PORT/metrics" in text


def test_launch_refuses_a_fleet_file_with_a_port_used_twice(tmp_path, capsys):
    bad = tmp_path / "fleet.toml"
    bad.write_text(
        "[[shard]]\nhost = 'm1'\nport = 7000\n\n[learner]\nhost = 'm1'\nport = 7000\n"
        "\n[[actors]]\nhost = 'm1'\ncount = 1\n"
    )
    assert cli.main(["launch", "--config", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "apexrl launch: error:" in err
    assert "port 7000 on host 'm1' is used by both shard-0 (port) and learner (port)" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-actors", "0"], "--num-actors (0) must be at least 1"),
        (["--max-seconds", "-1"], "--max-seconds (-1.0) must be positive"),
        (["--replay-arg=--capacity 0"], "shard-0: --capacity: capacity (0) must be a positive integer"),
        (["--learner-arg=--lr 0.1"], "learner: apexrl learner (learner): unknown flag --lr"),
        (["--actor-arg=--num-envs=0"], "actor-0: --num-envs: num_envs (0) must be a positive integer"),
        (["--evaluator-arg=--epsilon 2"], "evaluator: --epsilon: epsilon (2.0) must be in [0, 1]"),
        (["--env", "NoSuchEnv-v0"], "--env: cannot make environment 'NoSuchEnv-v0'"),
        # Continuous control: the algorithm must play the action space, which must be Discrete or a bounded Box.
        (
            ["--env", "Pendulum-v1", "--algorithm", "dqn"],
            "--algorithm: algorithm dqn needs a Discrete action space; "
            "Pendulum-v1 has a Box one (algorithms for it: dpg)",
        ),
        (
            ["--algorithm", "dpg"],
            "--algorithm: algorithm dpg needs a Box action space; CartPole-v1 has a Discrete one",
        ),
        (["--env", "tests.support.odd_envs:UnboundedActions-v0"], "a Box action space needs finite bounds"),
        (
            ["--env", "tests.support.odd_envs:MultiDiscreteActions-v0"],
            "the built-in actor needs a Discrete or a Box action space, got MultiDiscrete([3 3])",
        ),
        (["--env", "Blackjack-v1"], "needs a Box observation space of a vector or an image"),
        (
            ["--actor-arg=--noise-scale=0.2"],
            "actor-0: noise_scale: a setting of algorithm dpg, but this run's algorithm is dqn",
        ),
        (
            ["--env", "Pendulum-v1", "--learner-arg=--target-tau=2"],
            "learner: --target-tau: target_tau (2.0) must be in",
        ),
    ],
)
def test_launch_refuses_bad_settings_before_anything_starts(tmp_path, argv, message):
    """Every role's command line is parsed first: a bad setting or pass-through flag is one line on stderr and
    exit status 2, with no process started and no run directory written."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "launch",
            "--num-shards",
            "1",
            "--num-actors",
            "1",
            "--max-seconds",
            "30",
            "--run-dir",
            str(run_dir),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("apexrl launch: error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
    assert not run_dir.exists()


def test_launch_refuses_a_run_directory_that_holds_a_run(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["launch", "--num-actors", "1", "--run-dir", str(tmp_path)]) == 2
    assert "already holds a run (config.json)" in capsys.readouterr().err
    assert (tmp_path / "config.json").read_text() == "{}"

"""The `apexrl` command: every subcommand's help, bad launch configurations, and a fleet whose role crashes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from apexrl.launcher import cli

KEY_OPTIONS = {
    "replay": ["--port", "--metrics-port", "--capacity", "--alpha", "--port-file"],
    "params": ["--port", "--metrics-port"],
    "learner": ["--replay", "--params-port", "--env", "--metrics-port", "--run-dir"],
    "actor": ["--replay", "--params", "--actor-index", "--num-actors", "--evaluate", "--episodes-csv"],
    "launch": ["--config", "--host-name", "--env", "--target-return", "--max-seconds", "--num-shards",
               "--num-actors", "--run-dir", "--seed", "--learner-arg", "--actor-arg", "--replay-arg"],
    "evaluate": ["RUN_DIR_OR_CHECKPOINT", "--episodes", "--seed", "--render-none"],
}


def test_every_subcommand_has_key_options_in_its_help():
    assert set(KEY_OPTIONS) == set(cli.SUBCOMMANDS)


def test_top_level_help_lists_the_subcommands():
    done = subprocess.run([sys.executable, "-m", "apexrl.launcher", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for name in cli.SUBCOMMANDS:
        assert name in done.stdout


@pytest.mark.parametrize("name", sorted(KEY_OPTIONS))
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in KEY_OPTIONS[name]:
        assert option in out, f"'apexrl {name} --help' does not mention {option}"


def test_launch_refuses_a_bad_configuration(tmp_path, capsys):
    bad = tmp_path / "fleet.toml"
    bad.write_text("[[shard]]\nhost = 'm1'\nport = 7000\n\n[learner]\nhost = 'm1'\nparams_port = 7000\n"
                   "\n[[actors]]\nhost = 'm1'\ncount = 1\n")
    assert cli.main(["launch", "--config", str(bad)]) == 2
    assert "port 7000 on host 'm1' is used by both shard-0 (port) and learner (params_port)" in capsys.readouterr().err
    assert cli.main(["launch", "--num-actors", "0", "--run-dir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_launch_reports_a_role_that_dies(tmp_path):
    """A shard that refuses its options: the launcher names it, quotes its log, stops the rest, exits 1."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", "--num-shards", "1", "--num-actors", "1",
         "--max-seconds", "60", "--run-dir", str(run_dir), "--replay-arg=--capacity 0"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "shard-0 exited with status 2" in done.stderr
    assert "capacity" in done.stderr  # the tail of shard-0.log says why
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["solved"] is False and result["run_dir"] == str(run_dir) and result["env_steps"] == 0
    assert (run_dir / "config.json").is_file() and (run_dir / "logs" / "shard-0.log").is_file()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["roles"][0]["command"][-2:] == ["--capacity", "0"]

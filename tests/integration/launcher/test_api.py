"""`apexrl.launch` (launcher/api.py) with a tiny real fleet in child processes: the handle reports progress, stop()
ends the run with reason "stopped", a run ends by itself at max_seconds, and bad settings raise before any process
starts. examples/launch_from_python.py runs as its docstring says, the README's block as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import apexrl
from apexrl.launcher.api import plan_new
from tests.conftest import wait_until
from tests.integration.launcher.test_main import alive, pid_of

REPO = Path(__file__).resolve().parents[3]


def tiny_fleet(run_dir: Path, **settings) -> apexrl.FleetConfig:
    """One shard, one actor, an evaluator playing 5 episodes a round, a target no run reaches."""
    return apexrl.local_fleet(
        num_shards=1,
        num_actors=1,
        **{
            "run_dir": str(run_dir),
            "seed": 0,
            "target_return": 1e6,
            "evaluation_episodes": 5,
            "progress_seconds": 1.0,
            "max_seconds": 120.0,
            **settings,
        },
    )


def role_commands(run_dir: Path) -> list[list[str]]:
    config = json.loads((run_dir / "config.json").read_text())
    return [r["command"] for r in config["roles"] if r["command"]]


@pytest.mark.timeout(180)
def test_a_fleet_launched_from_python_reports_progress_and_stops_with_its_result(tmp_path):
    rows = []
    with apexrl.launch(tiny_fleet(tmp_path / "run"), on_progress=rows.append) as run:
        assert run.run_dir == tmp_path / "run"

        def updating() -> bool:
            row = run.progress()
            return not run.running or (row is not None and (row.updates or 0) > 0)

        wait_until(updating, "the learner made updates", timeout=120)
        assert run.running, run.wait()
        first = run.progress()
        wait_until(lambda: run.progress().env_steps > first.env_steps, "env steps advanced", timeout=60)
        commands = role_commands(run.run_dir)
        pids = [pid_of(c) for c in commands]
        assert len(commands) == 4 and all(pids)
        result = run.stop(timeout=60)
    assert not run.running and run.result == result and run.exit_status == 1  # not solved
    assert result.reason == "stopped" and result.solved is False
    assert result.run_dir == str(tmp_path / "run") and result.updates >= first.updates > 0
    assert result.env_steps >= run.progress().env_steps > 0 and result.wall_seconds > 0
    assert json.loads(result.to_json())["reason"] == "stopped"
    assert rows and rows[-1].env_steps <= result.env_steps  # on_progress saw the rows
    wait_until(lambda: not any(pid_of(c) for c in commands), "every role exited", timeout=10)
    assert not any(alive(pid) for pid in pids)
    assert run.stop() == result  # stopping again returns the same result


def test_bad_settings_raise_before_any_process_starts(tmp_path):
    with pytest.raises(apexrl.ConfigError, match=r"max_seconds \(-1.0\) must be positive"):
        tiny_fleet(tmp_path / "run", max_seconds=-1.0)
    with pytest.raises(apexrl.ConfigError, match="--env"):
        apexrl.launch(tiny_fleet(tmp_path / "run", env="NoSuchEnv-v0"))
    with pytest.raises(apexrl.ConfigError, match="unknown role kind"):
        apexrl.launch(tiny_fleet(tmp_path / "run"), extra_args={"shard": ["--alpha", "0.5"]})
    assert not (tmp_path / "run").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "config.json").write_text("{}")
    with pytest.raises(apexrl.ConfigError, match="already holds a run .*--resume"):
        apexrl.launch(tiny_fleet(tmp_path / "used"))


def test_plain_python_values_reach_the_plan_and_other_values_are_refused(tmp_path):
    """Issue 28's spellings: env_kwargs as a dict (it ended in `unhashable type: 'dict'` inside launch), extra_args
    as a shell line (as --learner-arg takes it), and a fleet that is not a FleetConfig: ConfigError each time, before
    any process starts."""
    fleet = tiny_fleet(tmp_path / "run", env="FrozenLake-v1", env_kwargs={"map_name": "8x8"})
    plan = plan_new(fleet, "local", {})
    assert plan.config.env_kwargs.as_dict() == {"map_name": "8x8"} and plan.config.algorithm == "dqn"
    with pytest.raises(
        apexrl.ConfigError, match=r"learner: --batch-size: batch_size \(0\) must be a positive"
    ):
        apexrl.launch(fleet, extra_args={"learner": "--batch-size 0"})
    with pytest.raises(apexrl.ConfigError, match=r"extra_args\['actor'\] must be a list of strings"):
        apexrl.launch(fleet, extra_args={"actor": 5})
    with pytest.raises(apexrl.ConfigError, match="fleet must be a FleetConfig"):
        apexrl.launch({"env": "CartPole-v1"})
    with pytest.raises(apexrl.ConfigError, match="seed must be an integer, got 'zero'"):
        apexrl.local_fleet(seed="zero")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(240)
def test_the_launch_from_python_example_trains_until_its_time_budget(tmp_path):
    """examples/launch_from_python.py with a budget too short to solve CartPole: progress lines, then the result
    JSON with reason max_seconds (or target, on a very fast machine), and the trained policy plays."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "launch_from_python.py"),
            "--max-seconds",
            "25",
            "--num-actors",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["reason"] in ("max_seconds", "target"), result
    assert result["run_dir"] == str(tmp_path / "run") and result["env_steps"] > 0
    assert lines[0] == f"training in {tmp_path / 'run'}"
    assert any(" env steps " in line and "updates" in line for line in lines[1:-1]), done.stdout
    if result["kept_policy"]:  # the policy played is the one the evaluator kept, and it says so
        kept = result["kept_policy"]
        assert f"one greedy episode of weights v{kept['weight_version']} kept by the evaluator" in done.stdout
    elif result["last_checkpoint"]:
        assert "one greedy episode of the learner's weights" in done.stdout


@pytest.mark.timeout(240)
def test_the_readmes_launch_from_python_block_runs_as_written(tmp_path):
    """README.md "Launch from Python", with its time budget cut to one this test waits for (the only edit), run
    from an empty folder: the default run directory runs/CartPole-v1-TIMESTAMP is made there."""
    section = (REPO / "README.md").read_text().split("## Launch from Python\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "max_seconds=300" in code
    done = subprocess.run(
        [sys.executable, "-c", code.replace("max_seconds=300", "max_seconds=20")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reason, env_steps, _, _, run_dir = done.stdout.strip().splitlines()[-1].split(" ")
    assert reason in ("max_seconds", "target") and int(env_steps) > 0
    assert (tmp_path / run_dir).parent == tmp_path / "runs" and (
        tmp_path / run_dir / "progress.csv"
    ).is_file()
    assert "ProgressRow(" in done.stdout  # on_progress=print

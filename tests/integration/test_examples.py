"""The examples run: the README's custom actor against two real shards and a real parameter service, and the
custom-environment example (examples/custom_env/) as its README says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.parameter_server.service import create_parameter_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_actor.py"


def test_custom_actor_example_fills_two_shards_round_robin_and_pulls_weights(make_shard):
    shards = [make_shard(), make_shard()]
    made = create_parameter_server("127.0.0.1:0")
    server, port, store = made.server, made.port, made.store
    try:
        store.publish({"w": np.zeros(3, np.float32)})
        out = subprocess.run(
            [
                sys.executable,
                str(EXAMPLE),
                "--replay",
                ",".join(s.address for s in shards),
                "--params",
                f"127.0.0.1:{port}",
                "--steps",
                "640",
                "--batch-size",
                "64",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    finally:
        server.stop(0)
    # 10 batches, one to each shard in turn (shards with room never fail over).
    assert "2 shards hold 640 rows (320, 320); weights version 1" in out.stdout
    for shard in shards:
        with ReplayClient(shard.address) as client:
            batch = client.sample(32)
        assert set(batch.columns) == {"obs", "action", "reward", "discount", "next_obs", "weight_version"}
        assert set(np.unique(batch.columns["action"])) <= {0, 1}


CUSTOM_ENV = Path(__file__).resolve().parents[2] / "examples" / "custom_env"


@pytest.mark.slow
def test_custom_env_example_trains_plays_and_exports(tmp_path):
    """examples/custom_env/README.md as written, from its folder: the plugin module found in the working directory,
    its constructor argument passed to every role, its registered reward_threshold reached ("solved"), then the
    policy played through apexrl.load_policy and exported."""
    apexrl = [sys.executable, "-m", "apexrl.launcher"]
    run = tmp_path / "run"
    done = subprocess.run(
        [
            *apexrl,
            "launch",
            "--env-module",
            "corridor",
            "--env",
            "Corridor-v0",
            "--env-kwargs",
            '{"length": 6}',
            "--num-shards",
            "1",
            "--num-actors",
            "2",
            "--max-seconds",
            "150",
            "--run-dir",
            str(run),
        ],
        cwd=CUSTOM_ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and result["solved"] and result["target_return"] == 1.0, (
        done.stdout + done.stderr
    )
    played = subprocess.run(
        [sys.executable, str(CUSTOM_ENV / "play.py"), str(run), "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # The run was solved by the evaluator's 100 greedy episodes (above); the final checkpoint, written a few updates
    # later, is played here: the example must play the environment built with its arguments (its return may dip).
    assert re.search(
        r'mean return [01]\.\d\d over 3 episodes of Corridor-v0 \{"length": 6\}', played.stdout
    ), played.stdout
    evaluated = subprocess.run(
        [*apexrl, "evaluate", str(run), "--episodes", "3", "--env-module", "corridor"],  # named: it may run
        cwd=CUSTOM_ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # The same final checkpoint: its return may dip too; what is checked is that it plays the example's environment.
    summary = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 3 and 0.0 <= summary["mean_return"] <= 1.0, evaluated.stdout
    exported = subprocess.run(
        [*apexrl, "export", str(run), "--format", "torchscript"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(exported.stdout.strip().splitlines()[-1])["checked"] is True


def test_custom_env_example_trains_from_python_with_its_kwargs_as_a_dict(tmp_path):
    """examples/custom_env/train.py, started from another folder for a few seconds: local_fleet takes
    env_module="corridor" and env_kwargs={"length": 6} as Python values, and every role plays that corridor."""
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(CUSTOM_ENV / "train.py"),
            "--length",
            "6",
            "--max-seconds",
            "15",
            "--run-dir",
            str(run),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f'training Corridor-v0 {{"length": 6}} in {run}', done.stdout
    result = json.loads(lines[-1])
    assert result["reason"] in ("max_seconds", "target") and result["run_dir"] == str(run), result
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["fleet_file"]["fleet"]["env_module"] == ["corridor"]
    assert recorded["fleet_file"]["fleet"]["env_kwargs"] == '{"length": 6}'
    commands = [r["command"] for r in recorded["roles"] if r["command"]]
    playing = [c for c in commands if "--env-kwargs" in c]  # every role but the shard plays the corridor
    assert len(commands) == 5 and len(playing) == 4, commands
    for command in playing:
        assert command[command.index("--env-kwargs") + 1] == '{"length": 6}', command
        assert command[command.index("--env-module") + 1] == "corridor", command

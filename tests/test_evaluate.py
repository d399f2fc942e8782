"""`apexrl evaluate` plays a real checkpoint file as a real process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from apexrl.launcher import cli  # noqa: E402
from apexrl.learner.checkpoint import Checkpoint, save_checkpoint  # noqa: E402
from apexrl.learner.networks import DuelingQNetwork  # noqa: E402


def make_run_dir(tmp_path, env_id: str = "CartPole-v1"):
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 2, (16, 16))
    state = {k: v.clone() for k, v in net.state_dict().items()}
    save_checkpoint(tmp_path / "checkpoints" / "checkpoint.pt", Checkpoint(
        env_id=env_id, obs_dim=4, num_actions=2, hidden_sizes=(16, 16), online=state, target=state,
        optimizer=None, updates=12, weight_version=3))
    return tmp_path


def evaluate(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apexrl.launcher", "evaluate", *argv],
                          capture_output=True, text=True, timeout=120)


def test_evaluate_a_run_directory(tmp_path):
    run_dir = make_run_dir(tmp_path)
    done = evaluate(str(run_dir), "--episodes", "3", "--seed", "0", "--render-none")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert sum(line.startswith("episode ") for line in lines) == 3
    result = json.loads(lines[-1])
    assert result["episodes"] == 3
    assert 1 <= result["min_return"] <= result["mean_return"] <= result["max_return"] <= 500
    assert result["std_return"] >= 0


def test_evaluate_reports_a_missing_checkpoint_or_bad_episodes(tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "1"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "0"]) == 2
    assert "--episodes (0) must be at least 1" in capsys.readouterr().err


def test_evaluate_refuses_an_environment_the_network_does_not_fit(tmp_path, capsys):
    run_dir = make_run_dir(tmp_path)
    assert cli.main(["evaluate", str(run_dir), "--episodes", "1", "--env", "Acrobot-v1"]) == 2
    assert "Acrobot-v1 has observations of size 6 and 3 actions" in capsys.readouterr().err

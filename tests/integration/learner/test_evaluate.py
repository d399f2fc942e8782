"""`apexrl evaluate` (learner/evaluate.py) plays the policy of a real checkpoint file, greedily: a checkpoint that
balances the pole scores 500, one that always pushes left scores ~10, and every episode's return is the one the
checkpoint's own network earns from the seeded start."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from apexrl.algorithms.checkpoint import save_checkpoint
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.launcher import cli
from tests.support.checkpoints import dqn_checkpoint

# A linear controller that balances CartPole-v1 from every start: push right when w . obs > 0.
BALANCE = [0.1, 0.5, 1.0, 1.0]


def save(path, net: DuelingQNetwork, hidden: tuple[int, ...], env_id: str = "CartPole-v1"):
    return save_checkpoint(path, dqn_checkpoint(net, hidden, env_id=env_id))


def balancing_network() -> DuelingQNetwork:
    """Q(s, .) = V + A - mean(A) with A = [relu(-w.s), relu(w.s)]: argmax is 1 exactly when w.s > 0."""
    net = DuelingQNetwork(4, 2, (2,))
    w = torch.tensor(BALANCE)
    with torch.no_grad():
        net.torso[0].weight.copy_(torch.stack([w, -w]))
        net.torso[0].bias.zero_()
        net.value.weight.zero_()
        net.value.bias.zero_()
        net.advantage.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        net.advantage.bias.zero_()
    return net


def always_left_network() -> DuelingQNetwork:
    net = DuelingQNetwork(4, 2, (2,))
    with torch.no_grad():
        net.advantage.weight.zero_()
        net.advantage.bias.copy_(torch.tensor([1.0, 0.0]))
    return net


def evaluate_process(*argv: str) -> tuple[list[float], dict]:
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "evaluate", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return parse(done.stdout)


def parse(stdout: str) -> tuple[list[float], dict]:
    lines = stdout.strip().splitlines()
    returns = [float(line.split("return ")[1].split(",")[0]) for line in lines if line.startswith("episode ")]
    return returns, json.loads(lines[-1])


def test_a_balancing_checkpoint_scores_500_and_an_always_left_one_fails_at_once(tmp_path):
    save(tmp_path / "good" / "checkpoints" / "checkpoint.pt", balancing_network(), (2,))
    returns, summary = evaluate_process(str(tmp_path / "good"), "--episodes", "5", "--seed", "0")  # a run dir
    assert returns == [500.0] * 5
    assert summary == {
        "episodes": 5,
        "mean_return": 500.0,
        "std_return": 0.0,
        "min_return": 500.0,
        "max_return": 500.0,
    }
    bad = save(tmp_path / "bad.pt", always_left_network(), (2,))
    returns, summary = evaluate_process(str(bad), "--episodes", "5", "--seed", "0")  # a checkpoint file
    assert len(returns) == 5 and max(returns) <= 12 and summary["max_return"] == max(returns)
    assert summary["mean_return"] == pytest.approx(np.mean(returns))


def test_every_episode_is_the_checkpoints_greedy_play_from_its_seeded_start(tmp_path, capsys):
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 2, (16, 16))
    with torch.no_grad():
        net.torso[0].weight.mul_(8.0)  # a random network whose episode lengths vary with the start
    save(tmp_path / "checkpoints" / "checkpoint.pt", net, (16, 16))
    expected = []
    env = gym.make("CartPole-v1")
    for k in range(6):
        obs, _ = env.reset(seed=40 + k)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + reward, terminated or truncated
        expected.append(total)
    env.close()
    assert len(set(expected)) > 1  # otherwise a policy ignoring the seed could match
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "6", "--seed", "40"]) == 0
    returns, summary = parse(capsys.readouterr().out)
    assert returns == expected
    assert summary["min_return"] == min(expected) and summary["max_return"] == max(expected)


def test_evaluate_reports_a_missing_checkpoint_or_bad_episodes(tmp_path, capsys):
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "1"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "0"]) == 2
    assert "apexrl evaluate: error: --episodes: episodes (0) must be at least 1" in capsys.readouterr().err
    torch.save({"format": "something-else"}, tmp_path / "checkpoint.pt")
    assert cli.main(["evaluate", str(tmp_path)]) == 2
    assert "is not an apexrl checkpoint (format 'something-else'" in capsys.readouterr().err


def test_evaluate_refuses_an_environment_the_network_does_not_fit(tmp_path, capsys):
    save(tmp_path / "checkpoints" / "checkpoint.pt", balancing_network(), (2,))
    assert cli.main(["evaluate", str(tmp_path), "--episodes", "1", "--env", "Acrobot-v1"]) == 2
    assert "Acrobot-v1 has observations of size 6 and 3 actions" in capsys.readouterr().err

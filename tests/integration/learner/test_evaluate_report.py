"""What `apexrl evaluate` prints is worded and rounded alike for every task: one episode is "1 greedy episode", and
the JSON line's floats have at most 3 decimals whether the returns are whole (CartPole) or not (Pendulum)."""

from __future__ import annotations

import json
import re

import pytest

from apexrl.launcher import cli
from tests.integration.learner.test_policy import run_dir


def decimals(number: float) -> int:
    text = repr(number)
    return 0 if "e" in text else len(text.split(".")[1]) if "." in text else 0


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_one_episode_is_one_greedy_episode_and_the_json_floats_are_rounded(tmp_path, capsys, env):
    folder = run_dir(tmp_path, env)
    assert cli.main(["evaluate", str(folder), "--episodes", "1", "--seed", "0"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.search(rf"on {env} for 1 greedy episode$", lines[0]), lines[0]
    summary = json.loads(lines[-1])
    floats = [v for v in summary.values() if isinstance(v, float)]
    assert len(floats) == 4 and all(decimals(v) <= 3 for v in floats), lines[-1]
    assert summary["mean_return"] == summary["min_return"] == summary["max_return"]
    assert cli.main(["evaluate", str(folder), "--episodes", "2", "--seed", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(" for 2 greedy episodes")

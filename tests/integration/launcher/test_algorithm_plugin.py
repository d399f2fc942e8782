"""Adding an algorithm is its folder plus its registration (issue 30, item 1): a linear Q-learner that lives in the
test tree (tests/support/toy_algorithm), registered through APEXRL_ALGORITHMS, trains end to end through
`apexrl launch` (shards, learner, actors, evaluator as real processes) and plays with `apexrl evaluate`, with no
role file naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.launching import launch_argv

REPO = Path(__file__).resolve().parents[3]
ROLE_FOLDERS = ("actor", "learner", "launcher", "replay_server", "parameter_server", "common", "apexrl")
SECONDS = 30


def test_an_algorithm_from_the_test_tree_trains_end_to_end_through_the_launcher(tmp_path):
    environment = {
        **os.environ,
        "APEXRL_ALGORITHMS": "tests.support.toy_algorithm",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    run_dir = tmp_path / "run"
    launch = subprocess.run(
        launch_argv(run_dir, SECONDS, "--algorithm", "linear-q"),
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        env=environment,
        cwd=tmp_path,
    )
    lines = launch.stdout.strip().splitlines()
    assert lines, launch.stderr[-3000:]
    result = json.loads(lines[-1])
    logs = {path.stem: path.read_text(errors="replace") for path in (run_dir / "logs").glob("*.log")}
    explained = f"{json.dumps(result)}\n{launch.stderr[-2000:]}"
    # CartPole's 475 is out of a linear Q-function's reach in this time: the run ends at max_seconds, unsolved (exit 1).
    assert (launch.returncode, result["reason"]) == (1, "max_seconds"), explained
    assert result["updates"] > 20 and result["env_steps"] > 500 and result["episodes"] > 0, explained
    assert result["last_checkpoint"] and result["kept_policy"] is not None, (
        explained
    )  # the evaluator scored it
    learner_log = next(text for name, text in logs.items() if name.startswith("learner"))
    assert "linear Q-learning, lr 0.01" in learner_log, learner_log[-2000:]  # its defaults filled its setting
    evaluated = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "evaluate", str(run_dir), "--episodes", "3", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    found = [
        str(path.relative_to(REPO))
        for folder in ROLE_FOLDERS
        for path in (REPO / folder).rglob("*.py")
        if "linear-q" in path.read_text() or "toy_algorithm" in path.read_text()
    ]
    assert found == [], f"role files that name the test's algorithm: {found}"

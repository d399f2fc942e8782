"""R2D2 through `apexrl launch` (issue 30, item 4): `--algorithm r2d2 --env CartPoleNoVel-v1` starts sequence shards
(each step stored once, windows as items), recurrent actors that keep their state per environment and write each
environment's windows, and a learner that trains on sampled sequences (through its default feed, the sampler
process) and publishes; the kept policy plays with `apexrl evaluate` (videos recorded) and `load_policy`, its state
carried from step to step; the Python API resumes the run, its learner from its checkpoint. Whether it solves is the
benchmark's question (bench/README.md); here every part must run together."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import apexrl
from tests.support.launching import launch_argv

SECONDS = 40


def test_r2d2_trains_through_the_launcher_and_its_kept_policy_plays(tmp_path):
    run_dir = tmp_path / "run"
    launch = subprocess.run(
        launch_argv(
            run_dir, SECONDS, "--algorithm", "r2d2", "--env", "CartPoleNoVel-v1", "--num-actors", "2"
        ),
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        cwd=tmp_path,
    )
    lines = launch.stdout.strip().splitlines()
    assert lines, launch.stderr[-3000:]
    result = json.loads(lines[-1])
    explained = f"{json.dumps(result)}\n{launch.stderr[-3000:]}"
    assert result["reason"] in ("max_seconds", "target"), explained
    assert result["restarts"] == 0 and result["updates"] > 50 and result["env_steps"] > 5000, explained
    assert result["kept_policy"] is not None, explained  # the evaluator played the published weights
    logs = {path.stem: path.read_text(errors="replace") for path in (run_dir / "logs").glob("*.log")}
    learner_log = next(text for name, text in logs.items() if name.startswith("learner"))
    assert "R2D2: mlp torso" in learner_log and "LSTM 64, burn-in 10 (no gradient)" in learner_log, (
        learner_log[-2000:]
    )
    assert "sampler process started" in learner_log  # the default feed carries the sequence batches
    shard_log = next(text for name, text in logs.items() if name.startswith("shard"))
    assert "Traceback" not in shard_log and "Traceback" not in learner_log
    videos = tmp_path / "videos"
    evaluated = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "evaluate",
            str(run_dir),
            "--episodes",
            "3",
            "--seed",
            "1",
            "--record-video",
            str(videos),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert re.search(r"on CartPoleNoVel-v1 for 3 greedy episodes", evaluated.stdout), evaluated.stdout
    summary = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 3 and summary["mean_return"] > 0
    assert len(summary["videos"]) == 3 and all(Path(v).stat().st_size > 0 for v in summary["videos"])
    assert_load_policy_carries_the_state(run_dir)

    resumed = apexrl.resume(run_dir, max_seconds=12).wait()  # the Python API, the learner from its checkpoint
    assert resumed.reason == "max_seconds", resumed
    assert resumed.updates > result["updates"] and resumed.env_steps > result["env_steps"], resumed


def assert_load_policy_carries_the_state(run_dir: Path) -> None:
    """`load_policy` plays the kept recurrent policy as the evaluator does, the state carried by `act` and `observe`
    from `initial_state()` (whether the state changes the actions is tests/integration/learner/
    test_export_recurrent.py's question, on fixed weights)."""
    import numpy as np

    policy = apexrl.load_policy(run_dir)
    env = policy.make_env()
    obs, _ = env.reset(seed=3)
    start = policy.initial_state()
    state, steps = start, 0
    while True:
        action, state = policy.act(obs, state)
        obs, reward, terminated, truncated, _ = env.step(action)
        state = policy.observe(state, reward)
        steps += 1
        if terminated or truncated:
            break
    assert steps > 1 and not np.array_equal(state.h, start.h)  # the LSTM's state moved on with the episode

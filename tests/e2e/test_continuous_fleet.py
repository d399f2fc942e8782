"""A continuous-control fleet end to end: `apexrl launch --env Pendulum-v1` with no algorithm flag runs Ape-X DPG
(shards, the learner, actors with their own noise scales, the evaluator) as real processes; the shards store Box
actions, the learner trains and publishes, the actors pull newer weights, and SIGTERM stops every role cleanly."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ACTOR_STOPPED = re.compile(
    r"actor (\d+) stopped after (\d+) env steps, (\d+) episodes \(weights version (\d+)\)"
)
SHARD_STOPPED = re.compile(r"replay shard stopped: (\d+) rows held, .*signature (\S+)")


def last_progress(run_dir: Path) -> dict[str, str] | None:
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return None
    return rows[-1] if rows else None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_pendulum_fleet_runs_dpg_stores_box_actions_trains_and_actors_pull_newer_weights(tmp_path):
    run_dir = tmp_path / "run"
    out, err = open(tmp_path / "launch.out", "w"), open(tmp_path / "launch.err", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "launch",
            "--env",
            "Pendulum-v1",
            "--seed",
            "0",
            "--num-actors",
            "2",
            "--max-seconds",
            "300",
            "--progress-seconds",
            "2",
            "--target-return",
            "1000000",
            "--run-dir",
            str(run_dir),
        ],
        stdout=out,
        stderr=err,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 300
        while (
            True
        ):  # a condition, not a time: enough updates and versions for actors to have pulled newer ones
            assert process.poll() is None, (tmp_path / "launch.err").read_text()[-3000:]
            row = last_progress(run_dir)
            if row and int(row["updates"]) >= 300 and int(row["weight_version"]) >= 20:
                break
            assert time.monotonic() < deadline, f"no progress: {row}"
            time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 1  # stopped by a signal before the target: a clean stop, not solved
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        err.close()
    result = json.loads((tmp_path / "launch.out").read_text().strip().splitlines()[-1])
    assert (
        result["reason"] == "signal"
        and not result["solved"]
        and result["restarts"] == 0
        and result["updates"] >= 300
    ), result
    logs = {p.stem: p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log")}
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
    assert "learner for Pendulum-v1" in logs["learner"] and "DPG (clipped double-Q" in logs["learner"]
    for index in (0, 1):  # each actor explored with its own noise scale and acted with newer weights
        log = logs[f"actor-{index}"]
        scale = 0.5 if index == 0 else 0.05
        assert f"(dpg): noise scale {scale:.4f}, 1000 uniformly random steps first" in log, log[-2000:]
        stopped = ACTOR_STOPPED.search(log)
        assert stopped and int(stopped[2]) > 0 and int(stopped[4]) > 1, log[-2000:]
    for name in ("shard-0", "shard-1"):
        stopped = SHARD_STOPPED.search(logs[name])
        assert stopped and int(stopped[1]) > 0, logs[name][-2000:]
        assert "action:float32[1]" in stopped[2] and "obs:float32[3]" in stopped[2], stopped[2]
    # The evaluator's greedy episodes and the learner's checkpoint, which `apexrl evaluate` plays.
    assert (run_dir / "checkpoints" / "checkpoint.pt").is_file()
    played = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "evaluate", str(run_dir), "--episodes", "2", "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stderr
    summary = json.loads(played.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and -2000 < summary["mean_return"] <= 0

"""Short pixel fleets end to end: `apexrl launch` starts shards, learner (a convolutional network), actors and
evaluator as real processes; actors compress their image observations, shards store the frames, the learner's
sampler process decompresses them and trains. MinAtar/Breakout-v1 runs with no other flag; ALE/Pong-v5 with a
smaller fleet and batch so that it trains within its budget on 2 CPU cores."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BUDGET_SECONDS = 40
PONG_BUDGET_SECONDS = 34  # ~39 s of wall time with start-up and stop on a 2-core machine
RAW_PONG_ROW_BYTES = 2 * 4 * 84 * 84 + 8 + 4 + 4 + 8  # obs, next_obs, action, reward, discount, weight_version
SHARD_STOPPED = re.compile(r"replay shard stopped: (\d+) rows held, (\d+) inserted.*\((\d+) per row\), "
                           r"signature (\S+)")
ACTOR_STOPPED = re.compile(r"actor (\d+) stopped after (\d+) env steps, (\d+) episodes \(weights version (\d+)\)")


def launch(run_dir: Path, env_id: str, budget: int, *flags: str) -> tuple[dict, dict[str, str], str]:
    """Run `apexrl launch` for `budget` seconds: its final JSON, every role's log by name, and their tails (for
    failure messages). Fails unless it stopped cleanly at the budget with updates, env steps and no restart."""
    launched = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", "--env", env_id, "--seed", "0", "--max-seconds",
         str(budget), "--run-dir", str(run_dir), "--progress-seconds", "10", *flags],
        capture_output=True, text=True, timeout=budget + 90,
    )
    logs = {path.stem: path.read_text(errors="replace") for path in (run_dir / "logs").glob("*.log")}
    tails = "\n".join(f"--- {name}\n" + "\n".join(text.splitlines()[-10:]) for name, text in sorted(logs.items()))
    lines = launched.stdout.strip().splitlines()
    assert lines, f"{launched.stderr[-2500:]}\n{tails}"
    result = json.loads(lines[-1])
    assert launched.returncode == 0 and result["reason"] == "max_seconds", f"{json.dumps(result)}\n{tails}"
    assert result["updates"] > 0 and result["restarts"] == 0, json.dumps(result)
    return result, logs, tails


def shard_stops(logs: dict[str, str], tails: str) -> list[tuple[int, int, str]]:
    """(rows held, bytes per row, signature) of every shard, from the line it logs when it stops."""
    found = []
    for name, text in logs.items():
        if name.startswith("shard"):
            stopped = SHARD_STOPPED.search(text)
            assert stopped, text[-2000:]
            found.append((int(stopped[1]), int(stopped[3]), stopped[4]))
    assert found, tails
    return found


def assert_no_failure(logs: dict[str, str]) -> None:
    """Nobody failed or met a bad frame on the way."""
    for name, text in logs.items():
        assert "Traceback" not in text and "rejected row" not in text, f"{name}:\n{text[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_SECONDS + 100)
def test_a_minatar_fleet_inserts_compressed_rows_and_trains_on_them(tmp_path):
    importlib.import_module("minatar")  # the [atari] extra (scripts/setup.sh installs it): missing is a failure
    result, logs, tails = launch(tmp_path / "run", "MinAtar/Breakout-v1", BUDGET_SECONDS)
    assert result["env_steps"] > 1000, json.dumps(result)

    # The shards stored the actors' frames as sent: a compressed signature, a few dozen bytes per row.
    for rows, per_row, signature in shard_stops(logs, tails):
        assert rows > 0 and signature.startswith("obs:bool[10,10,4]@zstd,") and "next_obs:bool[10,10,4]@zstd" \
            in signature
        assert per_row < 200  # raw: 2 x 400 bytes of planes + 28 of scalars
    assert_no_failure(logs)


@pytest.mark.slow
@pytest.mark.timeout(PONG_BUDGET_SECONDS + 100)
def test_a_pong_fleet_stores_compressed_frames_trains_and_actors_pull_newer_weights(tmp_path):
    importlib.import_module("ale_py")  # the [atari] extra (scripts/setup.sh installs it): missing is a failure
    # 2 actors and a 1-episode evaluator leave the learner CPU; batch 32 (~16 updates/s on one CPU thread, against
    # ~2 at 256), 256 rows before training, a version every 2 updates and pulls every 25 steps fit the budget.
    result, logs, tails = launch(
        tmp_path / "run", "ALE/Pong-v5", PONG_BUDGET_SECONDS, "--num-actors", "2", "--evaluation-episodes", "1",
        "--min-replay-size", "256", "--learner-arg=--batch-size 32 --publish-every 2",
        "--actor-arg=--pull-every 25",
    )
    assert result["env_steps"] > 256, json.dumps(result)

    # Rows went in compressed and stayed so: zstd frames in the signature, ~600 B per row (raw: 56,472).
    for rows, per_row, signature in shard_stops(logs, tails):
        assert rows > 0 and signature.startswith("obs:uint8[4,84,84]@zstd,") and "next_obs:uint8[4,84,84]@zstd" \
            in signature
        assert per_row < 2_000 < RAW_PONG_ROW_BYTES  # the target
    # Every exploring actor acted with weights newer than the first version the learner published.
    actors = [ACTOR_STOPPED.search(text) for name, text in logs.items() if name.startswith("actor")]
    assert len(actors) == 2 and all(actors), tails
    assert all(int(stopped[4]) > 1 for stopped in actors), tails
    assert_no_failure(logs)

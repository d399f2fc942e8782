"""A short pixel fleet end to end: `apexrl launch --env MinAtar/Breakout-v1` with no other flag starts shards,
learner (MinAtar's convolutional network), actors and evaluator as real processes; actors compress their image
observations, shards store the frames, the learner's sampler process decompresses them and trains."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

BUDGET_SECONDS = 40


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_SECONDS + 100)
def test_a_minatar_fleet_inserts_compressed_rows_and_trains_on_them(tmp_path):
    pytest.importorskip("minatar")
    run_dir = tmp_path / "run"
    launch = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", "--env", "MinAtar/Breakout-v1", "--seed", "0",
         "--max-seconds", str(BUDGET_SECONDS), "--run-dir", str(run_dir), "--progress-seconds", "10"],
        capture_output=True, text=True, timeout=BUDGET_SECONDS + 90,
    )
    logs = {path.stem: path.read_text(errors="replace") for path in (run_dir / "logs").glob("*.log")}
    tails = "\n".join(f"--- {name}\n" + "\n".join(text.splitlines()[-10:]) for name, text in sorted(logs.items()))
    lines = launch.stdout.strip().splitlines()
    assert lines, f"{launch.stderr[-2500:]}\n{tails}"
    result = json.loads(lines[-1])
    assert launch.returncode == 0 and result["reason"] == "max_seconds", f"{json.dumps(result)}\n{tails}"
    assert result["updates"] > 0 and result["env_steps"] > 1000 and result["restarts"] == 0, json.dumps(result)

    # The shards stored the actors' frames as sent: a compressed signature, a few dozen bytes per row.
    shard_logs = [text for name, text in logs.items() if name.startswith("shard")]
    assert shard_logs, tails
    for text in shard_logs:
        stopped = re.search(r"replay shard stopped: (\d+) rows held, (\d+) inserted.*\((\d+) per row\), "
                            r"signature (\S+)", text)
        assert stopped, text[-2000:]
        rows, per_row, signature = int(stopped[1]), int(stopped[3]), stopped[4]
        assert rows > 0 and signature.startswith("obs:bool[10,10,4]@zstd,") and "next_obs:bool[10,10,4]@zstd" \
            in signature
        assert per_row < 200  # raw: 2 x 400 bytes of planes + 28 of scalars
    # Nobody failed or met a bad frame on the way.
    for name, text in logs.items():
        assert "Traceback" not in text and "rejected row" not in text, f"{name}:\n{text[-3000:]}"

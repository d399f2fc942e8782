"""Short pixel fleets end to end: `apexrl launch` starts shards, learner (a convolutional network), actors and
evaluator as real processes; actors compress their image observations, shards store the frames, the learner's
sampler process decompresses them and trains. MinAtar/Breakout-v1 runs with no other flag; ALE/Pong-v5 with a
smaller fleet and batch so that it trains soon on 2 CPU cores.

Each fleet runs until it has made the progress the test asks for (read from its progress.csv and its actors'
/metrics every second), then gets SIGTERM; only a generous deadline bounds the wait (about 40 s is usual on 2
cores), so a loaded machine makes the test slower, never red, while a fleet that does not train still fails."""

from __future__ import annotations

import csv
import importlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

DEADLINE_SECONDS = 300  # to meet the conditions; a fleet on an idle 2-core machine needs about 40
STOP_SECONDS = 90  # from SIGTERM to the launcher's exit
RAW_PONG_ROW_BYTES = (
    2 * 4 * 84 * 84 + 8 + 4 + 4 + 8
)  # obs, next_obs, action, reward, discount, weight_version
SHARD_STOPPED = re.compile(
    r"replay shard stopped: (\d+) rows held, (\d+) inserted.*\((\d+) per row\), "
    r"signature (\S+)"
)
ACTOR_STOPPED = re.compile(
    r"actor (\d+) stopped after (\d+) env steps, (\d+) episodes \(weights version (\d+)\)"
)


def last_progress(run_dir: Path) -> dict[str, float]:
    """The newest row of the launcher's progress.csv (empty before the first)."""
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return {}
    return {k: float(v) for k, v in rows[-1].items() if v} if rows else {}


def actor_weight_versions(run_dir: Path) -> list[float]:
    """apexrl_actor_weight_version of every exploring actor, scraped from the addresses the launcher wrote."""
    try:
        groups = json.loads((run_dir / "prometheus" / "targets.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    versions = []
    for group in groups:
        if group["labels"]["job"] != "apexrl-actor":
            continue
        try:
            text = urllib.request.urlopen(f"http://{group['targets'][0]}/metrics", timeout=5).read().decode()
        except OSError:
            return []  # not serving yet
        versions += [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "apexrl_actor_weight_version"
        ]
    return versions


def launch_until(
    run_dir: Path, env_id: str, ready: Callable[[dict[str, float]], bool], what: str, *flags: str
) -> tuple[dict, dict[str, str], str]:
    """Run `apexrl launch` until `ready(its latest progress row, with the actors' weight versions under
    "actor_versions")` holds, then SIGTERM it: its final JSON, every role's log by name, and their tails (for
    failure messages). Fails when `what` is not reached by the deadline, or unless the fleet then stopped cleanly
    on the signal with updates, env steps and no restart."""
    out, err = run_dir.parent / "launch.out", run_dir.parent / "launch.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "launch",
                "--env",
                env_id,
                "--seed",
                "0",
                "--max-seconds",
                str(DEADLINE_SECONDS + 60),
                "--run-dir",
                str(run_dir),
                "--progress-seconds",
                "1",
                *flags,
            ],
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        row: dict = {}
        while True:
            assert process.poll() is None, (
                f"the launcher exited ({process.returncode}):\n{err.read_text()[-2500:]}"
            )
            row = {**last_progress(run_dir), "actor_versions": actor_weight_versions(run_dir)}
            if ready(row):
                break
            assert time.monotonic() < deadline, (
                f"{what} not reached within {DEADLINE_SECONDS}s: {row}\n{err.read_text()[-2500:]}"
            )
            time.sleep(1)
        process.send_signal(signal.SIGTERM)
        process.wait(STOP_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    logs = {path.stem: path.read_text(errors="replace") for path in (run_dir / "logs").glob("*.log")}
    tails = "\n".join(
        f"--- {name}\n" + "\n".join(text.splitlines()[-10:]) for name, text in sorted(logs.items())
    )
    lines = out.read_text().strip().splitlines()
    assert lines, f"{err.read_text()[-2500:]}\n{tails}"
    result = json.loads(lines[-1])
    assert process.returncode == 0 and result["reason"] == "signal", f"{json.dumps(result)}\n{tails}"
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
@pytest.mark.timeout(DEADLINE_SECONDS + STOP_SECONDS + 60)
def test_a_minatar_fleet_inserts_compressed_rows_and_trains_on_them(tmp_path):
    importlib.import_module(
        "minatar"
    )  # the [atari] extra (scripts/setup.sh installs it): missing is a failure
    result, logs, tails = launch_until(
        tmp_path / "run",
        "MinAtar/Breakout-v1",
        lambda row: row.get("updates", 0) > 0 and row.get("env_steps", 0) > 1000,
        "updates and 1000 env steps",
    )
    assert result["env_steps"] > 1000, json.dumps(result)

    # The shards stored the actors' frames as sent: a compressed signature, a few dozen bytes per row.
    for rows, per_row, signature in shard_stops(logs, tails):
        assert (
            rows > 0
            and signature.startswith("obs:bool[10,10,4]@zstd,")
            and "next_obs:bool[10,10,4]@zstd" in signature
        )
        assert per_row < 200  # raw: 2 x 400 bytes of planes + 28 of scalars
    assert_no_failure(logs)


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_SECONDS + STOP_SECONDS + 60)
def test_a_pong_fleet_stores_compressed_frames_trains_and_actors_pull_newer_weights(tmp_path):
    importlib.import_module(
        "ale_py"
    )  # the [atari] extra (scripts/setup.sh installs it): missing is a failure
    # 2 actors and a 1-episode evaluator leave the learner CPU; batch 32 (~16 updates/s on one CPU thread, against
    # ~2 at 256), 256 rows before training, a version every 2 updates and pulls every 25 steps.
    result, logs, tails = launch_until(
        tmp_path / "run",
        "ALE/Pong-v5",
        lambda row: (
            row.get("updates", 0) > 0
            and row.get("env_steps", 0) > 256
            and len(row["actor_versions"]) == 2
            and min(row["actor_versions"]) > 1
        ),
        "updates, 256 env steps and both actors acting with weights newer than the first version",
        "--num-actors",
        "2",
        "--evaluation-episodes",
        "1",
        "--min-replay-size",
        "256",
        "--learner-arg=--batch-size 32 --publish-every 2",
        "--actor-arg=--pull-every 25",
    )
    assert result["env_steps"] > 256, json.dumps(result)

    # Rows went in compressed and stayed so: zstd frames in the signature, ~600 B per row (raw: 56,472).
    for rows, per_row, signature in shard_stops(logs, tails):
        assert (
            rows > 0
            and signature.startswith("obs:uint8[4,84,84]@zstd,")
            and "next_obs:uint8[4,84,84]@zstd" in signature
        )
        assert per_row < 2_000 < RAW_PONG_ROW_BYTES  # the target
    # Every exploring actor acted with weights newer than the first version the learner published.
    actors = [ACTOR_STOPPED.search(text) for name, text in logs.items() if name.startswith("actor")]
    assert len(actors) == 2 and all(actors), tails
    assert all(int(stopped[4]) > 1 for stopped in actors), tails
    assert_no_failure(logs)

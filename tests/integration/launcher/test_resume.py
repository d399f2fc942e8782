"""`apexrl launch --resume RUN_DIR` with real processes: a tiny CartPole fleet is interrupted (SIGINT) once its
learner has checkpointed, then resumed in the same run directory: the learner's update count goes on from its
checkpoint, progress.csv grows and its counters go on from its last row, the final JSON sums the whole run. A run
directory in use, one without a run, and flags that would change the fleet are refused in one line (exit 2)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.integration.launcher.test_main import alive, pid_of

FIRST = [
    "--num-shards",
    "1",
    "--num-actors",
    "1",
    "--seed",
    "0",
    "--max-seconds",
    "120",
    "--progress-seconds",
    "1",
    "--evaluation-episodes",
    "5",
    "--target-return",
    "1000000",  # never reached: the test stops the fleet
    "--learner-arg=--checkpoint-every=10",
]


class Launcher:
    """`apexrl launch ARGV` in a child process, its stdout and stderr in files."""

    def __init__(self, tmp_path: Path, name: str, *argv: str) -> None:
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "apexrl.launcher", "launch", *argv],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def result(self, timeout: float = 90) -> tuple[int, dict]:
        code = self.process.wait(timeout)
        lines = self.out.read_text().strip().splitlines()
        assert lines, self.err.read_text()[-3000:]
        return code, json.loads(lines[-1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)


def launch_refused(*argv: str) -> str:
    """The one line `apexrl launch ARGV` refuses with (exit status 2)."""
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == "", done.stderr
    return done.stderr


def progress_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def learner_updates(run_dir: Path) -> int:
    rows = progress_rows(run_dir)
    return int(rows[-1]["updates"] or 0) if rows else 0


def role_commands(run_dir: Path) -> list[list[str]]:
    return [r["command"] for r in json.loads((run_dir / "config.json").read_text())["roles"] if r["command"]]


@pytest.mark.timeout(300)
def test_an_interrupted_run_resumes_in_its_directory_and_its_counters_go_on(tmp_path):
    from apexrl.algorithms.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    launchers: list[Launcher] = []
    try:
        first = Launcher(tmp_path, "first", *FIRST, "--run-dir", str(run_dir))
        launchers.append(first)
        checkpoint = run_dir / "checkpoints" / "checkpoint.pt"
        wait_until(
            lambda: (
                first.process.poll() is not None
                or (
                    checkpoint.exists()
                    and (run_dir / "progress.csv").exists()
                    and learner_updates(run_dir) > 10
                )
            ),
            "the learner checkpointed and made updates",
            timeout=150,
        )
        assert first.process.poll() is None, first.err.read_text()[-3000:]
        first.process.send_signal(signal.SIGINT)
        code, before = first.result()
        assert code == 1 and before["reason"] == "signal" and before["updates"] > 0, before
        # The learner's checkpoint, written at exit: the updates made after the last progress tick too.
        saved = load_checkpoint(run_dir, weights="last")
        assert saved.updates >= before["updates"]
        rows_before = progress_rows(run_dir)

        # A run that holds a run is not started again; the message points to --resume.
        assert "continue it with `apexrl launch --resume" in launch_refused(*FIRST, "--run-dir", str(run_dir))
        # A resume cannot change the fleet, and needs a run.
        refused = launch_refused("--resume", str(run_dir), "--num-shards", "2")
        assert "--resume continues the fleet" in refused and "--num-shards" in refused
        assert "--env would change it" in launch_refused("--resume", str(run_dir), "--env", "Acrobot-v1")
        (tmp_path / "empty").mkdir()
        assert "holds no run (config.json is missing)" in launch_refused("--resume", str(tmp_path / "empty"))

        resumed = Launcher(tmp_path, "resumed", "--resume", str(run_dir), "--max-seconds", "120")
        launchers.append(resumed)
        wait_until(
            lambda: resumed.process.poll() is not None or learner_updates(run_dir) > saved.updates + 5,
            "the resumed learner trained on from its checkpoint",
            timeout=150,
        )
        assert resumed.process.poll() is None, resumed.err.read_text()[-3000:]
        learner_log = (run_dir / "logs" / "learner.log").read_text()
        assert (
            f"resumed from {run_dir / 'checkpoints' / 'checkpoint.pt'} at update {saved.updates}"
            in learner_log
        )
        # While it runs, the run directory is in use.
        assert "is in use by a running launch" in launch_refused("--resume", str(run_dir))
        commands = role_commands(run_dir)
        pids = [pid_of(c) for c in commands]
        resumed.process.send_signal(signal.SIGTERM)
        code, after = resumed.result()
    finally:
        for launcher in launchers:
            launcher.stop()

    assert code == 1 and after["reason"] == "signal" and after["run_dir"] == str(run_dir), after
    assert after["updates"] > before["updates"]  # the learner's counter went on, not back to 0
    assert after["env_steps"] > before["env_steps"] and after["episodes"] >= before["episodes"]
    assert after["wall_seconds"] > before["wall_seconds"]
    wait_until(lambda: not any(pid and alive(pid) for pid in pids), "every role exited", timeout=10)

    rows = progress_rows(run_dir)
    assert rows[: len(rows_before)] == rows_before and len(rows) > len(rows_before)  # appended, one header
    for column in ("env_steps", "episodes", "wall_seconds", "unix_time"):
        values = [float(r[column]) for r in rows]
        assert values == sorted(values), column  # the curve goes on from where it stopped
    assert float(rows[len(rows_before)]["env_steps"]) >= float(rows_before[-1]["env_steps"])
    config = json.loads((run_dir / "config.json").read_text())
    assert len(config["resumed_at"]) == 1 and config["launch_options"]["num_shards"] == 1
    assert sorted(p.name for p in (run_dir / "episodes").glob("*.csv")) == ["actor-0.csv", "evaluator.csv"]

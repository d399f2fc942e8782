"""A role killed during start-up is restarted within the restart budget, like one killed later (issue 32, item 2):
the learner is SIGKILLed as soon as it exists, before it serves, and the fleet still starts and trains. A role
that refuses its configuration (exit 2) still ends the launch at once: test_main.py's learner with a checkpoint of
another network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.launching import launch_argv

SECONDS = 45


def learner_pid(run_dir: Path) -> int | None:
    """The learner role of this run, found by its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"learner" in argv and str(run_dir).encode() in argv and b"apexrl.launcher" in argv:
            return int(entry.name)
    return None


def test_a_learner_killed_during_start_up_is_restarted_and_the_fleet_trains(tmp_path):
    run_dir = tmp_path / "run"
    launch = subprocess.Popen(
        launch_argv(run_dir, SECONDS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while (pid := learner_pid(run_dir)) is None:
            assert time.monotonic() < deadline and launch.poll() is None, "no learner started"
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)  # it takes seconds to serve: this is during its start-up
        out, err = launch.communicate(timeout=SECONDS + 150)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    result = json.loads(out.strip().splitlines()[-1])
    assert "learner was killed by SIGKILL during start-up; restarting it now" in err, err[-3000:]
    assert result["reason"] in ("max_seconds", "target") and result["updates"] > 0, (result, err[-3000:])
    assert result["restarts_by_role"] == {"learner": 1}, result

"""The launcher caps and rotates its roles' logs (issue 31, item 4): with --role-log-max-mb set small, a real
fleet's logs are rotated beside themselves while every role runs on and writes to its live log."""

from __future__ import annotations

import json
import subprocess

from tests.support.launching import launch_argv

CAP_MB = 0.0002  # 200 bytes: every role log holds more (its command line) by the launcher's first check


def test_role_logs_are_rotated_past_their_cap_while_the_fleet_runs(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        launch_argv(run_dir, 20, "--role-log-max-mb", str(CAP_MB)),
        capture_output=True,
        text=True,
        timeout=200,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["reason"] in ("max_seconds", "target") and result["updates"] > 0, done.stderr[-3000:]
    logs = run_dir / "logs"
    rotated = sorted(path.name for path in logs.glob("*.log.1"))
    assert rotated, sorted(path.name for path in logs.iterdir())
    assert "rotated " in done.stderr and "(over 0.0002 MB)" in done.stderr, done.stderr[-3000:]
    assert not list(logs.glob("*.log.3"))  # two copies at most

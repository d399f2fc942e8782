"""The `apexrl launch` command line the launcher's fleet tests run (seeded, bounded in time, in a run directory of
the test's own)."""

from __future__ import annotations

import sys
from pathlib import Path


def launch_argv(run_dir: Path, max_seconds: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--seed",
        "0",
        "--max-seconds",
        str(max_seconds),
        "--run-dir",
        str(run_dir),
        *extra,
    ]

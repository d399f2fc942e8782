"""Every role process runs numpy with one BLAS thread unless its environment asks for more (launcher/cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("threadpoolctl")

# Runs the real `apexrl` entry point (a role's --help builds every role's parser, importing numpy), then reports
# the size of the BLAS pool that numpy loaded in this process.
PROBE = """
import threadpoolctl
from apexrl.launcher.cli import main
try:
    main(["replay", "--help"])
except SystemExit:
    pass
import numpy
print(max(pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"))
"""


def _blas_threads(env_overrides: dict[str, str]) -> int:
    env = {name: value for name, value in os.environ.items() if not name.endswith("_NUM_THREADS")}
    env.update(env_overrides)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return int(result.stdout.strip().splitlines()[-1])


def test_a_role_process_uses_one_blas_thread_by_default() -> None:
    assert _blas_threads({}) == 1


def test_the_environment_still_decides_when_it_sets_the_pool_size() -> None:
    # Only meaningful where numpy's BLAS would use more than one thread: this machine has at least 2 cores.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: every pool has one thread")
    assert _blas_threads({"OPENBLAS_NUM_THREADS": "2"}) == 2

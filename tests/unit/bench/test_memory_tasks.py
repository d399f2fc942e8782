"""bench/memory_tasks.py's launches: POPGym's tasks through --env-module popgym, every run on its whole budget."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))  # bench scripts import their siblings (harness) by plain name

import memory_tasks  # noqa: E402


def test_popgym_tasks_are_imported_by_module_and_no_run_stops_before_its_budget(tmp_path):
    popgym = memory_tasks.launch_command("popgym-RepeatPreviousEasy-v0", "r2d2", 1, 120.0, tmp_path)
    assert popgym[popgym.index("--env-module") + 1] == "popgym"
    assert popgym[popgym.index("--algorithm") + 1] == "r2d2"
    own = memory_tasks.launch_command("CartPoleNoVel-v1", "dqn", 0, 60.0, tmp_path)
    assert "--env-module" not in own
    assert float(own[own.index("--target-return") + 1]) == memory_tasks.OUT_OF_REACH

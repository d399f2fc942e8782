"""The pure parts of bench/solve_race.py: SB3's time budget, which ends a run that its step budget would let
train for hours (LunarLanderContinuous: 200k steps took SB3 ~70 min), and medians that leave failed runs out (a
run that crashed at start-up is not a fast solve). No SB3, no launch."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))  # bench scripts import their siblings (harness) by plain name
import solve_race  # noqa: E402


def test_sb3_trains_five_times_apexrls_budget_unless_told():
    assert solve_race.sb3_train_seconds(Namespace(max_seconds=900.0, sb3_max_seconds=None)) == 4500.0
    assert solve_race.sb3_train_seconds(Namespace(max_seconds=900.0, sb3_max_seconds=60.0)) == 60.0


def test_a_failed_run_is_counted_apart_and_left_out_of_the_medians():
    runs = [
        {"system": "base", "seed": 0, "failed": None, "solved": True, "seconds": 250.0, "env_steps": 200_000},
        {"system": "base", "seed": 1, "failed": None, "solved": True, "seconds": 204.0, "env_steps": 133_000},
        {
            "system": "base",
            "seed": 2,
            "failed": "startup_failed",
            "solved": False,
            "seconds": 18.5,
            "env_steps": 0,
        },
        {
            "system": "apexrl",
            "seed": 0,
            "failed": "role_exited",
            "solved": False,
            "seconds": 9.0,
            "env_steps": 0,
        },
    ]
    base = solve_race.summary(runs, "base")
    assert base == {
        "runs": 2,
        "failed": 1,
        "solved": 2,
        "median_seconds": 227.0,
        "median_env_steps": 166_500,
    }
    assert solve_race.summary(runs, "apexrl")["median_seconds"] is None

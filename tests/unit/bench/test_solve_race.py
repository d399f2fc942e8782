"""The pure parts of bench/solve_race.py: SB3's time budget, which ends a run that its step budget would let
train for hours (LunarLanderContinuous: 200k steps took SB3 ~70 min). No SB3, no launch."""

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

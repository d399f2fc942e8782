"""The pure parts of bench/budget_race.py: the return at fractions of the budget, medians over seeds with
missing values, the final-return ratio and the reading of a launcher's progress.csv. No SB3, no launch."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from apexrl.launcher.progress import ProgressRow

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))  # bench scripts import their siblings (harness, solve_race) by plain name
import budget_race  # noqa: E402

CURVE = [(10.0, 1_000, -900.0), (30.0, 3_000, -500.0), (44.0, 5_000, -200.0)]


def test_return_at_is_the_last_evaluation_finished_by_then():
    assert budget_race.return_at(CURVE, 9.9) is None
    assert budget_race.return_at(CURVE, 10.0) == -900.0
    assert budget_race.return_at(CURVE, 43.9) == -500.0
    assert budget_race.return_at(CURVE[::-1], 60.0) == -200.0  # order of the points does not matter


def test_fraction_returns_take_the_final_return_for_the_whole_budget():
    at = budget_race.fraction_returns(CURVE, budget=60.0, final=-150.0)
    assert at == {"25%": -900.0, "50%": -500.0, "75%": -200.0, "100%": -150.0}
    assert budget_race.fraction_returns([], budget=60.0, final=None) == dict.fromkeys(at)


def test_median_and_ratio_skip_missing_values():
    assert budget_race.median_or_none([None, 3.0, 1.0, 2.0]) == 2.0
    assert budget_race.median_or_none([None, None]) is None
    assert budget_race.final_ratio(3000.0, 2000.0) == 1.5
    assert budget_race.final_ratio(3000.0, 0.0) is None
    assert budget_race.final_ratio(None, 2000.0) is None


def test_progress_curve_keeps_ticks_with_an_evaluation_mean(tmp_path):
    def row(wall: float, steps: int, mean: float | None) -> ProgressRow:
        return ProgressRow(wall, steps, 0, None, None, mean, None, None, 1e9 + wall)

    path = tmp_path / "progress.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ProgressRow.columns())
        writer.writeheader()
        for tick in (row(5.0, 100, None), row(10.0, 900, -1200.5), row(15.0, 2_000, -800.0)):
            writer.writerow({k: "" if v is None else v for k, v in vars(tick).items()})
        f.write("20.0,30")  # a line cut short by a stopped launcher
    assert budget_race.read_progress_curve(path) == [(10.0, 900, -1200.5), (15.0, 2_000, -800.0)]

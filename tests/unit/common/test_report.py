"""What the commands print (common/report.py): every float of a final JSON line rounded one way, whatever the task's
returns look like, and counts in words that agree with their number."""

from __future__ import annotations

import json
import math

import numpy as np

from apexrl.common.report import json_line, plural, rounded


def test_floats_get_3_decimals_and_3_significant_digits_below_1():
    assert rounded(500.0) == 500.0 and rounded(-151.28374) == -151.284 and rounded(12.3456789) == 12.346
    assert rounded(0.123456) == 0.123 and rounded(2.384185791015625e-07) == 2.38e-07  # not printed as 0
    assert rounded(0.0) == 0.0 and math.isnan(rounded(float("nan"))) and rounded(float("inf")) == float("inf")


def test_a_json_line_rounds_every_float_however_deep_and_leaves_the_rest():
    doc = {
        "mean_return": -151.28374012,
        "episodes": 3,
        "solved": False,
        "target_return": None,
        "kept_policy": {"mean_return": 487.333333, "path": "runs/x/best.pt"},
        "returns": [1.23456, np.float64(-0.000123456)],
    }
    line = json_line(doc)
    assert "\n" not in line
    assert json.loads(line) == {
        "mean_return": -151.284,
        "episodes": 3,
        "solved": False,
        "target_return": None,
        "kept_policy": {"mean_return": 487.333, "path": "runs/x/best.pt"},
        "returns": [1.235, -0.000123],
    }


def test_counts_in_words_agree_with_their_number():
    assert plural(1, "greedy episode") == "1 greedy episode"
    assert [plural(n, "episode") for n in (0, 2, 100)] == ["0 episodes", "2 episodes", "100 episodes"]

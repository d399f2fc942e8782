"""R2D2's windows (algorithms/r2d2/writing.py Geometry): how many an environment's writer sends per request."""

from __future__ import annotations

import pytest

from apexrl.algorithms.r2d2.defaults import DEFAULT_GEOMETRY
from apexrl.algorithms.r2d2.writing import Geometry


@pytest.mark.parametrize(
    ("burn_in", "train_length", "period", "expected"),
    [
        (*DEFAULT_GEOMETRY[False], 3),  # vectors: 10 + 20 every 10
        (*DEFAULT_GEOMETRY[True], 3),  # images: the paper's 40 + 80 every 40
        (40, 40, 40, 2),  # half overlap
        (4, 8, 12, 1),  # no overlap: each window alone
        (4, 8, 5, 2),  # windows completing within one window's length (12 steps)
    ],
)
def test_the_windows_that_complete_within_one_window_go_together(
    burn_in, train_length, period, expected
) -> None:
    geometry = Geometry(burn_in, train_length, period, gamma=0.99)
    assert geometry.windows_per_request == expected
    assert (geometry.windows_per_request - 1) * period <= geometry.length - period  # the wait a window adds

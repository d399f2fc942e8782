"""strata.py: the targets of several batches back to back, each batch cut into its own strata; batch_rows checks."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.replay_server.core.strata import check_batch_rows, stratified_targets


def test_each_batch_has_one_target_in_each_of_its_own_strata():
    rng = np.random.default_rng(0)
    for _ in range(100):
        targets = stratified_targets([3, 1, 5], 12.0, rng)
        for (lo, hi), k in (((0, 3), 3), ((3, 4), 1), ((4, 9), 5)):
            j = np.arange(k)
            width = 12.0 / k
            assert np.all((targets[lo:hi] >= j * width) & (targets[lo:hi] < (j + 1) * width))


@pytest.mark.parametrize(
    ("rows", "size", "message"),
    [([2, 0, 1], 3, r"batch_rows\[1\] is 0"), ([2, 2], 3, r"sum to 4, not to batch_size \(3\)")],
)
def test_bad_batch_rows(rows, size, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_batch_rows(rows, size)


def test_good_batch_rows_come_back_as_a_tuple():
    assert check_batch_rows(np.array([2, 1], dtype=np.uint32), 3) == (2, 1)

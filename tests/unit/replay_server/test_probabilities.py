"""replay_server/core/probabilities.py against the published formulas (PER, Schaul et al. 2016, section 3.3 and 3.4).

P(i) = p_i^alpha / sum_k p_k^alpha (the tables store p^alpha, so here p_i is already raised to alpha);
w_i = (N * P(i))^-beta / max_j w_j. Written out naively per row and compared with the vectorised module, plus the
zero-mass rule (all priorities 0: uniform) and a fleet mixing shards with and without mass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from apexrl.replay_server.core import probabilities as prob


def naive_weights(p: list[float], n: int, beta: float, p_min: float) -> list[float]:
    """PER's weights one row at a time, the maximum through the smallest probability of any stored row."""
    max_w = (n * p_min) ** -beta
    return [(n * pi) ** -beta / max_w for pi in p]


def test_within_a_shard_p_is_priority_over_total() -> None:
    stored = np.array([1.0, 3.0, 0.5, 3.0])
    total = 10.0  # the shard holds more rows than were drawn
    got = prob.within_shard(stored, total, size=6)
    assert got.tolist() == [pi / total for pi in stored.tolist()]


def test_zero_mass_shard_samples_uniformly() -> None:
    assert not prob.has_mass(0.0) and prob.has_mass(5e-324)
    got = prob.within_shard(np.zeros(3), 0.0, size=8)
    np.testing.assert_array_equal(got, np.full(3, 1 / 8))


def test_shard_shares_are_totals_over_the_fleet_total_or_sizes_when_all_zero() -> None:
    np.testing.assert_array_equal(
        prob.shard_shares(np.array([1.0, 0.0, 3.0]), np.array([5, 9, 2])), [0.25, 0, 0.75]
    )
    np.testing.assert_array_equal(
        prob.shard_shares(np.zeros(3), np.array([1.0, 1.0, 2.0])), [0.25, 0.25, 0.5]
    )


def test_one_shard_weights_match_per() -> None:
    stored = np.array([4.0, 1.0, 2.0, 1.0, 0.5])  # the whole shard; every row is drawn once
    total, n, beta = float(stored.sum()), len(stored), 0.6
    p = prob.within_shard(stored, total, n)
    p_min = prob.smallest_probability([(1.0, total, float(stored.min()), n)])
    assert p_min == pytest.approx(0.5 / total, rel=1e-15)
    got = prob.importance_weights(p, n, p_min, beta)
    np.testing.assert_allclose(got, naive_weights(p.tolist(), n, beta, 0.5 / total), rtol=1e-14)
    assert got.max() == 1.0  # the row of the smallest priority has the largest weight
    assert got[0] == pytest.approx((4.0 / 0.5) ** -beta, rel=1e-14)  # (p_i / p_min)^-beta


def test_all_zero_fleet_every_weight_is_one() -> None:
    sizes = np.array([30.0, 10.0])
    share = prob.shard_shares(np.zeros(2), sizes)
    p = np.concatenate(
        [
            share[0] * prob.within_shard(np.zeros(4), 0.0, 30),
            share[1] * prob.within_shard(np.zeros(2), 0.0, 10),
        ]
    )
    np.testing.assert_allclose(p, 1 / 40, rtol=1e-15)  # uniform over the fleet's 40 rows
    p_min = prob.smallest_probability([(share[0], 0.0, 0.0, 30), (share[1], 0.0, 0.0, 10)])
    np.testing.assert_allclose(prob.importance_weights(p, 40, p_min, 0.4), 1.0, rtol=1e-14)


def test_mixed_fleet_zero_shard_is_never_drawn_and_does_not_set_the_maximum() -> None:
    # Shard 0: rows [2, 1, 1] (mass 4); shard 1: 5 rows all 0; shard 2: rows [6] (mass 6). N = 9 rows.
    rows = [[2.0, 1.0, 1.0], [0.0] * 5, [6.0]]
    totals = np.array([sum(r) for r in rows])
    share = prob.shard_shares(totals, np.array([len(r) for r in rows]))
    np.testing.assert_array_equal(share, [0.4, 0.0, 0.6])
    # P(i) = (T_s / T) * (p_i / T_s) = p_i / T for every row of the fleet.
    p = np.concatenate(
        [share[s] * prob.within_shard(np.array(rows[s]), totals[s], len(rows[s])) for s in (0, 2)]
    )
    np.testing.assert_allclose(p, [0.2, 0.1, 0.1, 0.6], rtol=1e-15)
    shards = [
        (share[s], totals[s], min(x for x in rows[s] if x > 0) if totals[s] else 0.0, len(rows[s]))
        for s in range(3)
    ]
    p_min = prob.smallest_probability(shards)
    assert p_min == pytest.approx(0.1, rel=1e-15)
    got = prob.importance_weights(p, 9, p_min, 1.0)
    np.testing.assert_allclose(got, naive_weights(p.tolist(), 9, 1.0, 0.1), rtol=1e-14)
    np.testing.assert_allclose(got, [0.5, 1.0, 1.0, 1 / 6], rtol=1e-14)


def test_smallest_probability_of_nothing_drawable_is_infinite() -> None:
    assert prob.smallest_probability([]) == math.inf
    assert prob.smallest_probability([(0.0, 0.0, 0.0, 5)]) == math.inf


def test_the_module_is_pure() -> None:
    import subprocess
    import sys

    code = (
        "import sys, apexrl.replay_server.core.probabilities as m; "
        "print(sorted(x for x in ('grpc', 'google.protobuf', 'torch') if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out

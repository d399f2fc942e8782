"""Ape-X epsilons and epsilon-greedy actions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from apexrl.algorithms.dqn.acting import make_explorer
from apexrl.algorithms.dqn.exploration import apex_epsilon, epsilon_greedy


def test_apex_epsilons_for_four_actors() -> None:
    # 0.4 ** (1 + 7 i / 3): 0.4, 0.4^(10/3), 0.4^(17/3), 0.4^8
    got = [apex_epsilon(i, 4) for i in range(4)]
    assert got == pytest.approx([0.4, 0.047_156, 0.005_559, 0.000_655_36], rel=1e-4)
    assert got[-1] == pytest.approx(0.4**8)
    assert got == sorted(got, reverse=True)


def test_single_actor_gets_base() -> None:
    assert apex_epsilon(0, 1) == 0.4
    assert apex_epsilon(0, 1, base=0.25) == 0.25


def test_custom_base_and_alpha() -> None:
    assert apex_epsilon(1, 3, base=0.5, alpha=2.0) == pytest.approx(0.5**2)
    assert apex_epsilon(2, 3, base=0.5, alpha=0.0) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("index", "num", "base", "alpha"),
    [
        (0, 0, 0.4, 7.0),
        (-1, 4, 0.4, 7.0),
        (4, 4, 0.4, 7.0),
        (1.0, 4, 0.4, 7.0),
        (True, 4, 0.4, 7.0),
        (0, 4, 1.5, 7.0),
        (0, 4, -0.1, 7.0),
        (0, 4, math.nan, 7.0),
        (0, 4, 0.4, -1.0),
        (0, 4, 0.4, math.nan),
    ],
)
def test_apex_epsilon_rejects_bad_inputs(index: object, num: object, base: float, alpha: float) -> None:
    with pytest.raises(ValueError):
        apex_epsilon(index, num, base=base, alpha=alpha)  # type: ignore[arg-type]


def test_epsilon_greedy() -> None:
    rng = np.random.default_rng(0)
    q = np.array([[0.0, 1.0, 0.5], [2.0, 1.0, 0.0]])
    np.testing.assert_array_equal(epsilon_greedy(q, 0.0, rng), [1, 0])
    actions = epsilon_greedy(np.tile(q[:1], (30_000, 1)), 1.0, rng)
    assert actions.dtype == np.int64
    assert np.bincount(actions, minlength=3) / actions.size == pytest.approx([1 / 3] * 3, abs=0.02)
    actions = epsilon_greedy(np.tile(q[:1], (30_000, 1)), 0.3, rng)
    assert np.mean(actions == 1) == pytest.approx(0.7 + 0.3 / 3, abs=0.02)
    with pytest.raises(ValueError):
        epsilon_greedy(q, 1.1, rng)
    with pytest.raises(ValueError):
        epsilon_greedy(q[0], 0.1, rng)


def test_each_actor_logs_its_own_epsilon_and_the_evaluator_plays_greedily() -> None:
    rng = np.random.default_rng(0)
    settings = {"actor_index": 1, "num_actors": 4, "evaluate": False, "epsilon": None}
    actor = make_explorer(SimpleNamespace(**settings), None, rng)  # type: ignore[arg-type]
    assert actor.scale == pytest.approx(apex_epsilon(1, 4))
    assert actor.describe() == f"epsilon {apex_epsilon(1, 4):.4f}"
    evaluator = make_explorer(SimpleNamespace(**{**settings, "evaluate": True}), None, rng)  # type: ignore[arg-type]
    assert evaluator.describe() == "epsilon 0.0000"

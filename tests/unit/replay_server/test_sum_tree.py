"""Property tests of the sum tree against a naive reference (a plain array of leaves)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from apexrl.replay_server.core.sum_tree import SumTree

TINY = 5e-324  # smallest positive float64 (subnormal)

# top_nodes=1 keeps a full binary tree up to the root; small values mix prefix-sum top and tree levels; the
# default covers the shipped configuration (a flat prefix sum for these small capacities).
TOP_NODES = [1, 4, 4096]
CAPACITIES = [1, 2, 3, 7, 1000, 1023, 1024, 1025]
ALPHAS = [0.0, 0.6, 1.0, 2.0]


class Reference:
    """The naive model: one array of leaves, the rules of SumTree written out one item at a time."""

    def __init__(self, capacity: int, alpha: float) -> None:
        self.alpha = alpha
        self.leaves = np.zeros(capacity)

    def leaf_value(self, priority: float) -> float:
        if priority == 0.0:
            return 0.0  # zero priority: never sampled, whatever alpha (numpy says 0 ** 0 == 1)
        return max(float(np.float64(priority) ** self.alpha), TINY)  # positive stays positive (underflow)

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        for i, p in zip(indices, priorities, strict=True):  # in order: the last duplicate wins
            self.leaves[i] = self.leaf_value(p)

    @property
    def positive_min(self) -> float:
        positive = self.leaves[self.leaves > 0]
        return float(positive.min()) if positive.size else 0.0


def assert_matches(tree: SumTree, ref: Reference) -> None:
    leaves = tree.get(np.arange(tree.capacity))
    assert leaves.dtype == np.float64
    np.testing.assert_array_equal(leaves > 0, ref.leaves > 0)  # zero exactly where the reference is zero
    # rel 1e-12 rather than equality: numpy's vectorised power may differ from the scalar one in the last ulp.
    np.testing.assert_allclose(leaves, ref.leaves, rtol=1e-12, atol=0)
    expected_total = float(ref.leaves.sum())
    if expected_total == 0.0:
        assert tree.total == 0.0
    else:
        assert tree.total == pytest.approx(expected_total, rel=1e-9, abs=0)
    assert tree.min == pytest.approx(ref.positive_min, rel=1e-12, abs=0)


# Priorities mix the awkward values (zero, tiny, subnormal) with ordinary ones.
priority = st.one_of(
    st.sampled_from([0.0, 1e-300, TINY, 1.0, 3.0]),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
)


@st.composite
def batch(draw: st.DrawFn, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of (indices, priorities): random with duplicates, wrap-around runs, or one index repeated."""
    n = draw(st.integers(min_value=1, max_value=40))
    pattern = draw(st.sampled_from(["random", "wrap", "repeat"]))
    if pattern == "random":
        indices = draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
    elif pattern == "wrap":  # a ring buffer's insert position running past the end
        start = draw(st.integers(0, capacity - 1))
        indices = [(start + k) % capacity for k in range(n)]
    else:
        indices = [draw(st.integers(0, capacity - 1))] * n
    priorities = draw(st.lists(priority, min_size=n, max_size=n))
    return np.array(indices, dtype=np.int64), np.array(priorities, dtype=np.float64)


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.sampled_from(CAPACITIES),
    top_nodes=st.sampled_from(TOP_NODES),
    alpha=st.sampled_from(ALPHAS),
    data=st.data(),
)
def test_random_batched_updates_match_reference(
    capacity: int, top_nodes: int, alpha: float, data: st.DataObject
) -> None:
    tree = SumTree(capacity, alpha, top_nodes=top_nodes)
    ref = Reference(capacity, alpha)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(data.draw(st.integers(1, 6))):
        indices, priorities = data.draw(batch(capacity))
        tree.update(indices, priorities)
        ref.update(indices, priorities)
        assert_matches(tree, ref)
        if ref.leaves.sum() > 0:
            sampled = tree.sample(data.draw(st.integers(1, 300)), rng)
            assert sampled.dtype == np.int64
            assert ((sampled >= 0) & (sampled < capacity)).all()
            assert (ref.leaves[sampled] > 0).all()
        else:
            with pytest.raises(ValueError):
                tree.sample(8, rng)


@settings(max_examples=30, deadline=None)
@given(
    capacity=st.integers(1, 70),
    top_nodes=st.sampled_from(TOP_NODES),
    magnitudes=st.lists(st.integers(-300, 300), min_size=70, max_size=70),
    zeros=st.lists(st.booleans(), min_size=70, max_size=70),
)
def test_targets_at_every_boundary_land_on_a_positive_leaf_holding_them(
    capacity: int, top_nodes: int, magnitudes: list[int], zeros: list[bool]
) -> None:
    """Targets exactly at, just below and just above every prefix sum, and far outside: the tree's sums round
    differently from a running sum (widely spread magnitudes make sure of it), so a target may move to a leaf whose
    interval is a rounding error away, but never onto a zero or padding leaf."""
    leaves = np.array([0.0 if z else 1.7**m for m, z in zip(magnitudes, zeros, strict=True)])[:capacity]
    if not leaves.any():
        leaves[capacity // 2] = 1.0
    tree = SumTree(capacity, alpha=1.0, top_nodes=top_nodes)
    tree.update(np.arange(capacity), leaves)
    bounds = np.concatenate([[0.0], np.cumsum(leaves)])
    targets = np.concatenate(
        [bounds, np.nextafter(bounds, np.inf), np.nextafter(bounds, -np.inf), [-1.0, 1e308]]
    )
    found = tree.find_prefix_sum(targets)
    assert found.dtype == np.int64
    assert (leaves[found] > 0).all()
    # Summing n non-negative terms in any order errs by at most about n * eps * total.
    slack = 4 * capacity * np.finfo(np.float64).eps * bounds[-1]
    clamped = np.clip(targets, 0.0, bounds[-1])
    assert (bounds[found] - slack <= clamped).all()
    assert (clamped <= bounds[found + 1] + slack).all()


def test_rounding_fallback_case_found_by_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree where the fast descent overshoots into a zero subtree for a boundary target (found by random search);
    the spy keeps this test honest about exercising the guarded fallback."""
    leaves = np.array([9.978485250033613e-06, 0, 0, 0, 0, 8.177167704109065e-06, 9.461750015602374e-06])
    tree = SumTree(len(leaves), alpha=1.0, top_nodes=1)
    tree.update(np.arange(len(leaves)), leaves)
    fallback = tree._descend_guarded
    redone: list[int] = []

    def spy(u: np.ndarray) -> np.ndarray:
        redone.append(u.size)
        return fallback(u)

    monkeypatch.setattr(tree, "_descend_guarded", spy)
    bounds = np.concatenate([[0.0], np.cumsum(leaves)])
    targets = np.concatenate([bounds, np.nextafter(bounds, np.inf), np.nextafter(bounds, -np.inf)])
    assert (leaves[tree.find_prefix_sum(targets)] > 0).all()
    assert redone


# ------------------------------------------------------------------ distribution


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("top_nodes", [1, 4096])
def test_sampling_follows_priority_to_the_alpha(alpha: float, top_nodes: int) -> None:
    """Chi-square goodness of fit of 200,000 draws over 50 leaves against p ** alpha / sum.

    The seed is fixed, so the test is deterministic. Threshold 1e-3: a correct sampler would fail it for about one
    seed in a thousand (so changing the seed is unlikely to produce a spurious failure), while a real bias (a leaf
    off by one, alpha applied twice or not at all) drives the p-value to ~0 at this many draws (checked below).
    """
    rng = np.random.default_rng(20240611)
    priorities = np.linspace(0.5, 25.0, 50)  # distinct, spanning a factor of 50
    capacity = 53  # not a power of two; three trailing leaves stay zero
    tree = SumTree(capacity, alpha, top_nodes=top_nodes)
    tree.update(np.arange(50), priorities)
    expected = priorities**alpha / np.sum(priorities**alpha)
    n = 200_000

    # Independent draws through the descent itself: counts are multinomial, as chi-square assumes.
    independent = tree.find_prefix_sum(rng.random(n) * tree.total)
    counts = np.bincount(independent, minlength=capacity)
    assert counts[50:].sum() == 0
    assert chisquare(counts[:50], expected * n).pvalue > 1e-3

    # Stratified batches: less variance than multinomial, so the same test is conservative but still catches bias.
    stratified = np.concatenate([tree.sample(250, rng) for _ in range(n // 250)])
    counts = np.bincount(stratified, minlength=capacity)
    assert counts[50:].sum() == 0
    assert chisquare(counts[:50], expected * n).pvalue > 1e-3

    if alpha != 1.0:  # the test has power: the same counts reject the distribution without alpha
        wrong = priorities / priorities.sum()
        assert chisquare(counts[:50], wrong * n).pvalue < 1e-10


@pytest.mark.parametrize("position", [0, 49])
def test_stratified_batch_gives_an_edge_leaf_floor_or_ceil_of_its_share(position: int) -> None:
    """A leaf holding fraction f of the mass, starting (or ending) on a stratum boundary, gets floor(f * B) or
    ceil(f * B) of every batch of B. (A leaf whose mass starts mid-stratum can get one more or one fewer.)"""
    rng = np.random.default_rng(7)
    priorities = rng.uniform(1.0, 2.0, size=50)
    fraction = 0.3
    rest = priorities.sum() - priorities[position]
    priorities[position] = fraction / (1 - fraction) * rest  # leaf `position` holds 30% of the mass
    tree = SumTree(50, alpha=1.0, top_nodes=4)
    tree.update(np.arange(50), priorities)
    batch_size = 64  # 0.3 * 64 = 19.2
    counts = [int((tree.sample(batch_size, rng) == position).sum()) for _ in range(300)]
    assert set(counts) == {19, 20}  # both occur: the 0.2 is spread over calls, not rounded away
    assert np.mean(counts) == pytest.approx(19.2, abs=0.1)


def test_stratified_batch_gives_an_inner_leaf_its_share_within_one_stratum_either_side() -> None:
    rng = np.random.default_rng(8)
    priorities = rng.uniform(1.0, 2.0, size=50)
    priorities[17] = 0.3 / 0.7 * (priorities.sum() - priorities[17])
    tree = SumTree(50, alpha=1.0, top_nodes=4)
    tree.update(np.arange(50), priorities)
    counts = [int((tree.sample(64, rng) == 17).sum()) for _ in range(300)]
    assert set(counts) <= {18, 19, 20, 21}  # 19.2 strata: 18 or 19 whole ones plus two partial ends
    assert np.mean(counts) == pytest.approx(19.2, abs=0.1)


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("top_nodes", TOP_NODES)
def test_empty_and_emptied_tree_refuses_to_sample(top_nodes: int) -> None:
    rng = np.random.default_rng(0)
    tree = SumTree(10, top_nodes=top_nodes)
    assert tree.total == 0.0 and tree.min == 0.0
    with pytest.raises(ValueError, match="total priority"):
        tree.sample(4, rng)
    tree.update(np.array([2, 7]), np.array([1e-300, 4.0]))
    assert tree.total > 0
    tree.update(np.array([7, 2]), np.array([0.0, 0.0]))
    assert tree.total == 0.0 and tree.min == 0.0  # exactly zero: sums are recomputed, never drift
    with pytest.raises(ValueError, match="total priority"):
        tree.sample(4, rng)
    with pytest.raises(ValueError, match="total priority"):
        tree.find_prefix_sum(np.array([0.0]))


def test_batch_size_must_be_positive() -> None:
    tree = SumTree(4)
    tree.update(np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        tree.sample(0, np.random.default_rng(0))


def test_alpha_zero_counts_every_positive_priority_once_and_zero_never() -> None:
    tree = SumTree(6, alpha=0.0)
    tree.update(np.arange(6), np.array([0.0, 1e-300, TINY, 1.0, 1e10, 0.0]))
    np.testing.assert_array_equal(tree.get(np.arange(6)), [0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    assert tree.total == 4.0 and tree.min == 1.0
    sampled = tree.sample(1000, np.random.default_rng(0))
    assert set(sampled.tolist()) == {1, 2, 3, 4}
    assert np.bincount(sampled, minlength=6)[1:5].tolist() == [250] * 4  # equal mass, stratified: exact


def test_subnormal_leaf_alone_is_sampled() -> None:
    tree = SumTree(1000, alpha=1.0, top_nodes=1)
    tree.update(np.array([613]), np.array([TINY]))
    assert tree.total == TINY and tree.min == TINY
    assert (tree.sample(16, np.random.default_rng(0)) == 613).all()


def test_alpha_above_one_keeps_tiny_priorities_sampleable_and_rejects_overflow() -> None:
    tree = SumTree(4, alpha=2.0)
    tree.update(np.array([0, 1]), np.array([1e-300, 0.0]))  # (1e-300) ** 2 underflows to 0
    assert tree.get(np.array([0, 1])).tolist() == [TINY, 0.0]
    with pytest.raises(ValueError, match="overflows"):
        tree.update(np.array([2]), np.array([1e200]))
    assert tree.get(np.array([2]))[0] == 0.0


def test_duplicate_indices_last_one_wins() -> None:
    tree = SumTree(8, alpha=1.0, top_nodes=1)
    tree.update(np.array([3, 5, 3, 3, 5]), np.array([1.0, 9.0, 5.0, 2.0, 0.0]))
    assert tree.get(np.array([3, 5])).tolist() == [2.0, 0.0]
    assert tree.total == 2.0 and tree.min == 2.0
    tree.update(np.array([6, 6, 6]), np.array([4.0, 4.0, 4.0]))  # agreeing duplicates
    assert tree.total == 6.0


def test_set_leaf_values_skips_alpha() -> None:
    tree = SumTree(5, alpha=0.5)
    tree.set_leaf_values(np.array([0, 4]), np.array([9.0, 0.25]))
    assert tree.get(np.array([0, 4])).tolist() == [9.0, 0.25]
    tree.update(np.array([0]), np.array([9.0]))
    assert tree.get(np.array([0]))[0] == 3.0


@pytest.mark.parametrize(("capacity", "top_nodes"), [(1, 1), (5, 1), (1000, 4), (1000, 4096), (1024, 64)])
def test_load_leaves_builds_the_tree_that_updating_every_leaf_builds(capacity: int, top_nodes: int) -> None:
    """The bulk rebuild used by checkpoint restores agrees with leaf-by-leaf updates on totals, minimum and
    sampling, zero leaves included, and replaces whatever the tree held before."""
    rng = np.random.default_rng(capacity)
    values = rng.random(capacity) * (rng.random(capacity) > 0.2)
    values[0] = 0.0
    loaded, updated = SumTree(capacity, 0.6, top_nodes=top_nodes), SumTree(capacity, 0.6, top_nodes=top_nodes)
    loaded.set_leaf_values(np.arange(capacity), np.full(capacity, 7.0))  # overwritten by the load
    loaded.load_leaves(values)
    updated.set_leaf_values(np.arange(capacity), values)
    assert loaded.total == pytest.approx(updated.total, rel=1e-12) and loaded.min == updated.min
    np.testing.assert_array_equal(loaded.leaf_values(), values)
    np.testing.assert_array_equal(loaded.leaf_values(1, min(3, capacity)), values[1:3])
    if updated.total > 0:
        targets = rng.random(64) * updated.total
        np.testing.assert_array_equal(loaded.find_prefix_sum(targets), updated.find_prefix_sum(targets))
    with pytest.raises(ValueError, match="does not match the capacity"):
        loaded.load_leaves(values[:-1] if capacity > 1 else np.zeros(2))
    with pytest.raises(ValueError, match="must be finite"):
        loaded.load_leaves(np.full(capacity, np.nan))


def test_get_returns_a_copy() -> None:
    tree = SumTree(3, alpha=1.0)
    tree.update(np.array([1]), np.array([2.0]))
    leaves = tree.get(np.array([1]))
    leaves[0] = 100.0
    assert tree.get(np.array([1]))[0] == 2.0 and tree.total == 2.0


def test_find_prefix_sum_clamps_targets_outside_the_mass() -> None:
    tree = SumTree(9, alpha=1.0, top_nodes=1)
    tree.update(np.array([2, 4, 6]), np.array([1.0, 2.0, 3.0]))
    got = tree.find_prefix_sum(np.array([-5.0, 0.0, 0.999, 1.0, 2.999, 3.0, 5.999, 6.0, 1e300, np.inf]))
    assert got.tolist() == [2, 2, 2, 4, 4, 6, 6, 6, 6, 6]
    with pytest.raises(ValueError, match="NaN"):
        tree.find_prefix_sum(np.array([np.nan]))
    assert tree.find_prefix_sum(np.array([])).tolist() == []


def test_large_tree_with_default_top_level() -> None:
    """The shipped configuration at a size where binary levels sit below the prefix-sum top level."""
    capacity = 100_003
    rng = np.random.default_rng(3)
    tree = SumTree(capacity, alpha=0.6)
    ref = Reference(capacity, 0.6)
    for _ in range(20):
        indices = rng.integers(0, capacity, 256)
        priorities = rng.random(256) * (rng.random(256) < 0.9)
        tree.update(indices, priorities)
        ref.update(indices, priorities)
        sampled = tree.sample(256, rng)
        assert (ref.leaves[sampled] > 0).all()
    assert_matches(tree, ref)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, "3", None])
def test_constructor_rejects_bad_capacity(capacity: object) -> None:
    with pytest.raises(ValueError, match=r"capacity \("):
        SumTree(capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("alpha", [-0.1, math.nan, math.inf, "x"])
def test_constructor_rejects_bad_alpha(alpha: object) -> None:
    with pytest.raises(ValueError, match=r"alpha \("):
        SumTree(4, alpha)  # type: ignore[arg-type]


@pytest.mark.parametrize("top_nodes", [0, 3, -4])
def test_constructor_rejects_bad_top_nodes(top_nodes: int) -> None:
    with pytest.raises(ValueError, match=r"top_nodes \("):
        SumTree(4, top_nodes=top_nodes)


@pytest.mark.parametrize(
    ("indices", "priorities", "message"),
    [
        ([0, 4], [1.0, 1.0], r"index \(4\)"),
        ([-1], [1.0], r"index \(-1\)"),
        ([0.0], [1.0], "integers"),
        ([[0]], [[1.0]], "1-D"),
        ([0, 1], [1.0], "shape"),
        ([0, 1], [1.0, -2.0], r"priority \(-2.0\)"),
        ([0], [math.nan], r"priority \(nan\)"),
        ([0], [math.inf], r"priority \(inf\)"),
    ],
)
def test_update_rejects_bad_input_and_leaves_tree_unchanged(
    indices: list, priorities: list, message: str
) -> None:
    tree = SumTree(4, alpha=1.0)
    tree.update(np.array([0, 1]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=message):
        tree.update(np.array(indices), np.array(priorities))
    assert tree.get(np.arange(4)).tolist() == [1.0, 2.0, 0.0, 0.0]
    assert tree.total == 3.0


def test_empty_update_is_a_no_op() -> None:
    tree = SumTree(4)
    tree.update(np.array([], dtype=np.int64), np.array([]))
    tree.update(np.array([]), np.array([]))
    assert tree.total == 0.0

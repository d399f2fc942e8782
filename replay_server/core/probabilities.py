"""Sampling probabilities and importance weights of prioritized replay, written once (PER, Schaul et al. 2016).

The shard's table draws, the wire's SampledBatch reports and the learner's ShardedReplayClient weighs with the
same rules, so they live here, in one pure numpy module (no gRPC, no protobuf, no torch):

- Within one shard, row i is drawn with probability p_i / T_s, p_i its stored priority (raw ** alpha) and T_s the
  shard's total. The zero-mass rule: when every stored priority is 0 (T_s == 0) the shard samples uniformly,
  1 / size, rather than refuse.
- Across shards, shard s gets the share T_s / T of the batch, T = sum_s T_s; by the same rule, when every shard
  has mass 0 the shares follow the shards' sizes. So P(i) = (T_s / T) * (p_i / T_s).
- Importance weights: w_i = (N * P(i)) ** -beta / max_j w_j, with N the rows covered, and max_j w_j taken through
  the smallest P(j) of any stored row, (N * P_min) ** -beta, so weights are at most 1 over the whole fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def has_mass(total: float) -> bool:
    """True when a shard (or fleet) with this total priority samples by priority; False: the zero-mass rule
    applies and it samples uniformly by rows."""
    return total > 0


def within_shard(priorities: np.ndarray, total: float, size: int) -> np.ndarray:
    """P(row | shard) of sampled rows: p_i / T_s, or 1 / size for each row when T_s is 0 (zero-mass rule)."""
    if has_mass(total):
        return priorities / total
    return np.full(len(priorities), 1 / size)


def shard_shares(totals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Each shard's share of a batch: T_s / T, or size_s / sum(size) when every T_s is 0 (zero-mass rule)."""
    mass = np.asarray(totals, dtype=np.float64)
    if not has_mass(mass.sum()):
        mass = np.asarray(sizes, dtype=np.float64)
    return mass / mass.sum()


def smallest_probability(shards: Iterable[tuple[float, float, float, int]]) -> float:
    """The smallest P(j) of any stored row, over (share, total, min_priority, size) of each covered shard: the
    normaliser of the importance weights (math.inf when no covered shard can be drawn from)."""
    smallest = math.inf
    for share, total, min_priority, size in shards:
        if share <= 0:  # a zero-mass shard beside shards with mass: none of its rows is drawn
            continue
        if has_mass(total) and min_priority > 0:
            smallest = min(smallest, share * min_priority / total)
        elif not has_mass(total) and size > 0:  # uniform within the shard
            smallest = min(smallest, share / size)
    return smallest


def importance_weights(probabilities: np.ndarray, n: int, p_min: float, beta: float) -> np.ndarray:
    """w_i = (N * P(i)) ** -beta / (N * P_min) ** -beta: PER's weights normalised by the largest possible one."""
    return (n * probabilities) ** -beta / (n * p_min) ** -beta

"""Ape-X DPG exploration: Gaussian noise with a fixed scale per actor, spread over the fleet the way Ape-X spreads
DQN's epsilons, in units of each action dimension's half range, and clipped to the bounds. Pure numpy.

Actor i of N gets sigma_i = sigma_max * (sigma_min / sigma_max) ** (i / (N - 1)): a geometric spread, as Ape-X's
epsilon_i = 0.4 ** (1 + 7 i / (N - 1)) is, from sigma_max (actor 0 explores hard) down to sigma_min (the last
actors stay near the policy). Unlike the epsilons, the floor is kept well away from 0: an epsilon of 0.0007 still
takes a uniformly random action now and then, while a noise scale of 0.0007 never leaves the policy's action.
A single actor gets the geometric mean sqrt(sigma_max * sigma_min). Noise is added per action dimension:
a = clip(pi(s) + sigma_i * (high - low) / 2 * N(0, I), low, high).
"""

from __future__ import annotations

import math

import numpy as np

SIGMA_MAX = 0.5
SIGMA_MIN = 0.05


def apex_noise_scale(
    actor_index: int, num_actors: int, sigma_max: float = SIGMA_MAX, sigma_min: float = SIGMA_MIN
) -> float:
    """sigma_i = sigma_max * (sigma_min / sigma_max) ** (i / (N - 1)); N = 1: sqrt(sigma_max * sigma_min)."""
    if isinstance(num_actors, bool) or not isinstance(num_actors, (int, np.integer)) or num_actors < 1:
        raise ValueError(f"num_actors ({num_actors!r}) must be a positive integer")
    if (
        isinstance(actor_index, bool)
        or not isinstance(actor_index, (int, np.integer))
        or not 0 <= actor_index < num_actors
    ):
        raise ValueError(f"actor_index ({actor_index!r}) must be an integer in [0, num_actors={num_actors})")
    if not 0 < sigma_min <= sigma_max:
        raise ValueError(
            f"sigma_min ({sigma_min!r}) and sigma_max ({sigma_max!r}) must satisfy 0 < min <= max"
        )
    if num_actors == 1:
        return math.sqrt(sigma_max * sigma_min)
    return float(sigma_max * (sigma_min / sigma_max) ** (actor_index / (num_actors - 1)))


def gaussian_actions(
    greedy: np.ndarray, sigma: float, low: np.ndarray, high: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """clip(greedy + sigma * (high - low) / 2 * N(0, I), low, high), float32 [batch, action_dim]."""
    greedy = np.asarray(greedy, dtype=np.float64)
    noisy = greedy + sigma * (high - low) * 0.5 * rng.standard_normal(greedy.shape)
    return np.clip(noisy, low, high).astype(np.float32)


def uniform_actions(batch: int, low: np.ndarray, high: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Actions drawn uniformly inside the bounds, float32 [batch, action_dim]."""
    return rng.uniform(low, high, size=(batch, len(low))).astype(np.float32)

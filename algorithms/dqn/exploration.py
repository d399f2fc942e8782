"""Ape-X DQN exploration: fixed per-actor epsilons and epsilon-greedy action choice.

Pure numpy. Ape-X (Horgan et al., 2018) gives actor i of N the constant epsilon_i = base^(1 + alpha * i / (N - 1)),
base = 0.4, alpha = 7: a spread from 0.4 (actor 0) down to 0.4^8 ~ 0.00066 (actor N-1), with no annealing.
"""

from __future__ import annotations

import numpy as np


def apex_epsilon(actor_index: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """epsilon_i = base ** (1 + alpha * i / (N - 1)); a single actor (N = 1) gets `base`."""
    if isinstance(num_actors, bool) or not isinstance(num_actors, (int, np.integer)) or num_actors < 1:
        raise ValueError(f"num_actors ({num_actors!r}) must be a positive integer")
    if (
        isinstance(actor_index, bool)
        or not isinstance(actor_index, (int, np.integer))
        or not 0 <= actor_index < num_actors
    ):
        raise ValueError(f"actor_index ({actor_index!r}) must be an integer in [0, num_actors={num_actors})")
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"base ({base!r}) must be in [0, 1]")
    if not alpha >= 0.0:  # also rejects NaN
        raise ValueError(f"alpha ({alpha!r}) must be >= 0")
    if num_actors == 1:
        return float(base)
    return float(base ** (1.0 + alpha * actor_index / (num_actors - 1)))


def epsilon_greedy(q_values: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Actions for a batch `q_values[B, num_actions]`: argmax, or with probability epsilon a uniform action."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon ({epsilon!r}) must be in [0, 1]")
    q_values = np.asarray(q_values)
    if q_values.ndim != 2 or q_values.shape[1] < 1:
        raise ValueError(f"q_values must have shape [batch, num_actions], got {q_values.shape}")
    greedy = q_values.argmax(axis=1)
    random = rng.integers(q_values.shape[1], size=q_values.shape[0])
    return np.where(rng.random(q_values.shape[0]) < epsilon, random, greedy).astype(np.int64)

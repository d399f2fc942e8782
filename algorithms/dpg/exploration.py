"""Ape-X DPG exploration: Gaussian noise with a fixed scale per actor, spread over the fleet the way Ape-X spreads
DQN's epsilons, in units of each action dimension's half range, and clipped to the bounds. Pure numpy.

Actor i of N gets sigma_i = sigma_max * (sigma_min / sigma_max) ** (i / (N - 1)): a geometric spread, as Ape-X's
epsilon_i = 0.4 ** (1 + 7 i / (N - 1)) is, from sigma_max (actor 0 explores hard) down to sigma_min (the last
actors stay near the policy). Unlike the epsilons, the floor is kept well away from 0: an epsilon of 0.0007 still
takes a uniformly random action now and then, while a noise scale of 0.0007 never leaves the policy's action.
A single actor gets the geometric mean sqrt(sigma_max * sigma_min). Noise is added per action dimension:
a = clip(pi(s) + sigma_i * (high - low) / 2 * z, low, high), z ~ N(0, I).

By default z is drawn afresh every step. With a correlation rho > 0 each environment's z follows an AR(1) process,
z_t = rho * z_{t-1} + sqrt(1 - rho^2) * e_t, started in its stationary law: every z_t is still N(0, I), so sigma_i
keeps its meaning, but the noise pushes one way for ~1 / (1 - rho) steps. Independent draws cancel out within a
few steps; a task whose reward lies behind a sustained push (MountainCarContinuous: swing back and forth to climb
out of the valley) is found by a hard-exploring actor with correlated noise and by none with white noise
(bench/README.md, "Noise correlation"). That is the temporally correlated noise of DDPG's Ornstein-Uhlenbeck
process, with its variance fixed to sigma_i^2 instead of growing from 0 after each reset.
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


class UnitNoise:
    """z ~ N(0, I) per environment and action dimension, each draw keeping `correlation` of the last one (see the
    module's docstring); 0 draws every z afresh. Its state is per row of the batch, so one actor's environments
    (always stepped together) each get their own process."""

    def __init__(self, correlation: float, rng: np.random.Generator) -> None:
        if not 0 <= correlation < 1:
            raise ValueError(f"noise correlation ({correlation!r}) must be in [0, 1)")
        self.correlation = float(correlation)
        self._innovation = math.sqrt(1.0 - self.correlation**2)
        self._rng = rng
        self._last: np.ndarray | None = None

    def draw(self, shape: tuple[int, ...]) -> np.ndarray:
        fresh = self._rng.standard_normal(shape)
        if self.correlation and self._last is not None and self._last.shape == shape:
            fresh = self.correlation * self._last + self._innovation * fresh
        self._last = fresh
        return fresh


def gaussian_actions(
    greedy: np.ndarray, sigma: float, low: np.ndarray, high: np.ndarray, unit_noise: np.ndarray
) -> np.ndarray:
    """clip(greedy + sigma * (high - low) / 2 * unit_noise, low, high), float32 [batch, action_dim]."""
    greedy = np.asarray(greedy, dtype=np.float64)
    noisy = greedy + sigma * (high - low) * 0.5 * unit_noise
    return np.clip(noisy, low, high).astype(np.float32)


def uniform_actions(batch: int, low: np.ndarray, high: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Actions drawn uniformly inside the bounds, float32 [batch, action_dim]."""
    return rng.uniform(low, high, size=(batch, len(low))).astype(np.float32)

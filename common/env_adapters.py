"""Adapters that turn environments the built-in networks cannot read as they are into ones they can: Discrete
observations one-hot encoded, and environments written for `gym` 0.26 run as Gymnasium ones; and the partially
observed tasks apexrl ships (`CartPoleNoVel-v1`: CartPole without its velocities, which a policy must remember).

Why Shimmy's `GymV26CompatibilityV0` without Shimmy's `gym-v26` extra: that extra pins numpy<2 (this project runs
numpy 2), and gym 0.26's own environment checker, which `gym.make` wraps every environment in, calls `np.bool8`,
gone in numpy 2. gym 0.26.2 itself imports and steps under numpy 2, so the environment is made with
`gym.make(id, disable_env_checker=True)` and handed to Shimmy's class, which converts the spaces and passes reset
and step through (gym 0.26 already has Gymnasium's reset/step API). Install both with the `gym26` extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from typing import Any

import gymnasium as gym
import numpy as np

from apexrl.common.spaces import one_hot


class OneHotObservation(gym.ObservationWrapper):
    """A Discrete(n) observation (FrozenLake's cell, Taxi's state) as a float32 one-hot vector of n: what
    Stable-Baselines3 does, so the MLP reads every state as its own input."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"one-hot encoding needs a Discrete observation space, got {space}")
        self.n, self.start = int(space.n), int(space.start)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.n,), np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return one_hot(observation, self.n, self.start)


def gym26_registered(env_id: str) -> bool:
    """Whether `gym` (0.26) is installed and registers `env_id` (call it for ids Gymnasium lacks)."""
    old_gym = _quiet_gym()
    return old_gym is not None and env_id in old_gym.envs.registry


def gym26_reward_threshold(env_id: str) -> float | None:
    old_gym = _quiet_gym()
    spec = None if old_gym is None else old_gym.envs.registry.get(env_id)
    return None if spec is None or spec.reward_threshold is None else float(spec.reward_threshold)


def _quiet_gym() -> Any:
    """The `gym` module, or None when it is not installed. gym prints a notice on stderr at import (unmaintained,
    use Gymnasium): kept off the roles' logs and off the one-line error of an unknown id."""
    if importlib.util.find_spec("gym") is None:
        return None
    with contextlib.redirect_stderr(io.StringIO()):
        import gym as old_gym
    return old_gym


def make_gym26(env_id: str, **kwargs: Any) -> gym.Env:
    """gym 0.26's `env_id` as a Gymnasium environment (module docstring); ImportError naming the extra without
    Shimmy."""
    old_gym = _quiet_gym()
    try:
        from shimmy import GymV26CompatibilityV0
    except ImportError as err:
        raise ImportError(
            f"{err}: gym 0.26 environments need the gym26 extra (pip install 'apexrl[gym26]')"
        ) from None
    return GymV26CompatibilityV0(env=old_gym.make(env_id, disable_env_checker=True, **kwargs))


# Observation entries zeroed by the velocity-free tasks, as rl-baselines3-zoo masks them (MaskVelocityWrapper).
NO_VELOCITY = {"CartPoleNoVel-v1": ("CartPole-v1", (1, 3))}  # cart velocity, pole angular velocity


class MaskVelocity(gym.ObservationWrapper):
    """Zeroes the velocity entries of the observation (the space is unchanged: 0 is inside it), so one observation
    no longer tells the state: a policy must infer the velocities from the positions it saw."""

    def __init__(self, env: gym.Env, indices: tuple[int, ...]) -> None:
        super().__init__(env)
        self._mask = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
        self._mask[list(indices)] = 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self._mask


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """CartPole-v1's dynamics without its velocities (`CartPoleNoVel-v1`; its time limit and solve bar come from
    the registration)."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return MaskVelocity(CartPoleEnv(**kwargs), NO_VELOCITY["CartPoleNoVel-v1"][1])

"""Environments whose spaces the built-in actor cannot play, registered on import, for the tests of clear refusals:
`apexrl launch --env tests.support.odd_envs:UnboundedActions-v0` (Gymnasium imports this module for the id)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import PendulumEnv


class UnboundedActions(PendulumEnv):
    """Pendulum with an action space of infinite bounds: no squashed policy can cover it."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


class MultiDiscreteActions(PendulumEnv):
    """Pendulum with a MultiDiscrete action space: neither Discrete nor Box."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.action_space = gym.spaces.MultiDiscrete([3, 3])


gym.register("UnboundedActions-v0", entry_point=UnboundedActions, max_episode_steps=200)
gym.register("MultiDiscreteActions-v0", entry_point=MultiDiscreteActions, max_episode_steps=200)

"""A custom environment for apexrl, the way a Gymnasium user writes one: a class and a `gymnasium.register` call.

`Corridor-v0`: walk from cell 0 to the last cell of a corridor (`length` cells, a constructor argument). Each step
moves left (action 0) or right (action 1); reaching the end pays 1 and ends the episode, and an episode is cut
after 4 * length steps. The observation is the cell, a Discrete(length) space, which apexrl one-hot encodes.
The registration's reward_threshold (1.0: every evaluation episode reaches the end) is the return at which
`apexrl launch` stops, solved.

    cd examples/custom_env
    apexrl launch --env-module corridor --env Corridor-v0 --env-kwargs '{"length": 8}'
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 8) -> None:
        if length < 2:
            raise ValueError(f"length ({length}) must be at least 2")
        self.length = length
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)
        self._cell = 0
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self._cell, self._steps = 0, 0
        return self._cell, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        self._cell = int(np.clip(self._cell + (1 if action == 1 else -1), 0, self.length - 1))
        self._steps += 1
        reached = self._cell == self.length - 1
        return self._cell, float(reached), reached, self._steps >= 4 * self.length, {}


gym.register("Corridor-v0", entry_point=Corridor, reward_threshold=1.0)

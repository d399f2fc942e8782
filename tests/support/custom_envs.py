"""Environments a user brings, registered on import, for the tests of `--env-module`, `--env-kwargs`, reward
thresholds and evaluation: `Line-v0` (Gymnasium; a constructor argument, no render_mode, Discrete observations,
its own reward_threshold) and, when gym 0.26 is installed, `OldLine-v0` (the same task written for gym 0.26)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Line(gym.Env):
    """Cells 0..length-1, start at 0, action 1 moves right and 0 left; reaching the last cell pays 1 and ends the
    episode; cut after 3 * length steps. Its constructor takes `length` only (no render_mode)."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)
        self._cell = self._steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cell = self._steps = 0
        return self._cell, {}

    def step(self, action):
        self._cell = int(np.clip(self._cell + (1 if action == 1 else -1), 0, self.length - 1))
        self._steps += 1
        done = self._cell == self.length - 1
        return self._cell, float(done), done, self._steps >= 3 * self.length, {}


LINE_THRESHOLD = 0.75
gym.register("Line-v0", entry_point=Line, reward_threshold=LINE_THRESHOLD)

try:
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # gym's unmaintained notice
        import gym as old_gym
except ImportError:
    old_gym = None

OLD_LINE_THRESHOLD = 0.5

if old_gym is not None:

    class OldLine(old_gym.Env):
        """A gym 0.26 environment: gym's spaces and Env, a Box observation of the position and a `length`."""

        def __init__(self, length: int = 4) -> None:
            self.length = length
            self.observation_space = old_gym.spaces.Box(0.0, 1.0, (1,), np.float32)
            self.action_space = old_gym.spaces.Discrete(2)
            self._cell = 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self._cell = 0
            return self._obs(), {}

        def step(self, action):
            self._cell = int(np.clip(self._cell + (1 if action == 1 else -1), 0, self.length - 1))
            done = self._cell == self.length - 1
            return self._obs(), float(done), done, False, {}

        def _obs(self) -> np.ndarray:
            return np.array([self._cell / (self.length - 1)], np.float32)

    old_gym.register(
        "OldLine-v0", entry_point=OldLine, max_episode_steps=20, reward_threshold=OLD_LINE_THRESHOLD
    )

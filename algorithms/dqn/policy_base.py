"""What every DQN acting policy derives from its Q-values, whichever library evaluates them: the greedy actions
and the initial priorities of n-step transitions. The numpy policy (`acting.NumpyDuelingPolicy`) and the torch one
(`torch_policy.TorchDuelingPolicy`) both derive from `QPolicy`, so neither half imports the other. No torch here:
an actor of vector environments loads this module.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class QPolicy:
    """Greedy actions and initial priorities from `q_values`, which subclasses provide."""

    num_actions: int

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for a batch of observations as the environment gives them."""
        raise NotImplementedError

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=1).astype(np.int64)

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|reward + discount * max_a Q(next_obs, a) - Q(obs, action)|: the double-Q target with this one network
        as online and target network (argmax then the same net: its max)."""
        obs, next_obs = np.asarray(columns["obs"]), np.asarray(columns["next_obs"])
        q = self.q_values(np.concatenate([obs, next_obs]))  # one forward pass for both
        rows = np.arange(len(obs))
        taken = q[rows, np.asarray(columns["action"])]
        target = columns["reward"] + columns["discount"] * q[len(obs) :].max(axis=1)
        return np.abs(target - taken).astype(np.float64)

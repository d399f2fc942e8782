"""What every DPG acting policy derives from its policy and critic, whichever library evaluates them: the initial
priorities of n-step transitions, and actions moved between the environment's bounds and [-1, 1]. The numpy
policy (`acting.NumpyDPGPolicy`) and the torch one (`torch_policy.TorchDPGPolicy`) both derive from `DPGPolicy`,
so neither half imports the other. No torch here: an actor of vector environments loads this module.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class DPGPolicy:
    """pi(s) and Q(s, a) from the weights; subclasses provide `greedy` and `q`. `low`/`high` are the bounds the
    weights carry (float64 [action_dim])."""

    low: np.ndarray
    high: np.ndarray

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def q(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Q(s, a) [batch] for actions in the environment's units."""
        raise NotImplementedError

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|reward + discount * Q(next_obs, pi(next_obs)) - Q(obs, action)| at the stored action, this copy standing
        in for the online and the target networks."""
        obs, next_obs = np.asarray(columns["obs"]), np.asarray(columns["next_obs"])
        both = np.concatenate([obs, next_obs])
        actions = np.concatenate([np.asarray(columns["action"], np.float32), self.greedy(next_obs)])
        q = self.q(both, actions)
        target = columns["reward"] + columns["discount"] * q[len(obs) :]
        return np.abs(target - q[: len(obs)]).astype(np.float64)

    def _unit(self, action: np.ndarray) -> np.ndarray:
        return ((np.asarray(action, np.float32) - self.low) / (self.high - self.low) * 2.0 - 1.0).astype(
            np.float32
        )

    def _squash(self, x: np.ndarray) -> np.ndarray:
        return (self.low + (np.tanh(x) + 1.0) * 0.5 * (self.high - self.low)).astype(np.float32)

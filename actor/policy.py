"""The actor's copy of the Q-network, evaluated with numpy.

Actors only run forward passes on a few observations at a time, where numpy is several times cheaper per call than
torch; this keeps actors torch-free (small images, fast start) and leaves the CPU to environments and the learner.
The weights are the learner's `DuelingQNetwork` state dict as published by the parameter service; a test checks
that this forward pass matches the torch module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np


class NumpyDuelingPolicy:
    """Q(s, .) of a DuelingQNetwork (ReLU MLP torso, value and advantage heads) from its named weights."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        layer_ids = sorted({int(m.group(1)) for name in weights if (m := re.fullmatch(r"torso\.(\d+)\.weight", name))})
        try:
            self._torso = [(np.asarray(weights[f"torso.{i}.weight"], np.float32).T.copy(),
                            np.asarray(weights[f"torso.{i}.bias"], np.float32)) for i in layer_ids]
            self._value = (np.asarray(weights["value.weight"], np.float32).T.copy(),
                           np.asarray(weights["value.bias"], np.float32))
            self._advantage = (np.asarray(weights["advantage.weight"], np.float32).T.copy(),
                               np.asarray(weights["advantage.bias"], np.float32))
        except KeyError as err:
            raise ValueError(f"weights are not a DuelingQNetwork state dict: missing {err}") from None
        if not self._torso:
            raise ValueError("weights are not a DuelingQNetwork state dict: no torso layers")
        self.obs_dim = self._torso[0][0].shape[0]
        self.num_actions = self._advantage[0].shape[1]

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for observations [batch, obs_dim]."""
        h = np.asarray(obs, dtype=np.float32)
        for w, b in self._torso:
            h = np.maximum(h @ w + b, 0.0)
        value = h @ self._value[0] + self._value[1]
        advantage = h @ self._advantage[0] + self._advantage[1]
        return value + advantage - advantage.mean(axis=1, keepdims=True)

    def td_error_abs(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|reward + discount * Q(next_obs, argmax Q(next_obs)) - Q(obs, action)| with this one network standing in
        for both online and target networks: the actor's initial priorities (Ape-X)."""
        rows = np.arange(len(columns["action"]))
        q = self.q_values(columns["obs"])[rows, columns["action"]]
        next_q = self.q_values(columns["next_obs"]).max(axis=1)  # argmax then the same net: its max
        target = columns["reward"] + columns["discount"] * next_q
        return np.abs(target - q).astype(np.float64)

"""The actor's copy of the Q-network, rebuilt from the published weights alone.

`make_policy` picks how to evaluate it: an MLP (the learner's `DuelingQNetwork`) with numpy, since actors run
forward passes on a few observations at a time, where numpy is several times cheaper per call than torch, and an
actor playing vector environments then never imports torch (fast start, CPU left to environments and the
learner); a convolutional network (`ConvDuelingQNetwork`, its weights have `conv.*` names) with torch
(`apexrl.actor.torch_policy`), batched over the actor's environments. Tests check both against the learner's
modules on the same weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from apexrl.common.environments import EnvSpaces


class Policy(Protocol):
    """What the actor asks of its network."""

    num_actions: int

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for a batch of observations as the environment gives them."""
        ...

    def td_error_abs(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """The initial priorities of a batch of n-step transitions (see NumpyDuelingPolicy.td_error_abs)."""
        ...


def is_convolutional(weights: Mapping[str, np.ndarray]) -> bool:
    return any(re.fullmatch(r"conv\.\d+\.weight", name) for name in weights)


def make_policy(weights: Mapping[str, np.ndarray], spaces: EnvSpaces, torch_threads: int = 1) -> Policy:
    """The policy of these weights for observations of `spaces`: numpy for an MLP, torch (with `torch_threads`
    CPU threads: actors share the machine's cores) for a convolutional network."""
    if not is_convolutional(weights):
        return NumpyDuelingPolicy(weights, input_scale=spaces.input_scale)
    import torch

    from apexrl.actor.torch_policy import TorchDuelingPolicy

    torch.set_num_threads(torch_threads)
    return TorchDuelingPolicy(weights, layout=spaces.layout, input_scale=spaces.input_scale)


class NumpyDuelingPolicy:
    """Q(s, .) of a DuelingQNetwork (ReLU MLP torso, value and advantage heads) from its named weights.
    Observations are flattened and multiplied by `input_scale` (1/255 for uint8 pixels), as the network does."""

    def __init__(self, weights: Mapping[str, np.ndarray], input_scale: float = 1.0) -> None:
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
        if is_convolutional(weights):
            raise ValueError("weights of a convolutional network: use make_policy (torch)")
        self.obs_dim = self._torso[0][0].shape[0]
        self.num_actions = self._advantage[0].shape[1]
        self.input_scale = float(input_scale)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for observations [batch, obs_dim] (or [batch, *obs_shape])."""
        h = np.asarray(obs, dtype=np.float32)
        if h.ndim != 2:
            h = h.reshape(len(h), -1)
        if self.input_scale != 1.0:
            h = h * np.float32(self.input_scale)
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

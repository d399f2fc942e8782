"""The actor's Q-network evaluated with torch: convolutional networks, batched over the actor's environments.

Built from the published weights alone, as `NumpyDuelingPolicy` is: the convolutions from `conv.N.weight`/`bias`
and `conv_strides` (a ReLU after each, no padding), the fully connected `torso.N` layers, and the dueling head
`value`/`advantage`: Q = V + A - mean A. It mirrors `apexrl.learner.networks.ConvDuelingQNetwork` (and, given MLP
weights, `DuelingQNetwork`) without importing the learner; a test checks them equal on the same weights.
Imported only when an actor meets convolutional weights, so actors of vector environments never load torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.common.environments import CHW, HW, HWC, VECTOR

_Layer = tuple[torch.Tensor, torch.Tensor]


class TorchDuelingPolicy:
    """Q(s, .) of a (convolutional) dueling Q-network from its named weights, on the CPU without gradients.

    `layout` is where the channel axis of an observation is (CHW, HWC, HW; VECTOR for an MLP), `input_scale`
    the factor applied after casting to float32 (1/255 for uint8 pixels).
    """

    def __init__(self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0) -> None:
        def tensor(name: str) -> torch.Tensor:
            return torch.from_numpy(np.array(weights[name], dtype=np.float32))  # a copy: weights may be reused

        def layers(prefix: str) -> list[_Layer]:
            ids = sorted(int(m.group(1)) for name in weights
                         if (m := re.fullmatch(rf"{prefix}\.(\d+)\.weight", name)))
            return [(tensor(f"{prefix}.{i}.weight"), tensor(f"{prefix}.{i}.bias")) for i in ids]

        try:
            self._conv = layers("conv")
            self._torso = layers("torso")
            self._value = (tensor("value.weight"), tensor("value.bias"))
            self._advantage = (tensor("advantage.weight"), tensor("advantage.bias"))
            strides = [int(s) for s in np.asarray(weights["conv_strides"]).reshape(-1)] if self._conv else []
        except KeyError as err:
            raise ValueError(f"weights are not a dueling Q-network state dict: missing {err}") from None
        if len(strides) != len(self._conv):
            raise ValueError(f"conv_strides has {len(strides)} strides for {len(self._conv)} convolutions")
        if not self._torso:
            raise ValueError("weights are not a dueling Q-network state dict: no torso layers")
        if self._conv and layout == VECTOR:
            raise ValueError("a convolutional network cannot read vector observations")
        self._strides = strides
        self.layout = layout
        self.input_scale = float(input_scale)
        self.num_actions = int(self._advantage[0].shape[0])

    @torch.no_grad()
    def _q(self, obs: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(obs)).to(torch.float32)
        if self._conv:
            if self.layout == HWC:
                x = x.permute(0, 3, 1, 2)
            elif self.layout == HW:
                x = x.unsqueeze(1)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        for (w, b), stride in zip(self._conv, self._strides, strict=True):
            x = F.relu(F.conv2d(x, w, b, stride=stride))
        x = x.flatten(1)
        for w, b in self._torso:
            x = F.relu(F.linear(x, w, b))
        value, advantage = F.linear(x, *self._value), F.linear(x, *self._advantage)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for a batch of observations as the environment gives them."""
        return self._q(np.asarray(obs)).numpy()

    def td_error_abs(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|reward + discount * max_a Q(next_obs, a) - Q(obs, action)| with this one network as online and target
        network (as NumpyDuelingPolicy.td_error_abs), obs and next_obs in one batched forward pass."""
        obs = np.asarray(columns["obs"])
        q = self._q(np.concatenate([obs, np.asarray(columns["next_obs"])])).numpy()
        rows = np.arange(len(obs))
        taken = q[rows, np.asarray(columns["action"])]
        target = columns["reward"] + columns["discount"] * q[len(obs):].max(axis=1)
        return np.abs(target - taken).astype(np.float64)

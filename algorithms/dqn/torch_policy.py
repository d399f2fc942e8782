"""The actor's Q-network evaluated with torch: convolutional networks, batched over the actor's environments.

Built from the published weights alone, as `NumpyDuelingPolicy` is: the convolutions from `conv.N.weight`/`bias`
and `conv_strides` (a ReLU after each, no padding), the fully connected `torso.N` layers, and the dueling head
`value`/`advantage`: Q = V + A - mean A. It mirrors `apexrl.algorithms.dqn.networks.ConvDuelingQNetwork` (and,
given MLP weights, `DuelingQNetwork`) without importing it; a test checks them equal on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.algorithms.dqn.acting import QPolicy
from apexrl.algorithms.torch_forward import ConvTorso, layers, relu_stack, tensor
from apexrl.common.spaces import CHW


class TorchDuelingPolicy(QPolicy):
    """Q(s, .) of a (convolutional) dueling Q-network from its named weights, on the CPU without gradients.

    `layout` is where the channel axis of an observation is (CHW, HWC, HW; VECTOR for an MLP), `input_scale`
    the factor applied after casting to float32 (1/255 for uint8 pixels).
    """

    def __init__(self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0) -> None:
        try:
            self._conv = ConvTorso(weights, "", layout, input_scale)
            self._torso = layers(weights, "torso")
            self._value = (tensor(weights, "value.weight"), tensor(weights, "value.bias"))
            self._advantage = (tensor(weights, "advantage.weight"), tensor(weights, "advantage.bias"))
        except KeyError as err:
            raise ValueError(f"weights are not a dueling Q-network state dict: missing {err}") from None
        if not self._torso:
            raise ValueError("weights are not a dueling Q-network state dict: no torso layers")
        self.layout = layout
        self.input_scale = float(input_scale)
        self.num_actions = int(self._advantage[0].shape[0])

    @torch.no_grad()
    def _q(self, obs: np.ndarray) -> torch.Tensor:
        x = relu_stack(self._conv(np.asarray(obs)), self._torso)
        value, advantage = F.linear(x, *self._value), F.linear(x, *self._advantage)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for a batch of observations as the environment gives them."""
        return self._q(obs).numpy()

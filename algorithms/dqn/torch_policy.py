"""The actor's Q-network evaluated with torch: convolutional networks, batched over the actor's environments, and
the greedy module `apexrl export` writes.

Built from the published weights alone, as `NumpyDuelingPolicy` is: the convolutions from `conv.N.weight`/`bias`
and `conv_strides` (a ReLU after each, no padding), the fully connected `torso.N` layers, and the dueling head
`value`/`advantage`: Q = V + A - mean A. It mirrors `apexrl.algorithms.dqn.networks.ConvDuelingQNetwork` (and,
given MLP weights, `DuelingQNetwork`) without importing it; a test checks them equal on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from apexrl.algorithms.dqn.policy_base import QPolicy
from apexrl.algorithms.torch_forward import ConvTorso, DenseStack, OneHot, batch_tensor, linear
from apexrl.common.spaces import CHW


class DuelingQModule(nn.Module):
    """Q(s, .) [batch, num_actions] of a (convolutional) dueling Q-network's named weights."""

    def __init__(
        self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0
    ) -> None:
        super().__init__()
        try:
            self.conv = ConvTorso(weights, "", layout, input_scale)
            self.torso = DenseStack(weights, "torso")
            self.value = linear(weights, "value")
            self.advantage = linear(weights, "advantage")
        except KeyError as err:
            raise ValueError(f"weights are not a dueling Q-network state dict: missing {err}") from None
        if not len(self.torso.layers):
            raise ValueError("weights are not a dueling Q-network state dict: no torso layers")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.torso(self.conv(obs))
        value, advantage = self.value(x), self.advantage(x)
        return value + advantage - advantage.mean(dim=1, keepdim=True)


class GreedyQ(nn.Module):
    """Observations [batch, ...] (int64 indices [batch] with `one_hot` n) -> greedy actions, int64 [batch]."""

    def __init__(self, q: DuelingQModule, one_hot: int = 0) -> None:
        super().__init__()
        self.encode = OneHot(one_hot)
        self.q = q

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.encode(obs)).argmax(dim=1)


class TorchDuelingPolicy(QPolicy):
    """Q(s, .) of a (convolutional) dueling Q-network from its named weights, on the CPU without gradients.

    `layout` is where the channel axis of an observation is (CHW, HWC, HW; VECTOR for an MLP), `input_scale`
    the factor applied after casting to float32 (1/255 for uint8 pixels).
    """

    def __init__(
        self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0
    ) -> None:
        self.net = DuelingQModule(weights, layout, input_scale)
        self.layout = layout
        self.input_scale = float(input_scale)
        self.num_actions = int(self.net.advantage.out_features)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for a batch of observations as the environment gives them."""
        with torch.no_grad():
            return self.net(batch_tensor(obs)).numpy()

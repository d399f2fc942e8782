"""The actor's DPG policy and critic evaluated with torch: convolutional networks, batched over the actor's
environments. Built from the published `policy.*` and `critic.*` weights alone; mirrors
`apexrl.algorithms.dpg.networks` (a test checks them equal on the same weights)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.algorithms.dpg.acting import DPGPolicy
from apexrl.algorithms.torch_forward import ConvTorso, layers, relu_stack, tensor
from apexrl.common.spaces import CHW


class TorchDPGPolicy(DPGPolicy):
    def __init__(self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0) -> None:
        try:
            self._policy_conv = ConvTorso(weights, "policy.", layout, input_scale)
            self._policy = layers(weights, "policy.torso")
            self._policy_out = (tensor(weights, "policy.out.weight"), tensor(weights, "policy.out.bias"))
            self._critic_conv = ConvTorso(weights, "critic.", layout, input_scale)
            self._critic = layers(weights, "critic.torso")
            self._critic_out = (tensor(weights, "critic.out.weight"), tensor(weights, "critic.out.bias"))
            self.low = np.asarray(weights["policy.action_low"], np.float64)
            self.high = np.asarray(weights["policy.action_high"], np.float64)
        except KeyError as err:
            raise ValueError(f"weights are not a DPG policy and critic: missing {err}") from None
        if not self._policy or not self._critic:
            raise ValueError("weights are not a DPG policy and critic: no torso layers")
        self.action_dim = len(self.low)

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        x = relu_stack(self._policy_conv(np.asarray(obs)), self._policy)
        return self._squash(F.linear(x, *self._policy_out).numpy())

    @torch.no_grad()
    def q(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        features = self._critic_conv(np.asarray(obs))
        x = relu_stack(torch.cat([features, torch.from_numpy(self._unit(action))], dim=1), self._critic)
        return F.linear(x, *self._critic_out)[:, 0].numpy()

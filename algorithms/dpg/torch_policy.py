"""The actor's DPG policy and critic evaluated with torch: convolutional networks, batched over the actor's
environments, and the greedy module `apexrl export` writes. Built from the published `policy.*` and `critic.*`
weights alone; mirrors `apexrl.algorithms.dpg.networks` (a test checks them equal on the same weights)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from apexrl.algorithms.dpg.policy_base import DPGPolicy
from apexrl.algorithms.torch_forward import ConvTorso, DenseStack, OneHot, batch_tensor, linear, tensor
from apexrl.common.spaces import CHW


class DPGHead(nn.Module):
    """The `PREFIX` network's torso and output layer; `forward(features)` its raw output. The policy's output is
    squashed into the bounds by its caller; the critic reads observations with the action rescaled to [-1, 1]."""

    def __init__(
        self, weights: Mapping[str, np.ndarray], prefix: str, layout: str, input_scale: float
    ) -> None:
        super().__init__()
        self.conv = ConvTorso(weights, prefix, layout, input_scale)
        self.torso = DenseStack(weights, f"{prefix}torso")
        self.out = linear(weights, f"{prefix}out")
        if not len(self.torso.layers):
            raise ValueError("weights are not a DPG policy and critic: no torso layers")


class GreedyDPG(nn.Module):
    """Observations [batch, ...] (int64 indices [batch] with `one_hot` n) -> the policy's actions, float32
    [batch, action_dim], squashed into [low, high]: low + (tanh(x) + 1) / 2 * (high - low)."""

    def __init__(self, policy: DPGHead, low: torch.Tensor, high: torch.Tensor, one_hot: int = 0) -> None:
        super().__init__()
        self.encode = OneHot(one_hot)
        self.policy = policy
        self.register_buffer("low", low.to(torch.float32))
        self.register_buffer("high", high.to(torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.policy.out(self.policy.torso(self.policy.conv(self.encode(obs))))
        return self.low + (torch.tanh(x) + 1.0) * 0.5 * (self.high - self.low)


class TorchDPGPolicy(DPGPolicy):
    def __init__(
        self, weights: Mapping[str, np.ndarray], layout: str = CHW, input_scale: float = 1.0
    ) -> None:
        try:
            self.policy = DPGHead(weights, "policy.", layout, input_scale)
            self.critic = DPGHead(weights, "critic.", layout, input_scale)
            self.low = np.asarray(weights["policy.action_low"], np.float64)
            self.high = np.asarray(weights["policy.action_high"], np.float64)
        except KeyError as err:
            raise ValueError(f"weights are not a DPG policy and critic: missing {err}") from None
        self.action_dim = len(self.low)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            p = self.policy
            return self._squash(p.out(p.torso(p.conv(batch_tensor(obs)))).numpy())

    def q(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            c = self.critic
            features = c.conv(batch_tensor(obs))
            x = c.torso(torch.cat([features, torch.from_numpy(self._unit(action))], dim=1))
            return c.out(x)[:, 0].numpy()


def greedy_module(
    weights: Mapping[str, np.ndarray], layout: str, input_scale: float, one_hot: int = 0
) -> GreedyDPG:
    """The policy of these weights as a module (`GreedyDPG`)."""
    try:
        policy = DPGHead(weights, "policy.", layout, input_scale)
        low, high = tensor(weights, "policy.action_low"), tensor(weights, "policy.action_high")
    except KeyError as err:
        raise ValueError(f"weights are not a DPG policy: missing {err}") from None
    return GreedyDPG(policy, low, high, one_hot)

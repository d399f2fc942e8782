"""R2D2's acting policy with torch: the recurrent Q-network rebuilt from the published weights alone (torch_forward's
frozen pieces and the LSTM cell's gates), on the CPU without gradients, for convolutional torsos, and the greedy
module `apexrl export` writes (any torso). Imported only when an actor meets convolutional weights or a policy is
exported, so actors of vector environments never load torch; it never imports the learner's network either
(algorithms/r2d2/networks.py is the learning half's).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from apexrl.algorithms.torch_forward import ConvTorso, DenseStack, OneHot, linear, tensor


class RecurrentQModule(nn.Module):
    """One step of a RecurrentQNetwork's named weights for a batch: (Q-values [B, A], h, c) from the observations,
    the LSTM's (h, c) [B, core] and the previous action (int64 [B]) and reward (float32 [B])."""

    def __init__(self, weights: Mapping[str, np.ndarray], layout: str, input_scale: float) -> None:
        super().__init__()
        try:
            self.conv = ConvTorso(weights, "", layout, input_scale)
            self.torso = DenseStack(weights, "torso")
            self.register_buffer("w_ih", tensor(weights, "core.weight_ih"))
            self.register_buffer("w_hh", tensor(weights, "core.weight_hh"))
            self.register_buffer("bias", tensor(weights, "core.bias_ih") + tensor(weights, "core.bias_hh"))
            self.value, self.advantage = linear(weights, "value"), linear(weights, "advantage")
        except KeyError as err:
            raise ValueError(f"weights are not a RecurrentQNetwork state dict: missing {err}") from None
        self.num_actions = int(self.advantage.out_features)
        self.core_size = int(self.w_hh.shape[1])

    def forward(
        self,
        obs: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor,
        prev_action: torch.Tensor,
        prev_reward: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.torso(self.conv(obs))
        one_hot = F.one_hot(prev_action.to(torch.int64), self.num_actions).to(torch.float32)
        x = torch.cat([features, one_hot, prev_reward.to(torch.float32).unsqueeze(1)], dim=1)
        i, f, g, o = (x @ self.w_ih.T + h @ self.w_hh.T + self.bias).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        value, advantage = self.value(h), self.advantage(h)
        return value + advantage - advantage.mean(dim=1, keepdim=True), h, c


class GreedyRecurrent(nn.Module):
    """The recurrent greedy module `apexrl export` writes, for a batch: (observations [B, ...] (int64 indices [B]
    with `one_hot` n), state float32 [B, 2, core] (h and c stacked, as replay items store it), previous action int64
    [B], previous reward float32 [B]) -> (greedy actions int64 [B], next state [B, 2, core]). `state_shape` is one
    environment's state, [2, core]: torch_forward.RecurrentOneOrBatch reads it."""

    def __init__(self, q: RecurrentQModule, one_hot: int = 0) -> None:
        super().__init__()
        self.encode = OneHot(one_hot)
        self.q = q
        self.state_shape = (2, q.core_size)

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, h, c = self.q(self.encode(obs), state[:, 0], state[:, 1], prev_action, prev_reward)
        return q.argmax(dim=1), torch.stack([h, c], dim=1)


class TorchRecurrentPolicy:
    """Q(s_t, .) and the next LSTM state of a RecurrentQNetwork from its named weights (acting.NumpyRecurrentPolicy's
    twin for images)."""

    def __init__(self, weights: Mapping[str, np.ndarray], layout: str, input_scale: float) -> None:
        self.net = RecurrentQModule(weights, layout, input_scale)
        self.num_actions = self.net.num_actions
        self.core_size = self.net.core_size

    @torch.no_grad()
    def step(self, obs: np.ndarray, state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Q-values [B, A], h, c) after one step of a batch of observations from `state` (acting.CoreState)."""
        q, h, c = self.net(
            torch.as_tensor(np.asarray(obs)),
            torch.as_tensor(state.h),
            torch.as_tensor(state.c),
            torch.as_tensor(state.prev_action),
            torch.as_tensor(state.prev_reward, dtype=torch.float32),
        )
        return q.numpy(), h.numpy(), c.numpy()

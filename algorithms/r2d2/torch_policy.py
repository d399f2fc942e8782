"""R2D2's acting policy for convolutional torsos, with torch: the recurrent Q-network rebuilt from the published
weights alone (torch_forward's frozen pieces and the LSTM cell's gates), on the CPU without gradients. Imported only
when an actor meets convolutional weights, so actors of vector environments never load torch; it never imports
the learner's network either (algorithms/r2d2/networks.py is the learning half's)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.algorithms.torch_forward import ConvTorso, DenseStack, linear, tensor


class TorchRecurrentPolicy:
    """Q(s_t, .) and the next LSTM state of a RecurrentQNetwork from its named weights (acting.NumpyRecurrentPolicy's
    twin for images)."""

    def __init__(self, weights: Mapping[str, np.ndarray], layout: str, input_scale: float) -> None:
        self._conv = ConvTorso(weights, "", layout, input_scale)
        self._torso = DenseStack(weights, "torso")
        self._w_ih, self._w_hh = tensor(weights, "core.weight_ih"), tensor(weights, "core.weight_hh")
        self._bias = tensor(weights, "core.bias_ih") + tensor(weights, "core.bias_hh")
        self._value, self._advantage = linear(weights, "value"), linear(weights, "advantage")
        self.num_actions = self._advantage.out_features
        self.core_size = self._w_hh.shape[1]

    @torch.no_grad()
    def step(self, obs: np.ndarray, state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Q-values [B, A], h, c) after one step of a batch of observations from `state` (acting.CoreState)."""
        features = self._torso(self._conv(torch.as_tensor(np.asarray(obs))))
        one_hot = F.one_hot(torch.as_tensor(state.prev_action), self.num_actions).to(torch.float32)
        reward = torch.as_tensor(state.prev_reward, dtype=torch.float32).unsqueeze(1)
        x = torch.cat([features, one_hot, reward], dim=1)
        h, c = torch.as_tensor(state.h), torch.as_tensor(state.c)
        i, f, g, o = (x @ self._w_ih.T + h @ self._w_hh.T + self._bias).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        value, advantage = self._value(h), self._advantage(h)
        q = value + advantage - advantage.mean(dim=1, keepdim=True)
        return q.numpy(), h.numpy(), c.numpy()

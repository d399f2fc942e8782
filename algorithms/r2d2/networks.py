"""R2D2's recurrent Q-network (Kapturowski et al., 2019): a torso (an MLP or the convolutions every algorithm shares),
an LSTM core fed the torso's features with the previous action (one-hot) and the previous reward, and a dueling
head on the core's output.

State names (published as they are; actors rebuild the forward pass from them, `apexrl.algorithms.r2d2.acting`):
`torso.N` / `conv.N` and `conv_strides` as in DQN's networks, `core.weight_ih`, `core.weight_hh`, `core.bias_ih`,
`core.bias_hh` (an LSTMCell: gates i, f, g, o), then `value` and `advantage`. The recurrent state is (h, c), each
[batch, core_size]; actors store it stacked as one item field `state` [2, core_size] at each window's first step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from apexrl.algorithms.dqn.networks import dueling_q
from apexrl.algorithms.r2d2.defaults import DEFAULT_CORE_SIZE, DEFAULT_HIDDEN
from apexrl.algorithms.torso_specs import CONV_LAYERS, resolve_network
from apexrl.algorithms.torsos import check_image_layout, conv_stack, images_as_float, mlp, vectors_as_float
from apexrl.common.spaces import EnvSpaces

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each [batch, core_size]


class RecurrentQNetwork(nn.Module):
    """Q(s_t, .) from the observation, the previous action and reward, and the LSTM state carried along."""

    def __init__(
        self,
        spaces: EnvSpaces,
        network: str = "auto",
        hidden_sizes: Sequence[int] | None = None,
        core_size: int | None = None,
    ) -> None:
        super().__init__()
        kind = resolve_network(network, spaces)
        hidden = tuple(hidden_sizes) if hidden_sizes is not None else DEFAULT_HIDDEN[kind]
        self.kind = kind
        self.num_actions = spaces.num_actions
        self.input_scale = float(spaces.input_scale)
        self.core_size = core_size or DEFAULT_CORE_SIZE[kind]
        if kind == "mlp":
            self.conv = None
            self.torso, width = mlp(spaces.obs_dim, hidden)
        else:
            self.layout = check_image_layout(spaces.layout)
            self.conv, strides, flat = conv_stack(spaces.image_shape, CONV_LAYERS[kind])
            self.register_buffer("conv_strides", strides)
            self.torso, width = mlp(flat, hidden)
        self.core = nn.LSTMCell(width + self.num_actions + 1, self.core_size)
        self.value = nn.Linear(self.core_size, 1)
        self.advantage = nn.Linear(self.core_size, self.num_actions)

    def initial_state(self, batch: int, device: torch.device | None = None) -> State:
        zeros = torch.zeros(batch, self.core_size, device=device)
        return zeros, zeros.clone()

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The torso's output [N, width] for N observations."""
        if self.conv is None:
            return self.torso(vectors_as_float(obs, self.input_scale))
        return self.torso(self.conv(images_as_float(obs, self.layout, self.input_scale)).flatten(1))

    def core_inputs(
        self, obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> torch.Tensor:
        """The core's inputs for N steps: features, the previous action one-hot, the previous reward."""
        one_hot = nn.functional.one_hot(prev_action.long(), self.num_actions).to(torch.float32)
        return torch.cat([self.features(obs), one_hot, prev_reward.to(torch.float32).unsqueeze(-1)], dim=-1)

    def unroll(
        self,
        obs: torch.Tensor,
        prev_action: torch.Tensor,
        prev_reward: torch.Tensor,
        state: State,
        burn_in: int = 0,
        stop_gradient: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, State]:
        """Q-values [B, T, A] over T steps ([B, T, ...] inputs) from `state`, and the state after them. With
        `burn_in` and `stop_gradient` (bool [B]), the state of those items is detached after the first `burn_in`
        steps: their loss does not reach back into the burn-in (R2D2's burn-in)."""
        batch, steps = prev_action.shape[:2]
        inputs = self.core_inputs(obs.flatten(0, 1), prev_action.flatten(0, 1), prev_reward.flatten(0, 1))
        inputs = inputs.view(batch, steps, -1)
        h, c = state
        outputs = []
        for t in range(steps):
            if t == burn_in and stop_gradient is not None:
                keep = stop_gradient.unsqueeze(1)
                h, c = torch.where(keep, h.detach(), h), torch.where(keep, c.detach(), c)
            h, c = self.core(inputs[:, t], (h, c))
            outputs.append(h)
        core = torch.stack(outputs, dim=1)
        return dueling_q(self.value(core), self.advantage(core)), (h, c)

    def forward(self, obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor, state: State):
        """One step for a batch: Q-values [B, A] and the next state."""
        q, state = self.unroll(obs.unsqueeze(1), prev_action.unsqueeze(1), prev_reward.unsqueeze(1), state)
        return q[:, 0], state

"""R2D2's recurrent Q-network (Kapturowski et al., 2019): a torso (an MLP or the convolutions every algorithm shares),
an LSTM core fed the torso's features with the previous action (one-hot) and the previous reward, and a dueling
head on the core's output.

State names (published as they are; actors rebuild the forward pass from them, `apexrl.algorithms.r2d2.acting`):
`torso.N` / `conv.N` and `conv_strides` as in DQN's networks, `core.weight_ih`, `core.weight_hh`, `core.bias_ih`,
`core.bias_hh` (an LSTMCell: gates i, f, g, o), then `value` and `advantage`. The recurrent state is (h, c), each
[batch, core_size]; actors store it stacked as one item field `state` [2, core_size] at each window's first step.

The learner runs the cell over a whole sequence with torch's LSTM kernel on the cell's own weights, and a stopped
burn-in without autograd (`fused_core`): the same values and loss gradients as stepping the cell from Python
(`stepwise_core`, kept as the reference the tests hold it to), an update about 1.8x cheaper on one CPU thread
(bench/r2d2_update.py). The parameters keep the cell's names, so checkpoints and published weights are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from apexrl.algorithms.dqn.networks import dueling_q
from apexrl.algorithms.r2d2.defaults import DEFAULT_CORE_SIZE, DEFAULT_HIDDEN
from apexrl.algorithms.torso_specs import CONV_LAYERS, resolve_network
from apexrl.algorithms.torsos import check_image_layout, conv_stack, images_as_float, mlp, vectors_as_float
from apexrl.common.spaces import EnvSpaces

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each [batch, core_size]
CoreUnroll = Callable[
    [nn.LSTMCell, torch.Tensor, State, int, "torch.Tensor | None"], tuple[torch.Tensor, State]
]


def lstm_sequence(cell: nn.LSTMCell, inputs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
    """The cell over inputs [B, T, I] in one call of torch's LSTM kernel (the cell's weights, gates i, f, g, o as
    nn.LSTM's): its outputs h [B, T, H] and the last state."""
    h, c = state
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    # torch.lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    outputs, h, c = torch.lstm(
        inputs, (h.unsqueeze(0), c.unsqueeze(0)), weights, True, 1, 0.0, cell.training, False, True
    )
    return outputs, (h[0], c[0])


def fused_core(
    cell: nn.LSTMCell, inputs: torch.Tensor, state: State, burn_in: int, stop_gradient: torch.Tensor | None
) -> tuple[torch.Tensor, State]:
    """The cell's outputs [B, T, H] over inputs [B, T, I] from `state`, and the last state; the items where
    `stop_gradient` (bool [B]) holds have their state detached after `burn_in` steps. A window never holds two
    episodes (the writer ends it at an episode's end), so nothing resets the state inside it.

    With the gradient stopped, the burn-in runs without autograd for every item (its backward would only carry
    zeros) and again with it for the few items whose loss reaches into it (those starting an episode)."""
    if stop_gradient is None or burn_in >= inputs.shape[1] or not torch.is_grad_enabled():
        return lstm_sequence(cell, inputs, state)
    if burn_in == 0:  # no burn-in: the stored state itself is what those items' loss stops at
        keep = stop_gradient.unsqueeze(1)
        return lstm_sequence(
            cell,
            inputs,
            (torch.where(keep, state[0].detach(), state[0]), torch.where(keep, state[1].detach(), state[1])),
        )
    with torch.no_grad():
        head, (h, c) = lstm_sequence(cell, inputs[:, :burn_in], state)
    through = (~stop_gradient).nonzero().squeeze(1)
    if through.numel():
        rows = (state[0].index_select(0, through), state[1].index_select(0, through))
        head_through, (h_through, c_through) = lstm_sequence(
            cell, inputs.index_select(0, through)[:, :burn_in], rows
        )
        head = head.index_copy(0, through, head_through)
        h, c = h.index_copy(0, through, h_through), c.index_copy(0, through, c_through)
    tail, state = lstm_sequence(cell, inputs[:, burn_in:], (h, c))
    return torch.cat([head, tail], dim=1), state


def stepwise_core(
    cell: nn.LSTMCell, inputs: torch.Tensor, state: State, burn_in: int, stop_gradient: torch.Tensor | None
) -> tuple[torch.Tensor, State]:
    """`fused_core` by stepping the cell one step at a time: the reference it is tested against (the same values;
    here the burn-in's outputs keep their gradient, which the loss masks)."""
    h, c = state
    outputs = []
    for t in range(inputs.shape[1]):
        if t == burn_in and stop_gradient is not None:
            keep = stop_gradient.unsqueeze(1)
            h, c = torch.where(keep, h.detach(), h), torch.where(keep, c.detach(), c)
        h, c = cell(inputs[:, t], (h, c))
        outputs.append(h)
    return torch.stack(outputs, dim=1), (h, c)


class RecurrentQNetwork(nn.Module):
    """Q(s_t, .) from the observation, the previous action and reward, and the LSTM state carried along."""

    core_unroll: CoreUnroll = staticmethod(fused_core)  # stepwise_core: the reference (tests, bench)

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
        steps: their loss does not reach back into the burn-in (R2D2's burn-in), and their Q-values of the burn-in
        steps carry no gradient (the loss trains none of them)."""
        batch, steps = prev_action.shape[:2]
        inputs = self.core_inputs(obs.flatten(0, 1), prev_action.flatten(0, 1), prev_reward.flatten(0, 1))
        inputs = inputs.view(batch, steps, -1)
        core, state = self.core_unroll(self.core, inputs, state, burn_in, stop_gradient)
        return dueling_q(self.value(core), self.advantage(core)), state

    def forward(self, obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor, state: State):
        """One step for a batch: Q-values [B, A] and the next state."""
        q, state = self.unroll(obs.unsqueeze(1), prev_action.unsqueeze(1), prev_reward.unsqueeze(1), state)
        return q[:, 0], state

"""Ape-X DQN's Q-networks: a dueling head (Wang et al., 2016) on an MLP or a convolutional torso.

State names (what the learner publishes and actors rebuild from, `apexrl.algorithms.dqn.acting`): `conv.0`,
`conv.2`, ... and `conv_strides` for a convolutional torso, `torso.0`, `torso.2`, ... for the fully connected
layers, then `value` and `advantage`: Q = V + A - mean A.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from apexrl.algorithms.torso_specs import CONV_LAYERS, resolve_network
from apexrl.algorithms.torsos import check_image_layout, conv_stack, images_as_float, mlp, vectors_as_float
from apexrl.common.spaces import CHW, EnvSpaces

# Fully connected layers between the torso and the dueling head when --hidden-sizes is not given.
DEFAULT_HIDDEN: dict[str, tuple[int, ...]] = {"mlp": (256, 256), "nature": (512,), "minatar": (128,)}
DEFAULT_HIDDEN_SIZES: tuple[int, ...] = DEFAULT_HIDDEN["mlp"]
# Adam's learning rate when --learning-rate is not given. The MLP's 2e-3 reached CartPole-v1's target in ~0.5x the
# env steps of 1e-3 (bench/tune_cartpole.py, seeds 0-5) and still solves Acrobot-v1; the convolutional networks
# keep the 1e-3 their MinAtar runs were measured with.
DEFAULT_LEARNING_RATE: dict[str, float] = {"mlp": 2e-3, "nature": 1e-3, "minatar": 1e-3}


def build_network(name: str, spaces: EnvSpaces, hidden_sizes: Sequence[int] | None = None) -> nn.Module:
    """The dueling Q-network on torso `name` (see `resolve_network`) for these spaces; `hidden_sizes` None: the
    torso's default (DEFAULT_HIDDEN)."""
    kind = resolve_network(name, spaces)
    hidden = tuple(hidden_sizes) if hidden_sizes is not None else DEFAULT_HIDDEN[kind]
    if kind == "mlp":
        return DuelingQNetwork(spaces.obs_dim, spaces.num_actions, hidden, input_scale=spaces.input_scale)
    return ConvDuelingQNetwork(
        spaces.image_shape,
        spaces.num_actions,
        CONV_LAYERS[kind],
        hidden,
        layout=spaces.layout,
        input_scale=spaces.input_scale,
    )


def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a' A: subtracting the mean advantage makes V and A identifiable."""
    return value + advantage - advantage.mean(dim=-1, keepdim=True)


class DuelingQNetwork(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') on a shared ReLU MLP torso.

    Observations of any shape are flattened; `input_scale` multiplies them (1/255 for uint8 pixels).
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES,
        input_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim ({obs_dim}) must be a positive integer")
        if num_actions < 1:
            raise ValueError(f"num_actions ({num_actions}) must be a positive integer")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.input_scale = float(input_scale)
        self.torso, width = mlp(obs_dim, hidden_sizes)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape `[batch, num_actions]`, for observations of shape `[batch, obs_dim]` (or `[batch,
        *obs_shape]`, flattened here) of any dtype."""
        features = self.torso(vectors_as_float(obs, self.input_scale))
        return dueling_q(self.value(features), self.advantage(features))


class ConvDuelingQNetwork(nn.Module):
    """A convolutional torso (ReLU after every convolution), fully connected layers, and the dueling head.

    `conv_strides` (int64, one per convolution) is part of the state: with the weights' shapes it makes the
    published weights describe the whole network. `layout` says where the channel axis of an observation is (CHW,
    HWC, or HW for none); the network moves it first and multiplies by `input_scale` after casting to float32.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_actions: int,
        conv_layers: Sequence[tuple[int, int, int]],
        hidden_sizes: Sequence[int],
        layout: str = CHW,
        input_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"num_actions ({num_actions}) must be positive")
        self.layout = check_image_layout(layout)
        self.conv, strides, flat = conv_stack(image_shape, conv_layers)
        self.register_buffer("conv_strides", strides)
        self.image_shape = tuple(image_shape)
        self.num_actions = num_actions
        self.input_scale = float(input_scale)
        self.torso, width = mlp(flat, hidden_sizes)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values `[batch, num_actions]` for a batch of images in this network's layout, of any dtype."""
        x = images_as_float(obs, self.layout, self.input_scale)
        features = self.torso(self.conv(x).flatten(1))
        return dueling_q(self.value(features), self.advantage(features))

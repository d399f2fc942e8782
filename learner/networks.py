"""The Q-networks (a dueling head on an MLP or a convolutional torso) and their language-neutral weight format.

The parameter service moves weights as a flat mapping `name -> numpy array` (never pickle): the learner publishes
`state_dict_to_numpy(net)`, and actors rebuild the same forward pass from those names and shapes alone
(`apexrl.actor.policy`: numpy for the MLP, torch for convolutions), so they need no learner code.

Which network (`build_network`): `mlp` for vector observations, `nature` (Mnih et al., 2015: 32 8x8/4, 64 4x4/2,
64 3x3/1, then 512 units) for images of 36x36 and up such as Atari's 4x84x84 frame stacks, `minatar` (Young and
Tian, 2019: 16 3x3/1, then 128 units) for small images such as MinAtar's 10x10xC. Images are read in their own
layout (`apexrl.common.environments.image_layout`: channels first, last or absent) and uint8 pixels are scaled
by 1/255 inside the network, so replay keeps one byte per pixel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from apexrl.common.environments import CHW, HW, HWC, VECTOR, EnvSpaces
from apexrl.learner.config import NETWORKS

# Convolutions of each convolutional torso: (out_channels, kernel, stride), each followed by a ReLU, no padding.
CONV_LAYERS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "nature": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
    "minatar": ((16, 3, 1),),
}
# Fully connected layers between the torso and the dueling head when --hidden-sizes is not given.
DEFAULT_HIDDEN: dict[str, tuple[int, ...]] = {"mlp": (256, 256), "nature": (512,), "minatar": (128,)}
DEFAULT_HIDDEN_SIZES: tuple[int, ...] = DEFAULT_HIDDEN["mlp"]
# Adam's learning rate when --learning-rate is not given. The MLP's 2e-3 reached CartPole-v1's target in ~0.5x the
# env steps of 1e-3 (bench/tune_cartpole.py, seeds 0-5) and still solves Acrobot-v1; the convolutional networks
# keep the 1e-3 their MinAtar runs were measured with.
DEFAULT_LEARNING_RATE: dict[str, float] = {"mlp": 2e-3, "nature": 1e-3, "minatar": 1e-3}


def resolve_network(name: str, spaces: EnvSpaces) -> str:
    """The torso `name` stands for on these observations ("auto" chosen from their shape); ValueError when the
    torso cannot read them (a convolution over a vector, Nature's over an image smaller than 36x36)."""
    if name not in NETWORKS:
        raise ValueError(f"network ({name!r}) must be one of {', '.join(NETWORKS)}")
    layout = spaces.layout
    if name == "auto":
        if layout == VECTOR:
            return "mlp"
        return "nature" if _conv_output_size(CONV_LAYERS["nature"], spaces.image_shape[1:]) else "minatar"
    if name != "mlp":
        if layout == VECTOR:
            raise ValueError(f"network {name} needs image observations, got a vector of shape {spaces.obs_shape}")
        if not _conv_output_size(CONV_LAYERS[name], spaces.image_shape[1:]):
            raise ValueError(f"network {name} cannot read images of {spaces.image_shape[1]}x"
                             f"{spaces.image_shape[2]} (too small for its convolutions): use minatar or mlp")
    return name


def build_network(name: str, spaces: EnvSpaces, hidden_sizes: Sequence[int] | None = None) -> nn.Module:
    """The dueling Q-network `name` (see `resolve_network`) for these spaces; `hidden_sizes` None: the torso's
    default (DEFAULT_HIDDEN)."""
    kind = resolve_network(name, spaces)
    hidden = tuple(hidden_sizes) if hidden_sizes is not None else DEFAULT_HIDDEN[kind]
    if kind == "mlp":
        return DuelingQNetwork(spaces.obs_dim, spaces.num_actions, hidden, input_scale=spaces.input_scale)
    return ConvDuelingQNetwork(spaces.image_shape, spaces.num_actions, CONV_LAYERS[kind], hidden,
                               layout=spaces.layout, input_scale=spaces.input_scale)


def _mlp(width: int, hidden_sizes: Sequence[int]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU layers (state names 0, 2, 4, ...) and the width they end with."""
    layers: list[nn.Module] = []
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers), width


def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a' A: subtracting the mean advantage makes V and A identifiable."""
    return value + advantage - advantage.mean(dim=-1, keepdim=True)


def _conv_output_size(layers: Sequence[tuple[int, int, int]], hw: Sequence[int]) -> int:
    """Numbers the convolutions put out for an image of height and width `hw` (0 when it is too small)."""
    h, w = hw
    for _, kernel, stride in layers:
        if h < kernel or w < kernel:
            return 0
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    return layers[-1][0] * h * w


class DuelingQNetwork(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') on a shared ReLU MLP torso (Wang et al., 2016).

    Observations of any shape are flattened; `input_scale` multiplies them (1/255 for uint8 pixels).
    """

    def __init__(
        self, obs_dim: int, num_actions: int, hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES,
        input_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim ({obs_dim}) must be a positive integer")
        if num_actions < 1:
            raise ValueError(f"num_actions ({num_actions}) must be a positive integer")
        if not hidden_sizes or any(h < 1 for h in hidden_sizes):
            raise ValueError(f"hidden_sizes ({hidden_sizes}) must be a non-empty tuple of positive integers")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.input_scale = float(input_scale)
        self.torso, width = _mlp(obs_dim, hidden_sizes)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape `[batch, num_actions]`, for observations of shape `[batch, obs_dim]` (or `[batch,
        *obs_shape]`, flattened here) of any dtype."""
        x = obs.flatten(1).to(torch.float32)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        features = self.torso(x)
        return dueling_q(self.value(features), self.advantage(features))


class ConvDuelingQNetwork(nn.Module):
    """A convolutional torso (ReLU after every convolution), fully connected layers, and the dueling head.

    State names: `conv.0`, `conv.2`, ... (the convolutions), `torso.0`, `torso.2`, ... (the fully connected
    layers), `value`, `advantage`, and `conv_strides` (int64, one per convolution): with the weights' shapes it
    makes the published weights describe the whole network, so an actor rebuilds it from them alone.
    `layout` says where the channel axis of an observation is (CHW, HWC, or HW for none); the network moves it
    first and multiplies by `input_scale` after casting to float32.
    """

    def __init__(self, image_shape: tuple[int, int, int], num_actions: int,
                 conv_layers: Sequence[tuple[int, int, int]], hidden_sizes: Sequence[int],
                 layout: str = CHW, input_scale: float = 1.0) -> None:
        super().__init__()
        channels, height, width = image_shape
        if min(image_shape) < 1 or num_actions < 1:
            raise ValueError(f"image_shape ({image_shape}) and num_actions ({num_actions}) must be positive")
        if layout not in (CHW, HWC, HW):
            raise ValueError(f"layout ({layout!r}) must be one of {CHW}, {HWC}, {HW}")
        if not conv_layers or not hidden_sizes or any(h < 1 for h in hidden_sizes):
            raise ValueError(f"conv_layers ({conv_layers}) and hidden_sizes ({hidden_sizes}) must be non-empty "
                             f"and positive")
        flat = _conv_output_size(conv_layers, (height, width))
        if not flat:
            raise ValueError(f"images of {height}x{width} are too small for convolutions {conv_layers}")
        self.image_shape = (channels, height, width)
        self.num_actions = num_actions
        self.layout = layout
        self.input_scale = float(input_scale)
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in conv_layers:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride), nn.ReLU()]
            channels = out_channels
        self.conv = nn.Sequential(*layers)
        self.register_buffer("conv_strides", torch.tensor([s for _, _, s in conv_layers], dtype=torch.int64))
        self.torso, width = _mlp(flat, hidden_sizes)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values `[batch, num_actions]` for a batch of images in this network's layout, of any dtype."""
        x = obs.to(torch.float32)
        if self.layout == HWC:
            x = x.permute(0, 3, 1, 2)
        elif self.layout == HW:
            x = x.unsqueeze(1)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        features = self.torso(self.conv(x).flatten(1))
        return dueling_q(self.value(features), self.advantage(features))


def state_dict_to_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """A copy of the module's state as C-contiguous numpy arrays, safe to publish while training goes on."""
    return {
        name: np.ascontiguousarray(tensor.detach().cpu().numpy()).copy()
        for name, tensor in module.state_dict().items()
    }


def load_numpy_state_dict(module: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Copy `weights` into `module` in place, cast to each parameter's dtype.

    Raises ValueError naming every missing or unexpected name and every shape mismatch; on error the module is
    left unchanged.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    problems += [
        f"{name}: shape {tuple(np.shape(weights[name]))} != expected {tuple(tensor.shape)}"
        for name, tensor in own.items()
        if name in weights and tuple(np.shape(weights[name])) != tuple(tensor.shape)
    ]
    if problems:
        raise ValueError(f"weights do not match {type(module).__name__}: " + "; ".join(problems))
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(torch.as_tensor(np.asarray(weights[name])))

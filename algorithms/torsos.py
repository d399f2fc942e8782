"""Torch building blocks shared by every algorithm's networks: ReLU MLPs, convolutional stacks, observations cast
and laid out for them, and the language-neutral weight format.

The parameter service moves weights as a flat mapping `name -> numpy array` (never pickle): the learner publishes
`state_dict_to_numpy(net)`, and actors rebuild the same forward pass from those names and shapes alone
(`apexrl.algorithms.forward`), so they need no learning code. Images are read in their own layout (channels first,
last or absent) and uint8 pixels are scaled by 1/255 inside the network, so replay keeps one byte per pixel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from apexrl.algorithms.torso_specs import conv_output_size
from apexrl.common.spaces import CHW, HW, HWC


def mlp(width: int, hidden_sizes: Sequence[int]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU layers (state names 0, 2, 4, ...) and the width they end with."""
    if not hidden_sizes or any(h < 1 for h in hidden_sizes):
        raise ValueError(
            f"hidden_sizes ({tuple(hidden_sizes)}) must be a non-empty tuple of positive integers"
        )
    layers: list[nn.Module] = []
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers), width


def conv_stack(
    image_shape: tuple[int, int, int], conv_layers: Sequence[tuple[int, int, int]]
) -> tuple[nn.Sequential, torch.Tensor, int]:
    """Conv2d + ReLU layers (state names 0, 2, ...), their strides as an int64 tensor (published as
    `conv_strides`, so actors rebuild the stack from the weights alone) and the size of their flattened output."""
    channels, height, width = image_shape
    if min(image_shape) < 1:
        raise ValueError(f"image_shape ({image_shape}) must be positive")
    if not conv_layers:
        raise ValueError("conv_layers must not be empty")
    flat = conv_output_size(conv_layers, (height, width))
    if not flat:
        raise ValueError(f"images of {height}x{width} are too small for convolutions {tuple(conv_layers)}")
    layers: list[nn.Module] = []
    for out_channels, kernel, stride in conv_layers:
        layers += [nn.Conv2d(channels, out_channels, kernel, stride), nn.ReLU()]
        channels = out_channels
    return nn.Sequential(*layers), torch.tensor([s for _, _, s in conv_layers], dtype=torch.int64), flat


def check_image_layout(layout: str) -> str:
    """`layout` when it is an image layout (CHW, HWC, HW); ValueError otherwise."""
    if layout not in (CHW, HWC, HW):
        raise ValueError(f"layout ({layout!r}) must be one of {CHW}, {HWC}, {HW}")
    return layout


def images_as_float(obs: torch.Tensor, layout: str, input_scale: float) -> torch.Tensor:
    """A batch of images in `layout` as float32 [batch, channels, height, width], scaled by `input_scale`."""
    x = obs.to(torch.float32)
    if layout == HWC:
        x = x.permute(0, 3, 1, 2)
    elif layout == HW:
        x = x.unsqueeze(1)
    if input_scale != 1.0:
        x = x * input_scale
    return x


def vectors_as_float(obs: torch.Tensor, input_scale: float) -> torch.Tensor:
    """A batch of observations of any shape flattened to float32 [batch, features], scaled by `input_scale`."""
    x = obs.flatten(1).to(torch.float32)
    return x * input_scale if input_scale != 1.0 else x


@torch.no_grad()
def move_targets(targets: Sequence[nn.Module], onlines: Sequence[nn.Module], tau: float) -> None:
    """Move each target network toward its online network: target <- tau * online + (1 - tau) * target for every
    parameter (Polyak averaging; tau = 1 is a hard copy). Buffers (strides, action bounds) are copied."""
    for target, online in zip(targets, onlines, strict=True):
        if tau >= 1.0:
            target.load_state_dict(online.state_dict())
            continue
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
        for t_buffer, o_buffer in zip(target.buffers(), online.buffers(), strict=True):
            t_buffer.copy_(o_buffer)


def state_dict_to_numpy(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """A copy of the module's state as C-contiguous numpy arrays (names prefixed by `prefix`), safe to publish
    while training goes on."""
    return {
        prefix + name: np.ascontiguousarray(tensor.detach().cpu().numpy()).copy()
        for name, tensor in module.state_dict().items()
    }

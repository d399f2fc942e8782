"""Forward passes rebuilt from published weights on the actor's side, with torch: convolutional stacks
(`PREFIX.conv.N.weight`/`bias` and `PREFIX.conv_strides`, a ReLU after each, no padding) and fully connected
layers, on the CPU without gradients. Imported only when an actor meets convolutional weights, so actors of vector
environments never load torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.common.spaces import HW, HWC, VECTOR

Layer = tuple[torch.Tensor, torch.Tensor]


def tensor(weights: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
    """A float32 copy of `weights[name]` (weights may be reused by the caller)."""
    return torch.from_numpy(np.array(weights[name], dtype=np.float32))


def layers(weights: Mapping[str, np.ndarray], prefix: str) -> list[Layer]:
    """Every `PREFIX.N` layer (weight, bias), in order of N."""
    ids = sorted(int(m.group(1)) for name in weights if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", name)))
    return [(tensor(weights, f"{prefix}.{i}.weight"), tensor(weights, f"{prefix}.{i}.bias")) for i in ids]


class ConvTorso:
    """The convolutions under `prefix` (none for an MLP) applied to observations as the environment gives them:
    channel axis moved first per `layout`, cast to float32 and multiplied by `input_scale`, then flattened."""

    def __init__(self, weights: Mapping[str, np.ndarray], prefix: str, layout: str, input_scale: float) -> None:
        self.conv = layers(weights, f"{prefix}conv")
        strides = [int(s) for s in np.asarray(weights[f"{prefix}conv_strides"]).reshape(-1)] if self.conv else []
        if len(strides) != len(self.conv):
            raise ValueError(f"conv_strides has {len(strides)} strides for {len(self.conv)} convolutions")
        if self.conv and layout == VECTOR:
            raise ValueError("a convolutional network cannot read vector observations")
        self.strides = strides
        self.layout = layout
        self.input_scale = float(input_scale)

    def __call__(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(np.ascontiguousarray(obs) if isinstance(obs, np.ndarray) else obs).to(torch.float32)
        if self.conv:
            if self.layout == HWC:
                x = x.permute(0, 3, 1, 2)
            elif self.layout == HW:
                x = x.unsqueeze(1)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        for (w, b), stride in zip(self.conv, self.strides, strict=True):
            x = F.relu(F.conv2d(x, w, b, stride=stride))
        return x.flatten(1)


def relu_stack(x: torch.Tensor, stack: list[Layer]) -> torch.Tensor:
    """x through linear + ReLU layers."""
    for w, b in stack:
        x = F.relu(F.linear(x, w, b))
    return x

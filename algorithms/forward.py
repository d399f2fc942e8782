"""Forward passes rebuilt from published weights on the actor's side, with numpy: the fully connected layers every
algorithm's networks share (`PREFIX.N.weight`/`bias`, a ReLU after each). Actors run forward passes on a few
observations at a time, where numpy is several times cheaper per call than torch, and an actor of vector
environments then never imports torch. Convolutional networks go through `apexrl.algorithms.torch_forward`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

Layer = tuple[np.ndarray, np.ndarray]  # (weight transposed to [in, out], bias [out]), float32


def layer_ids(weights: Mapping[str, np.ndarray], prefix: str) -> list[int]:
    """The N of every `PREFIX.N.weight` in `weights`, in order."""
    return sorted(
        int(m.group(1))
        for name in weights
        if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", name))
    )


def dense(weights: Mapping[str, np.ndarray], name: str) -> Layer:
    """The linear layer `name` (`name.weight` [out, in], `name.bias` [out]) ready for `x @ W + b`; KeyError when
    missing."""
    return (
        np.asarray(weights[f"{name}.weight"], np.float32).T.copy(),
        np.asarray(weights[f"{name}.bias"], np.float32),
    )


def dense_stack(weights: Mapping[str, np.ndarray], prefix: str) -> list[Layer]:
    """Every `PREFIX.N` linear layer, in order."""
    return [dense(weights, f"{prefix}.{i}") for i in layer_ids(weights, prefix)]


def relu_stack(x: np.ndarray, layers: list[Layer]) -> np.ndarray:
    """x through linear + ReLU layers."""
    for w, b in layers:
        x = np.maximum(x @ w + b, 0.0)
    return x


def flat_float(obs: np.ndarray, input_scale: float) -> np.ndarray:
    """A batch of observations as float32 [batch, features], multiplied by `input_scale` (1/255 for pixels)."""
    h = np.asarray(obs, dtype=np.float32)
    if h.ndim != 2:
        h = h.reshape(len(h), -1)
    return h * np.float32(input_scale) if input_scale != 1.0 else h


def is_convolutional(weights: Mapping[str, np.ndarray], prefix: str = "") -> bool:
    """Whether the network under `prefix` has convolutions (`PREFIX.conv.N.weight`)."""
    return any(re.fullmatch(rf"{re.escape(prefix)}conv\.\d+\.weight", name) for name in weights)

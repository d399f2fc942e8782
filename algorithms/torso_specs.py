"""The network torsos every algorithm builds on, as data: their names, their convolutions, and which one reads an
environment's observations. No torch: role configs and the launcher check `--network` with it.

`mlp` reads vectors (images are flattened), `nature` (Mnih et al., 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1) images of
36x36 and up such as Atari's 4x84x84 frame stacks, `minatar` (Young and Tian, 2019: 16 3x3/1) small images such as
MinAtar's 10x10xC.
"""

from __future__ import annotations

from collections.abc import Sequence

from apexrl.common.spaces import VECTOR, EnvSpaces

AUTO = "auto"
# The torsos the built-in networks have (auto: chosen from the observation space).
NETWORKS = (AUTO, "mlp", "nature", "minatar")
# Convolutions of each convolutional torso: (out_channels, kernel, stride), each followed by a ReLU, no padding.
CONV_LAYERS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "nature": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
    "minatar": ((16, 3, 1),),
}


def conv_output_size(layers: Sequence[tuple[int, int, int]], hw: Sequence[int]) -> int:
    """Numbers the convolutions put out for an image of height and width `hw` (0 when it is too small)."""
    h, w = hw
    for _, kernel, stride in layers:
        if h < kernel or w < kernel:
            return 0
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    return layers[-1][0] * h * w


def resolve_network(name: str, spaces: EnvSpaces) -> str:
    """The torso `name` stands for on these observations ("auto" chosen from their shape); ValueError when the
    torso cannot read them (a convolution over a vector, Nature's over an image smaller than 36x36)."""
    if name not in NETWORKS:
        raise ValueError(f"network ({name!r}) must be one of {', '.join(NETWORKS)}")
    layout = spaces.layout
    if name == AUTO:
        if layout == VECTOR:
            return "mlp"
        return "nature" if conv_output_size(CONV_LAYERS["nature"], spaces.image_shape[1:]) else "minatar"
    if name != "mlp":
        if layout == VECTOR:
            raise ValueError(
                f"network {name} needs image observations, got a vector of shape {spaces.obs_shape}"
            )
        if not conv_output_size(CONV_LAYERS[name], spaces.image_shape[1:]):
            raise ValueError(
                f"network {name} cannot read images of {spaces.image_shape[1]}x"
                f"{spaces.image_shape[2]} (too small for its convolutions): use minatar or mlp"
            )
    return name

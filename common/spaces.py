"""An environment's spaces as the built-in networks see them (`EnvSpaces`), how an observation's axes are read
(`image_layout`) and how a Discrete observation becomes a vector (`one_hot`). Plain data with no gymnasium import, so the launcher, the algorithms' registry and the actors'
policies can use them; `apexrl.common.environments.check_spaces` makes them from a Gymnasium environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# Observation layouts the built-in networks read: a flat vector, or an image with its channel axis first ([C, H, W],
# e.g. stacked Atari frames), last ([H, W, C], e.g. MinAtar) or absent ([H, W]).
VECTOR, CHW, HWC, HW = "vector", "chw", "hwc", "hw"


DISCRETE, BOX = "discrete", "box"


@dataclass(frozen=True)
class EnvSpaces:
    """What the built-in networks need to know of an environment's spaces: the observations' shape and dtype, and
    the actions: `num_actions` choices (Discrete) or one float per dimension between `action_low` and
    `action_high` (a one-dimensional Box, bounds finite); `obs_one_hot` when the observations are one-hot encoded
    Discrete ones."""

    obs_shape: tuple[int, ...]
    obs_dtype: str  # numpy dtype name: float32, uint8, bool, ...
    num_actions: int = 0  # Discrete(n): n; a Box: 0
    action_low: tuple[float, ...] = ()  # a Box: its lower bound per dimension; Discrete: ()
    action_high: tuple[float, ...] = ()
    # Discrete(n) observations that the environments one-hot encode into obs_shape (n,) float32: the raw
    # environment gives an int (`apexrl.common.env_adapters.OneHotObservation`); a policy user may pass either.
    obs_one_hot: bool = False

    def __post_init__(self) -> None:
        if (self.num_actions > 0) == bool(self.action_low):
            raise ValueError(
                f"spaces need either num_actions ({self.num_actions}) or action bounds "
                f"({self.action_low}), not both or neither"
            )
        if len(self.action_low) != len(self.action_high):
            raise ValueError(
                f"action_low ({self.action_low}) and action_high ({self.action_high}) differ in length"
            )
        for low, high in zip(self.action_low, self.action_high, strict=True):
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"action bounds [{low}, {high}] must be finite with low < high")

    @classmethod
    def vector(cls, obs_dim: int, num_actions: int) -> EnvSpaces:
        return cls((obs_dim,), "float32", num_actions)

    @classmethod
    def box(
        cls,
        obs_shape: tuple[int, ...],
        low: tuple[float, ...],
        high: tuple[float, ...],
        obs_dtype: str = "float32",
    ) -> EnvSpaces:
        """Continuous actions: one float per dimension in [low, high]."""
        return cls(tuple(obs_shape), obs_dtype, 0, tuple(map(float, low)), tuple(map(float, high)))

    @property
    def action_kind(self) -> str:
        """DISCRETE or BOX."""
        return DISCRETE if self.num_actions else BOX

    @property
    def action_dim(self) -> int:
        """Floats in one action of a Box (0 for Discrete)."""
        return len(self.action_low)

    @property
    def obs_dim(self) -> int:
        """Numbers in one observation (an MLP's input size)."""
        return math.prod(self.obs_shape)

    @property
    def layout(self) -> str:
        """VECTOR, CHW, HWC or HW (see `image_layout`)."""
        return image_layout(self.obs_shape)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of an image observation; ValueError for a vector."""
        s = self.obs_shape
        if self.layout == CHW:
            return s[0], s[1], s[2]
        if self.layout == HWC:
            return s[2], s[0], s[1]
        if self.layout == HW:
            return 1, s[0], s[1]
        raise ValueError(f"observations of shape {s} are not images")

    @property
    def input_scale(self) -> float:
        """Factor a network applies to the observation: 1/255 for uint8 pixels (scaled inside the network, so
        replay and the wire keep 1 byte per pixel), 1 otherwise."""
        return 1.0 / 255.0 if self.obs_dtype == "uint8" else 1.0


def image_layout(shape: tuple[int, ...]) -> str:
    """How the axes of an observation of this shape are read.

    One axis: VECTOR. Two: HW (one channel). Three: CHW when the first axis is strictly shorter than both others
    (a stack of a few frames: Atari's [4, 84, 84]), HWC otherwise (Gymnasium's image convention: ALE's raw
    [210, 160, 3], MinAtar's [10, 10, C] including Seaquest's [10, 10, 10]).
    """
    if len(shape) == 1:
        return VECTOR
    if len(shape) == 2:
        return HW
    if len(shape) == 3:
        return CHW if shape[0] < min(shape[1], shape[2]) else HWC
    raise ValueError(f"observations of shape {shape} are neither vectors nor images")


def one_hot(index: Any, n: int, start: int = 0) -> np.ndarray:
    """float32 one-hot vectors of Discrete observations: an int gives [n], an array of ints [batch, n]."""
    index = np.asarray(index, np.int64) - start
    if index.size and (index.min() < 0 or index.max() >= n):
        raise ValueError(f"Discrete observations must be in [{start}, {start + n}), got {index.tolist()}")
    return np.eye(n, dtype=np.float32)[index]

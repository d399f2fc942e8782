"""Ape-X DPG's networks: a deterministic policy pi(s) squashed into the action bounds, and a critic Q(s, a).

Both read observations through the torsos DQN uses (`mlp` for vectors; `nature` or `minatar` convolutions for
images) and keep the action bounds as buffers, so everything outside them, replay included, sees actions in the
environment's own units:
- the policy ends in tanh, mapped per dimension onto [low, high]: pi(s) = low + (tanh(x) + 1) / 2 * (high - low);
- the critic rescales an action to [-1, 1] per dimension before it joins the observation's features, so
  asymmetric and wide bounds do not skew its inputs.

State names (published as `policy.*` and `critic.*`; actors rebuild the forward passes from them alone,
`apexrl.algorithms.dpg.acting`): `conv.N` and `conv_strides` for a convolutional torso, `torso.N` for the fully
connected layers, `out` for the last layer, and `action_low`/`action_high`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from apexrl.algorithms.torso_specs import CONV_LAYERS, resolve_network
from apexrl.algorithms.torsos import conv_stack, images_as_float, mlp, vectors_as_float
from apexrl.common.spaces import VECTOR, EnvSpaces

# Fully connected layers after the torso when --hidden-sizes is not given (TD3's 256x256 for vectors).
DEFAULT_HIDDEN: dict[str, tuple[int, ...]] = {"mlp": (256, 256), "nature": (512,), "minatar": (128,)}


class _Features(nn.Module):
    """Observations to a flat float feature vector: the convolutions of an image torso (`conv`, `conv_strides`),
    or the flattened observation scaled by `input_scale`."""

    def __init__(self, network: str, spaces: EnvSpaces) -> None:
        super().__init__()
        self.layout = spaces.layout if network != "mlp" else VECTOR
        self.input_scale = float(spaces.input_scale)
        if network == "mlp":
            self.size = spaces.obs_dim
        else:
            conv, strides, self.size = conv_stack(spaces.image_shape, CONV_LAYERS[network])
            self.conv = conv
            self.register_buffer("conv_strides", strides)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.layout == VECTOR:
            return vectors_as_float(obs, self.input_scale)
        return self.conv(images_as_float(obs, self.layout, self.input_scale)).flatten(1)


def _bounds(spaces: EnvSpaces) -> tuple[torch.Tensor, torch.Tensor]:
    if not spaces.action_dim:
        raise ValueError(
            f"DPG needs a Box action space; these spaces have {spaces.num_actions} discrete actions"
        )
    return (
        torch.tensor(spaces.action_low, dtype=torch.float32),
        torch.tensor(spaces.action_high, dtype=torch.float32),
    )


class DeterministicPolicy(_Features):
    """pi(s): torso, fully connected ReLU layers, a linear layer per action dimension, tanh, onto [low, high]."""

    def __init__(self, network: str, spaces: EnvSpaces, hidden_sizes: Sequence[int]) -> None:
        super().__init__(network, spaces)
        low, high = _bounds(spaces)
        self.torso, width = mlp(self.size, hidden_sizes)
        self.out = nn.Linear(width, spaces.action_dim)
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions [batch, action_dim] inside the bounds."""
        squashed = torch.tanh(self.out(self.torso(self.features(obs))))
        return self.action_low + (squashed + 1.0) * 0.5 * (self.action_high - self.action_low)


class Critic(_Features):
    """Q(s, a): the observation's features joined by the action rescaled to [-1, 1], fully connected ReLU layers,
    one output."""

    def __init__(self, network: str, spaces: EnvSpaces, hidden_sizes: Sequence[int]) -> None:
        super().__init__(network, spaces)
        low, high = _bounds(spaces)
        self.torso, width = mlp(self.size + spaces.action_dim, hidden_sizes)
        self.out = nn.Linear(width, 1)
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q-values [batch] of actions [batch, action_dim] in the environment's units."""
        unit = (action.to(torch.float32) - self.action_low) / (self.action_high - self.action_low) * 2.0 - 1.0
        return self.out(self.torso(torch.cat([self.features(obs), unit], dim=1))).squeeze(1)


def build_networks(
    name: str, spaces: EnvSpaces, hidden_sizes: Sequence[int] | None, critics: int
) -> tuple[str, tuple[int, ...], DeterministicPolicy, list[Critic]]:
    """The torso `name` resolves to, the hidden sizes used, the policy and `critics` critics (2 for TD3's
    clipped double-Q)."""
    kind = resolve_network(name, spaces)
    hidden = tuple(hidden_sizes) if hidden_sizes is not None else DEFAULT_HIDDEN[kind]
    policy = DeterministicPolicy(kind, spaces, hidden)
    return kind, hidden, policy, [Critic(kind, spaces, hidden) for _ in range(critics)]

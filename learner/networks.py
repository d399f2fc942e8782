"""The Q-network (MLP torso + dueling head) and its language-neutral weight format.

The parameter service moves weights as a flat mapping `name -> numpy array` (never pickle): the learner publishes
`state_dict_to_numpy(net)`, and actors evaluate the same network in numpy (`apexrl.actor.policy`), so they need
no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

DEFAULT_HIDDEN_SIZES: tuple[int, ...] = (128, 128)


class DuelingQNetwork(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') on a shared ReLU MLP torso (Wang et al., 2016).

    Subtracting the mean advantage makes V and A identifiable: the advantages of every state average to zero.
    """

    def __init__(
        self, obs_dim: int, num_actions: int, hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
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
        layers: list[nn.Module] = []
        width = obs_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.torso = nn.Sequential(*layers)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape `[batch, num_actions]`, for observations of shape `[batch, obs_dim]`."""
        features = self.torso(obs)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(dim=-1, keepdim=True)


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

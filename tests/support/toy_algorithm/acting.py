"""The linear Q-learner's acting half: Q(s) = s W + b from the published weights, epsilon-greedy, numpy only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apexrl.algorithms.base import ActorSettings, Explorer, Stateless
from apexrl.common.spaces import EnvSpaces


class LinearPolicy:
    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self.weight = np.asarray(weights["weight"], np.float64)  # [num_actions, obs_dim] as torch keeps it
        self.bias = np.asarray(weights["bias"], np.float64)

    def q(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs, np.float64).reshape(len(obs), -1) @ self.weight.T + self.bias

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return np.argmax(self.q(obs), axis=1).astype(np.int64)

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        taken = self.q(columns["obs"])[np.arange(len(columns["action"])), columns["action"]]
        target = columns["reward"] + columns["discount"] * self.q(columns["next_obs"]).max(axis=1)
        return np.abs(target - taken)


class EpsilonGreedy:
    name = "epsilon"

    def __init__(self, epsilon: float, num_actions: int, rng: np.random.Generator) -> None:
        self.scale, self._num_actions, self._rng = epsilon, num_actions, rng

    def describe(self) -> str:
        return f"epsilon {self.scale:g}"

    def actions(self, policy: LinearPolicy, obs: np.ndarray) -> np.ndarray:
        actions = policy.greedy(obs)
        explore = self._rng.random(len(actions)) < self.scale
        actions[explore] = self._rng.integers(self._num_actions, size=int(explore.sum()))
        return actions


def make_policy(weights: Mapping[str, np.ndarray], spaces: EnvSpaces, torch_threads: int = 1) -> LinearPolicy:
    return LinearPolicy(weights)


def make_explorer(settings: ActorSettings, spaces: EnvSpaces, rng: np.random.Generator) -> EpsilonGreedy:
    epsilon = 0.0 if settings.evaluate else settings.linear_epsilon
    return EpsilonGreedy(epsilon, spaces.num_actions, rng)


def make_greedy_module(weights: Mapping[str, np.ndarray], spaces: EnvSpaces) -> Any:
    import torch

    linear = torch.nn.Linear(spaces.obs_dim, spaces.num_actions, dtype=torch.float64)
    linear.load_state_dict({k: torch.as_tensor(np.asarray(v, np.float64)) for k, v in weights.items()})

    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = linear

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.linear(obs.to(torch.float64)).argmax(dim=1)

    return Greedy().eval()


def make_stateful(explorer: Explorer | None = None) -> Stateless:
    return Stateless(explorer)

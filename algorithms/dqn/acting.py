"""Ape-X DQN on the actor's side: the Q-network rebuilt from the published weights, epsilon-greedy exploration with
the fixed per-actor epsilons, and the initial priorities of n-step transitions.

`make_policy` evaluates an MLP (`DuelingQNetwork`) with numpy, and a convolutional network (its weights have
`conv.*` names) with torch (`apexrl.algorithms.dqn.torch_policy`, imported only then), batched over the actor's
environments; both are `policy_base.QPolicy`s. Tests check both against the learner's modules on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apexrl.algorithms.base import ActingPolicy, ActorSettings, Explorer, Stateless
from apexrl.algorithms.dqn.exploration import apex_epsilon, epsilon_greedy
from apexrl.algorithms.dqn.policy_base import QPolicy
from apexrl.algorithms.forward import dense, dense_stack, flat_float, is_convolutional, relu_stack
from apexrl.common.spaces import EnvSpaces


def make_policy(weights: Mapping[str, np.ndarray], spaces: EnvSpaces, torch_threads: int = 1) -> QPolicy:
    """The policy of these weights for observations of `spaces`: numpy for an MLP, torch (with `torch_threads`
    CPU threads: actors share the machine's cores) for a convolutional network."""
    if not is_convolutional(weights):
        return NumpyDuelingPolicy(weights, input_scale=spaces.input_scale)
    import torch

    from apexrl.algorithms.dqn.torch_policy import TorchDuelingPolicy

    torch.set_num_threads(torch_threads)
    return TorchDuelingPolicy(weights, layout=spaces.layout, input_scale=spaces.input_scale)


def make_greedy_module(weights: Mapping[str, np.ndarray], spaces: EnvSpaces) -> Any:
    """A torch module (`torch_policy.GreedyQ`) from a batch of observations to the greedy actions, int64 [batch]:
    the policy as `apexrl export` writes it. One-hot encoded Discrete observations are taken as int64 indices."""
    from apexrl.algorithms.dqn.torch_policy import DuelingQModule, GreedyQ

    one_hot = spaces.obs_dim if spaces.obs_one_hot else 0
    return GreedyQ(
        DuelingQModule(weights, layout=spaces.layout, input_scale=spaces.input_scale), one_hot
    ).eval()


class NumpyDuelingPolicy(QPolicy):
    """Q(s, .) of a DuelingQNetwork (ReLU MLP torso, value and advantage heads) from its named weights.
    Observations are flattened and multiplied by `input_scale` (1/255 for uint8 pixels), as the network does."""

    def __init__(self, weights: Mapping[str, np.ndarray], input_scale: float = 1.0) -> None:
        if is_convolutional(weights):
            raise ValueError("weights of a convolutional network: use make_policy (torch)")
        try:
            self._torso = dense_stack(weights, "torso")
            self._value = dense(weights, "value")
            self._advantage = dense(weights, "advantage")
        except KeyError as err:
            raise ValueError(f"weights are not a DuelingQNetwork state dict: missing {err}") from None
        if not self._torso:
            raise ValueError("weights are not a DuelingQNetwork state dict: no torso layers")
        self.obs_dim = self._torso[0][0].shape[0]
        self.num_actions = self._advantage[0].shape[1]
        self.input_scale = float(input_scale)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [batch, num_actions] for observations [batch, obs_dim] (or [batch, *obs_shape])."""
        h = relu_stack(flat_float(obs, self.input_scale), self._torso)
        value = h @ self._value[0] + self._value[1]
        advantage = h @ self._advantage[0] + self._advantage[1]
        return value + advantage - advantage.mean(axis=1, keepdims=True)


class EpsilonGreedy:
    """Epsilon-greedy over the policy's Q-values, with this actor's own generator."""

    name = "epsilon"

    def __init__(self, epsilon: float, rng: np.random.Generator) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon ({epsilon!r}) must be in [0, 1]")
        self.scale = float(epsilon)
        self._rng = rng

    def describe(self) -> str:
        return f"epsilon {self.scale:.4f}"

    def actions(self, policy: ActingPolicy, obs: np.ndarray) -> np.ndarray:
        if self.scale == 0.0:
            return policy.greedy(obs)
        return epsilon_greedy(policy.q_values(obs), self.scale, self._rng)


def make_explorer(settings: ActorSettings, spaces: EnvSpaces, rng: np.random.Generator) -> EpsilonGreedy:
    """Actor i of N explores with Ape-X's epsilon_i (see `apex_epsilon`) unless `settings.epsilon` fixes one; the
    evaluator plays greedily (epsilon 0) unless told otherwise."""
    if settings.epsilon is not None:
        epsilon = settings.epsilon
    elif settings.evaluate:
        epsilon = 0.0
    else:
        epsilon = apex_epsilon(settings.actor_index, settings.num_actors)
    return EpsilonGreedy(epsilon, rng)


def make_stateful(explorer: Explorer | None = None) -> Stateless:
    """How roles step this policy: it keeps no state between steps (algorithms/base.py, Stateless). Without an
    explorer it acts greedily only (`load_policy`, `apexrl evaluate`)."""
    return Stateless(explorer)

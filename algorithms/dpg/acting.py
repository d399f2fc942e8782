"""Ape-X DPG on the actor's side: the policy and the critic rebuilt from the published weights (`policy.*`,
`critic.*`), Gaussian exploration with a noise scale per actor after optional uniformly random warm-up steps, and
the initial priorities of n-step transitions.

`make_policy` evaluates MLP weights with numpy and convolutional ones (`policy.conv.*`) with torch
(`apexrl.algorithms.dpg.torch_policy`, imported only then): two `policy_base.DPGPolicy`s that mirror
`apexrl.algorithms.dpg.networks` without importing it; tests check them equal on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from apexrl.algorithms.base import ActorSettings, Explorer, Stateless
from apexrl.algorithms.dpg.exploration import UnitNoise, apex_noise_scale, gaussian_actions, uniform_actions
from apexrl.algorithms.dpg.policy_base import DPGPolicy
from apexrl.algorithms.forward import dense, dense_stack, flat_float, is_convolutional, relu_stack
from apexrl.common.spaces import EnvSpaces


def make_policy(weights: Mapping[str, np.ndarray], spaces: EnvSpaces, torch_threads: int = 1) -> DPGPolicy:
    """The policy and critic of these weights for observations of `spaces`: numpy for MLPs, torch (with
    `torch_threads` CPU threads) for convolutional networks."""
    if not is_convolutional(weights, "policy."):
        return NumpyDPGPolicy(weights, input_scale=spaces.input_scale)
    import torch

    from apexrl.algorithms.dpg.torch_policy import TorchDPGPolicy

    torch.set_num_threads(torch_threads)
    return TorchDPGPolicy(weights, layout=spaces.layout, input_scale=spaces.input_scale)


def make_greedy_module(weights: Mapping[str, np.ndarray], spaces: EnvSpaces) -> Any:
    """A torch module (`torch_policy.GreedyDPG`) from a batch of observations to the policy's actions, float32
    [batch, action_dim] inside the bounds: the policy as `apexrl export` writes it (the critic left out). One-hot
    encoded Discrete observations are taken as int64 indices."""
    from apexrl.algorithms.dpg.torch_policy import greedy_module

    one_hot = spaces.obs_dim if spaces.obs_one_hot else 0
    return greedy_module(weights, spaces.layout, spaces.input_scale, one_hot).eval()


class NumpyDPGPolicy(DPGPolicy):
    """The MLP policy and critic with numpy; observations flattened and multiplied by `input_scale`."""

    def __init__(self, weights: Mapping[str, np.ndarray], input_scale: float = 1.0) -> None:
        if is_convolutional(weights, "policy.") or is_convolutional(weights, "critic."):
            raise ValueError("weights of convolutional networks: use make_policy (torch)")
        try:
            self._policy = dense_stack(weights, "policy.torso")
            self._policy_out = dense(weights, "policy.out")
            self._critic = dense_stack(weights, "critic.torso")
            self._critic_out = dense(weights, "critic.out")
            self.low = np.asarray(weights["policy.action_low"], np.float64)
            self.high = np.asarray(weights["policy.action_high"], np.float64)
        except KeyError as err:
            raise ValueError(f"weights are not a DPG policy and critic: missing {err}") from None
        if not self._policy or not self._critic:
            raise ValueError("weights are not a DPG policy and critic: no torso layers")
        self.input_scale = float(input_scale)
        self.action_dim = len(self.low)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        h = relu_stack(flat_float(obs, self.input_scale), self._policy)
        return self._squash(h @ self._policy_out[0] + self._policy_out[1])

    def q(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        x = np.concatenate([flat_float(obs, self.input_scale), self._unit(action)], axis=1)
        h = relu_stack(x, self._critic)
        return (h @ self._critic_out[0] + self._critic_out[1])[:, 0]


class GaussianNoise:
    """The policy's action plus Gaussian noise of scale `scale` (half ranges), clipped to the bounds, each
    environment's noise keeping `correlation` of its last value (0: drawn afresh every step); the first
    `random_steps` environment steps of this actor draw uniformly random actions instead."""

    name = "noise_scale"

    def __init__(
        self,
        scale: float,
        low: np.ndarray,
        high: np.ndarray,
        rng: np.random.Generator,
        random_steps: int = 0,
        correlation: float = 0.0,
    ) -> None:
        if not scale >= 0:
            raise ValueError(f"noise scale ({scale!r}) must be >= 0")
        if random_steps < 0:
            raise ValueError(f"random_steps ({random_steps!r}) must be >= 0")
        self.scale = float(scale)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        self.random_steps = int(random_steps)
        self.steps = 0
        self.noise = UnitNoise(correlation, rng)
        self._rng = rng

    def describe(self) -> str:
        words = f"noise scale {self.scale:.4f}"
        if self.noise.correlation:
            words += f", correlation {self.noise.correlation:g}"
        if self.random_steps:
            words += f", {self.random_steps} uniformly random steps first"
        return words

    def actions(self, policy: DPGPolicy, obs: np.ndarray) -> np.ndarray:
        batch = len(obs)
        random = self.steps < self.random_steps
        self.steps += batch
        if random:
            return uniform_actions(batch, self.low, self.high, self._rng)
        greedy = policy.greedy(obs)
        if self.scale == 0.0:
            return greedy
        return gaussian_actions(greedy, self.scale, self.low, self.high, self.noise.draw(greedy.shape))


def make_explorer(settings: ActorSettings, spaces: EnvSpaces, rng: np.random.Generator) -> GaussianNoise:
    """Actor i of N explores with the noise scale sigma_i (`apex_noise_scale`) unless `settings.noise_scale` fixes
    one, its noise correlated over time by `settings.noise_correlation`, after `settings.random_steps` uniformly
    random steps; the evaluator acts greedily (no noise, no random steps) unless given a noise scale."""
    low, high = np.asarray(spaces.action_low), np.asarray(spaces.action_high)
    if settings.evaluate:
        return GaussianNoise(settings.noise_scale or 0.0, low, high, rng)
    scale = (
        settings.noise_scale
        if settings.noise_scale is not None
        else apex_noise_scale(settings.actor_index, settings.num_actors)
    )
    return GaussianNoise(
        scale,
        low,
        high,
        rng,
        random_steps=settings.random_steps or 0,
        correlation=settings.noise_correlation or 0.0,
    )


def make_stateful(explorer: Explorer | None = None) -> Stateless:
    """How roles step this policy: it keeps no state between steps (algorithms/base.py, Stateless). Without an
    explorer it acts greedily only (`load_policy`, `apexrl evaluate`)."""
    return Stateless(explorer)

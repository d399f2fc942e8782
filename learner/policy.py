"""`apexrl.load_policy`: a trained policy to use outside a fleet, from a run directory or a checkpoint file.

    import apexrl
    policy = apexrl.load_policy("runs/CartPole-v1-20250101-120000")
    env = policy.make_env()                  # the environment as training built it
    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(policy.act(obs))

`act` takes one observation or a batch, as the environment gives them, and returns the greedy action(s), on the
CPU: the actors' own forward pass rebuilt from the checkpoint's acting weights (numpy for fully connected
networks, torch for convolutional ones). Reading the checkpoint file itself needs torch (it is a torch file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.algorithms.registry import get
from apexrl.common.env_settings import EnvChoice
from apexrl.common.spaces import EnvSpaces, one_hot
from apexrl.learner.checkpoint import load_checkpoint, resolve_checkpoint

if TYPE_CHECKING:
    import gymnasium
    import torch


def load_policy(path: str | os.PathLike) -> TrainedPolicy:
    """The greedy policy of `path`: a run directory (RUN_DIR/checkpoints/checkpoint.pt), a checkpoint folder or
    file. FileNotFoundError when there is none; ValueError when the file is not a checkpoint apexrl can play."""
    file = resolve_checkpoint(path)
    checkpoint = load_checkpoint(file)
    return TrainedPolicy(
        file,
        checkpoint.algorithm,
        checkpoint.spaces,
        checkpoint.env,
        checkpoint.acting_weights,
        updates=checkpoint.updates,
        weight_version=checkpoint.weight_version,
    )


class TrainedPolicy:
    """A checkpoint's greedy policy. `spaces` are the observations and actions it was trained on, `env` the
    environment (id, plugin modules, constructor arguments), `updates` and `weight_version` how far training
    had gone."""

    def __init__(
        self,
        path: Path,
        algorithm: str,
        spaces: EnvSpaces,
        env: EnvChoice,
        weights: Mapping[str, np.ndarray],
        *,
        updates: int = 0,
        weight_version: int = 0,
    ) -> None:
        self.path = Path(path)
        self.algorithm = algorithm
        self.spaces = spaces
        self.env = env
        self.updates = updates
        self.weight_version = weight_version
        self._weights = weights
        try:
            self._acting = get(algorithm).acting()
            self._policy = self._acting.make_policy(weights, spaces)
        except (KeyError, ValueError) as err:
            raise ValueError(
                f"{self.path}: cannot rebuild the {algorithm} policy from its weights: {err}"
            ) from None

    def act(self, obs: Any) -> Any:
        """The greedy action of one observation (an int for Discrete actions, a float32 vector for a Box), or of a
        batch (int64 [batch], float32 [batch, action_dim]). Observations as the environment gives them: for
        one-hot encoded Discrete observations, the int (or ints) or its one-hot vector."""
        batch, single = self._as_batch(obs)
        actions = self._policy.greedy(batch)
        if not single:
            return actions
        return int(actions[0]) if self.spaces.num_actions else actions[0]

    def make_env(self, render_mode: str | None = None) -> gymnasium.Env:
        """The environment this policy was trained on, made as the actors made it (preprocessing, plugin modules,
        constructor arguments; `render_mode` "human" or "rgb_array" to watch or record it)."""
        from apexrl.common.environments import make_env

        return make_env(self.env, render_mode=render_mode)

    def greedy_module(self) -> torch.nn.Module:
        """A torch module from an observation batch (as `act` takes a batch; one-hot encoded observations as their
        int64 indices) to the greedy actions: what `apexrl export` writes."""
        return self._acting.make_greedy_module(self._weights, self.spaces)

    def _as_batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        """(a batch of observations as the networks read them, whether `obs` was one observation)."""
        shape = self.spaces.obs_shape
        array = np.asarray(obs)
        if self.spaces.obs_one_hot and array.dtype.kind in "iu" and array.ndim <= 1:
            return one_hot(array.reshape(-1), shape[0]), array.ndim == 0
        if array.shape == shape:
            return array[None], True
        if array.ndim == len(shape) + 1 and array.shape[1:] == shape:
            return array, False
        raise ValueError(
            f"observations must be of shape {shape} (one) or [batch, {', '.join(map(str, shape))}] "
            f"(a batch), got {array.shape}"
        )

    def __repr__(self) -> str:
        return (
            f"TrainedPolicy({self.path}, {self.algorithm} on {self.env.describe()}, updates {self.updates}, "
            f"weights v{self.weight_version})"
        )

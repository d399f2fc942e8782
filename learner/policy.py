"""`apexrl.load_policy`: a trained policy to use outside a fleet, from a run directory or a checkpoint file.

    import apexrl
    policy = apexrl.load_policy("runs/CartPole-v1-20250101-120000")   # the policy the evaluator kept
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

from apexrl.algorithms.base import State
from apexrl.algorithms.checkpoint import load_checkpoint
from apexrl.algorithms.checkpoint_files import BEST, resolve_checkpoint
from apexrl.algorithms.registry import get
from apexrl.common.env_settings import EnvChoice
from apexrl.common.spaces import EnvSpaces, one_hot

if TYPE_CHECKING:
    import gymnasium
    import torch


def load_policy(path: str | os.PathLike, weights: str = BEST) -> TrainedPolicy:
    """The greedy policy of `path`: a run directory or its checkpoints folder (weights="best": the policy the
    evaluator kept, RUN_DIR/checkpoints/best.npz, or the last checkpoint when it kept none; "last": the learner's
    last checkpoint), or a checkpoint file. FileNotFoundError when there is none; ValueError when the file is not a
    checkpoint apexrl can play."""
    file = resolve_checkpoint(path, weights)
    checkpoint = load_checkpoint(file)
    return TrainedPolicy(
        file,
        checkpoint.algorithm,
        checkpoint.spaces,
        checkpoint.env,
        checkpoint.acting_weights,
        updates=checkpoint.updates,
        weight_version=checkpoint.weight_version,
        kept=checkpoint.kept,
    )


_NO_STATE = object()  # act() called without a state: it returns the action alone


class TrainedPolicy:
    """A checkpoint's greedy policy. `spaces` are the observations and actions it was trained on, `env` the
    environment (id, plugin modules, constructor arguments), `updates` (None for a kept policy) and
    `weight_version` how far training had gone, `kept` what the evaluator measured when it kept these weights
    (actor/kept_policy.py KeptRecord's fields; None for the learner's checkpoint)."""

    def __init__(
        self,
        path: Path,
        algorithm: str,
        spaces: EnvSpaces,
        env: EnvChoice,
        weights: Mapping[str, np.ndarray],
        *,
        updates: int | None = 0,
        weight_version: int = 0,
        kept: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.algorithm = algorithm
        self.spaces = spaces
        self.env = env
        self.updates = updates
        self.weight_version = weight_version
        self.kept = dict(kept) if kept is not None else None
        self._weights = weights
        try:
            self._acting = get(algorithm).acting()
            self._policy = self._acting.make_policy(weights, spaces)
            self._stepping = self._acting.make_stateful()
        except (KeyError, ValueError) as err:
            raise ValueError(
                f"{self.path}: cannot rebuild the {algorithm} policy from its weights: {err}"
            ) from None

    def initial_state(self, batch: int = 1) -> State:
        """The acting state at the start of an episode, for `batch` environments (None for a feed-forward policy:
        DQN's, DPG's). Pass it to `act` and the state it returns to the next call; start again at episode ends."""
        return self._stepping.initial_state(batch)

    def act(self, obs: Any, state: State = _NO_STATE) -> Any:
        """The greedy action of one observation (an int for Discrete actions, a float32 vector for a Box), or of a
        batch (int64 [batch], float32 [batch, action_dim]). Observations as the environment gives them: for
        one-hot encoded Discrete observations, the int (or ints) or its one-hot vector. Given a `state`
        (`initial_state`), it returns (action, state): the way to step a policy that remembers."""
        batch, single = self._as_batch(obs)
        actions, after = self._stepping.greedy(self._policy, batch, None if state is _NO_STATE else state)
        if single:
            actions = int(actions[0]) if self.spaces.num_actions else actions[0]
        return actions if state is _NO_STATE else (actions, after)

    def observe(self, state: State, reward: Any) -> State:
        """The state once the environment answered the last action with `reward` (one, or one per environment of
        a batch): a recurrent policy (R2D2) takes the previous reward as an input, as its actors gave it (clipped
        where they clipped it); a feed-forward one's state stays None. Call it after every step, before the next
        `act`."""
        from apexrl.common.environments import clips_rewards

        rewards = np.atleast_1d(np.asarray(reward, dtype=np.float32))
        if clips_rewards(self.env.id):
            rewards = np.clip(rewards, -1.0, 1.0)
        return self._stepping.observe(state, rewards)

    def make_env(self, render_mode: str | None = None, *, trust_env_modules: bool = False) -> gymnasium.Env:
        """The environment this policy was trained on, made as the actors made it (preprocessing, constructor
        arguments; `render_mode` "human" or "rgb_array" to watch or record it). Plugin modules the checkpoint
        names are imported only with `trust_env_modules` (importing runs their code; ValueError naming them
        otherwise), and never from the working directory."""
        from apexrl.common.environments import make_env

        return make_env(self.env.trusting() if trust_env_modules else self.env, render_mode=render_mode)

    @property
    def recurrent(self) -> bool:
        """Whether this policy carries a state from step to step (R2D2's LSTM; DQN's and DPG's do not)."""
        return self.initial_state() is not None

    def greedy_module(self) -> torch.nn.Module:
        """A torch module from one observation or a batch, as `act` takes them (one-hot encoded observations as
        their int64 indices), to the greedy action or actions: what `apexrl export` writes. A recurrent policy's
        also takes the state, the previous action and the previous reward (the environment's own: clipped inside
        where training clipped it) and gives the next state too (`torch_forward.RecurrentOneOrBatch`)."""
        from apexrl.algorithms.torch_forward import OneOrBatch, RecurrentOneOrBatch
        from apexrl.common.environments import clips_rewards

        batched = self._acting.make_greedy_module(self._weights, self.spaces)
        obs_shape = () if self.spaces.obs_one_hot else self.spaces.obs_shape
        if self.recurrent:
            return RecurrentOneOrBatch(batched, obs_shape, clips_rewards(self.env.id)).eval()
        return OneOrBatch(batched, obs_shape).eval()

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

    def describe(self) -> str:
        """Which weights these are, in words: kept by the evaluator (what they scored) or the learner's."""
        if self.kept is not None:
            solved = ", solved the run" if self.kept.get("solved") else ""
            return (
                f"weights v{self.weight_version} kept by the evaluator: round {self.kept.get('round')}, mean "
                f"return {float(self.kept.get('mean_return', float('nan'))):.1f} over "
                f"{self.kept.get('episodes')} episodes{solved}"
            )
        return f"the learner's weights v{self.weight_version} after {self.updates} updates"

    def __repr__(self) -> str:
        return f"TrainedPolicy({self.path}, {self.algorithm} on {self.env.describe()}, {self.describe()})"

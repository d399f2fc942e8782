"""Gymnasium environments as the built-in actor and learner see them: checked spaces and their sizes.

Shared by the actor (which plays them) and the learner (which sizes its network from them), and used by the
launcher to refuse an unknown or unsupported environment before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym


@dataclass(frozen=True)
class EnvSpaces:
    obs_dim: int
    num_actions: int


def check_spaces(env: gym.Env, env_id: str) -> EnvSpaces:
    """The sizes the built-in networks need; ValueError naming the space when the environment does not fit."""
    obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"{env_id}: the built-in actor needs a flat Box observation space, got {obs_space}")
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{env_id}: the built-in actor needs a Discrete action space, got {action_space}")
    return EnvSpaces(int(obs_space.shape[0]), int(action_space.n))


def env_spaces(env_id: str) -> EnvSpaces:
    """Make `env_id` once and return its sizes; ValueError for an unknown id or unsupported spaces."""
    try:
        env = gym.make(env_id)
    except gym.error.Error as err:  # unknown id, missing extra (e.g. ale-py), bad version
        raise ValueError(f"cannot make environment {env_id!r}: {err}") from None
    try:
        return check_spaces(env, env_id)
    finally:
        env.close()

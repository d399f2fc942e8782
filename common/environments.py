"""Gymnasium environments as the built-in actor and learner see them: made with the preprocessing their id calls
for, and their checked spaces.

Shared by the actor (which plays them) and the learner (which sizes its network from them), and used by the
launcher to refuse an unknown or unsupported environment before any process starts.

The environment id decides the preprocessing (`make_env`):
- Atari (`ALE/Pong-v5`, any id ale-py registers): Gymnasium's `AtariPreprocessing` (up to 30 no-op starts, frame
  skip 4 with max-pooling of the last two frames, 84x84 grayscale) then `FrameStackObservation` of 4 frames:
  uint8 observations [4, 84, 84]. Rewards are clipped to [-1, 1] for training (`clips_rewards`); the episode
  returns reported stay the game's own.
- MinAtar (`MinAtar/Breakout-v1`, registered by the `minatar` package): its bool [10, 10, C] observations as they
  are, episodes cut at `MINATAR_MAX_EPISODE_STEPS` (a greedy policy can otherwise keep a ball bouncing forever).
- Anything else: `gymnasium.make(env_id)` unchanged.
Atari and MinAtar need the `atari` extra (`pip install 'apexrl[atari]'`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from apexrl.common.spaces import BOX, CHW, DISCRETE, HW, HWC, VECTOR, EnvSpaces, image_layout

ATARI_FRAME_SKIP = 4
ATARI_SCREEN_SIZE = 84
ATARI_FRAME_STACK = 4
ATARI_NOOP_MAX = 30
MINATAR_MAX_EPISODE_STEPS = 10_000
# The spaces' types live in apexrl.common.spaces (no gymnasium); re-exported here for the roles that make envs.
__all__ = ["BOX", "CHW", "DISCRETE", "HW", "HWC", "VECTOR", "EnvSpaces", "image_layout"]

def check_spaces(env: gym.Env | gym.vector.VectorEnv, env_id: str) -> EnvSpaces:
    """The sizes the built-in networks need (of one copy, for a vector environment); ValueError naming the space
    when the environment does not fit."""
    if isinstance(env, gym.vector.VectorEnv):
        obs_space, action_space = env.single_observation_space, env.single_action_space
    else:
        obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or not 1 <= len(obs_space.shape) <= 3:
        raise ValueError(f"{env_id}: the built-in actor needs a Box observation space of a vector or an image, "
                         f"got {obs_space}")
    dtype = np.dtype(obs_space.dtype)
    if dtype.kind not in "fiub":
        raise ValueError(f"{env_id}: observations of dtype {dtype} are not supported")
    obs_shape = tuple(int(d) for d in obs_space.shape)
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"{env_id}: a Discrete action space must start at 0, got {action_space}")
        return EnvSpaces(obs_shape, dtype.name, int(action_space.n))
    if isinstance(action_space, gym.spaces.Box):
        if len(action_space.shape) != 1 or action_space.shape[0] < 1:
            raise ValueError(f"{env_id}: a Box action space must be one-dimensional (a vector of floats), got "
                             f"shape {action_space.shape}")
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"{env_id}: a Box action space needs finite bounds (a deterministic policy is squashed "
                             f"into them), got low {low.tolist()} and high {high.tolist()}")
        if not (low < high).all():
            raise ValueError(f"{env_id}: a Box action space needs low < high in every dimension, got low "
                             f"{low.tolist()} and high {high.tolist()}")
        return EnvSpaces(obs_shape, dtype.name, 0, tuple(low.tolist()), tuple(high.tolist()))
    raise ValueError(f"{env_id}: the built-in actor needs a Discrete or a Box action space, got {action_space}")


def is_atari(env_id: str) -> bool:
    """An id ale-py registers (ALE/Pong-v5, PongNoFrameskip-v4, ...)."""
    _register(env_id)
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def clips_rewards(env_id: str) -> bool:
    """Whether actors clip this environment's rewards to [-1, 1] for training (Atari, as DQN and Ape-X do)."""
    return is_atari(env_id)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """`env_id` with the preprocessing its family calls for (module docstring); ValueError for an unknown id or a
    missing extra. `kwargs` go to `gymnasium.make` (e.g. render_mode)."""
    _register(env_id)
    try:
        if is_atari(env_id):
            env = gym.make(env_id, frameskip=1, **kwargs)  # AtariPreprocessing skips frames itself
            if len(env.observation_space.shape) != 3:  # the RAM variants: a vector, no screen to preprocess
                return env
            env = gym.wrappers.AtariPreprocessing(env, noop_max=ATARI_NOOP_MAX, frame_skip=ATARI_FRAME_SKIP,
                                                  screen_size=ATARI_SCREEN_SIZE)
            return gym.wrappers.FrameStackObservation(env, ATARI_FRAME_STACK)
        if env_id.startswith("MinAtar/"):
            return gym.make(env_id, max_episode_steps=MINATAR_MAX_EPISODE_STEPS, **kwargs)
        return gym.make(env_id, **kwargs)
    except (gym.error.Error, ImportError) as err:  # unknown id, missing extra or OpenCV, bad version
        raise ValueError(f"cannot make environment {env_id!r}: {err}{_extra_hint(env_id)}") from None


def make_vector_env(env_id: str, num_envs: int, *, same_step_autoreset: bool = True) -> gym.vector.VectorEnv:
    """`num_envs` copies of `make_env(env_id)` stepped together. With `same_step_autoreset` (exploring actors) a
    step that ends an episode returns the next episode's first observation and the last one in
    info["final_obs"], so every step yields one transition per copy. Without it (the evaluator, which ignores what
    follows an episode's end), an environment family's own vectorised implementation is used when it has one and
    needs no preprocessing: Gymnasium's CartPoleVectorEnv steps 100 copies ~12x faster than 100 Python ones."""
    from functools import partial

    _register(env_id)
    if not same_step_autoreset and not is_atari(env_id) and not env_id.startswith("MinAtar/"):
        spec = gym.spec(env_id) if env_id in gym.registry else None
        if spec is not None and spec.vector_entry_point is not None:
            return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    return gym.vector.SyncVectorEnv([partial(make_env, env_id) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


# Solve bars of environments whose registration has no reward_threshold but whose community has one.
USUAL_THRESHOLDS = {"Pendulum-v1": -150.0}  # rl-baselines3-zoo's and most papers' bar; Gymnasium registers none


def reward_threshold(env_id: str) -> float | None:
    """The return at which `env_id` counts as solved: its Gymnasium registration's reward_threshold, else the usual
    bar of `USUAL_THRESHOLDS` (None when neither has one, as the Atari and MinAtar games, or for an unknown id)."""
    _register(env_id)
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        return None
    if threshold is None:
        return USUAL_THRESHOLDS.get(env_id)
    return float(threshold)


def env_spaces(env_id: str) -> EnvSpaces:
    """Make `env_id` once and return its sizes; ValueError for an unknown id or unsupported spaces."""
    env = make_env(env_id)
    try:
        return check_spaces(env, env_id)
    finally:
        env.close()


def _register(env_id: str) -> None:
    """Register the optional families an id may belong to (ale-py, minatar) when their package is installed."""
    if env_id in gym.registry:
        return
    if env_id.startswith("MinAtar/"):
        try:
            from minatar.gym import register_envs
        except ImportError:
            return
        register_envs()
        return
    try:  # ALE/..., and the v4 names (PongNoFrameskip-v4) that ale-py registers too
        import ale_py
    except ImportError:
        return
    gym.register_envs(ale_py)


def _extra_hint(env_id: str) -> str:
    if env_id.startswith(("ALE/", "MinAtar/")):
        return " (Atari and MinAtar need the atari extra: pip install 'apexrl[atari]')"
    entry_point = str(getattr(gym.registry.get(env_id), "entry_point", ""))
    for family in ("mujoco", "box2d"):
        if entry_point.startswith(f"gymnasium.envs.{family}"):
            return f" (Gymnasium's {family} environments need the {family} extra: pip install 'apexrl[{family}]')"
    return ""

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
- Anything else: `gymnasium.make(env_id, **kwargs)`; an id Gymnasium does not register but `gym` 0.26 does runs
  through `apexrl.common.env_adapters.make_gym26` (the `gym26` extra).
- Discrete observations (FrozenLake, Taxi) are one-hot encoded (`OneHotObservation`), as Stable-Baselines3 does.
Atari and MinAtar need the `atari` extra (`pip install 'apexrl[atari]'`).

Every environment of a run is made by `make_env` from one `EnvChoice` (id, plugin modules, constructor arguments):
the actors', the learner's (its sizes), the launcher's pre-flight check, `apexrl evaluate`'s and `load_policy`'s.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator

import gymnasium as gym
import numpy as np

from apexrl.common.env_adapters import (
    NO_VELOCITY,
    OneHotObservation,
    gym26_registered,
    gym26_reward_threshold,
    make_gym26,
)
from apexrl.common.env_settings import EnvChoice
from apexrl.common.spaces import BOX, CHW, DISCRETE, HW, HWC, VECTOR, EnvSpaces, image_layout

log = logging.getLogger("apexrl.environments")

ATARI_FRAME_SKIP = 4
ATARI_SCREEN_SIZE = 84
ATARI_FRAME_STACK = 4
ATARI_NOOP_MAX = 30
MINATAR_MAX_EPISODE_STEPS = 10_000
# The spaces' types live in apexrl.common.spaces (no gymnasium); re-exported here for the roles that make envs.
__all__ = ["BOX", "CHW", "DISCRETE", "HW", "HWC", "VECTOR", "EnvChoice", "EnvSpaces", "image_layout"]
# Render modes a caller may ask make_env for (evaluate --render: human; --record-video: rgb_array).
RENDER_MODES = ("human", "rgb_array")


def check_spaces(env: gym.Env | gym.vector.VectorEnv, env_id: str) -> EnvSpaces:
    """The sizes the built-in networks need (of one copy, for a vector environment); ValueError naming the space
    when the environment does not fit."""
    if isinstance(env, gym.vector.VectorEnv):
        obs_space, action_space = env.single_observation_space, env.single_action_space
    else:
        obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or not 1 <= len(obs_space.shape) <= 3:
        raise ValueError(
            f"{env_id}: the built-in actor needs a Box observation space of a vector or an image (or "
            f"a Discrete one, one-hot encoded), got {obs_space}"
        )
    one_hot = _one_hot_encoded(env)
    dtype = np.dtype(obs_space.dtype)
    if dtype.kind not in "fiub":
        raise ValueError(f"{env_id}: observations of dtype {dtype} are not supported")
    obs_shape = tuple(int(d) for d in obs_space.shape)
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"{env_id}: a Discrete action space must start at 0, got {action_space}")
        return EnvSpaces(obs_shape, dtype.name, int(action_space.n), obs_one_hot=one_hot)
    if isinstance(action_space, gym.spaces.Box):
        if len(action_space.shape) != 1 or action_space.shape[0] < 1:
            raise ValueError(
                f"{env_id}: a Box action space must be one-dimensional (a vector of floats), got "
                f"shape {action_space.shape}"
            )
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(
                f"{env_id}: a Box action space needs finite bounds (a deterministic policy is squashed "
                f"into them), got low {low.tolist()} and high {high.tolist()}"
            )
        if not (low < high).all():
            raise ValueError(
                f"{env_id}: a Box action space needs low < high in every dimension, got low "
                f"{low.tolist()} and high {high.tolist()}"
            )
        return EnvSpaces(
            obs_shape, dtype.name, 0, tuple(low.tolist()), tuple(high.tolist()), obs_one_hot=one_hot
        )
    raise ValueError(
        f"{env_id}: the built-in actor needs a Discrete or a Box action space, got {action_space}"
    )


def is_atari(env: EnvChoice | str) -> bool:
    """An id ale-py registers (ALE/Pong-v5, PongNoFrameskip-v4, ...)."""
    env_id = as_choice(env).registered_id
    _register(env_id)
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def clips_rewards(env: EnvChoice | str) -> bool:
    """Whether actors clip this environment's rewards to [-1, 1] for training (Atari, as DQN and Ape-X do)."""
    return is_atari(env)


def as_choice(env: EnvChoice | str) -> EnvChoice:
    """An EnvChoice of an id alone (no modules, no arguments), or the choice itself."""
    return env if isinstance(env, EnvChoice) else EnvChoice(env)


def make_env(env: EnvChoice | str, *, render_mode: str | None = None) -> gym.Env:
    """The environment `env` chooses, with the preprocessing its family calls for (module docstring): its modules
    imported, its constructor given its kwargs, and `render_mode` only when one is asked for (an environment
    that takes none is still made). ValueError naming the environment for an unknown id, a missing extra, a module
    that does not import or arguments its constructor refuses."""
    choice = as_choice(env)
    import_env_modules(choice)
    env_id, kwargs = choice.registered_id, choice.kwargs.as_dict()
    if render_mode is not None:
        if render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode ({render_mode!r}) must be one of {', '.join(RENDER_MODES)}")
        kwargs["render_mode"] = render_mode
    _register(env_id)
    try:
        made = _make(env_id, kwargs)
    except Exception as err:  # the environment's own code: an unknown id, a refused argument, a missing extra
        log.debug("making %s failed", choice.describe(), exc_info=True)
        with_kwargs = f" with {choice.kwargs}" if choice.kwargs else ""
        raise ValueError(
            f"cannot make environment {choice.id!r}{with_kwargs}: {_reason(err)}{_extra_hint(env_id, err)}"
        ) from None
    if isinstance(made.observation_space, gym.spaces.Discrete):
        made = OneHotObservation(made)
    return made


def _make(env_id: str, kwargs: dict) -> gym.Env:
    if _uses_mujoco(env_id):
        route_mujoco_warnings()
    if env_id not in gym.registry and gym26_registered(env_id):
        return make_gym26(env_id, **kwargs)
    if is_atari(env_id):
        env = gym.make(env_id, **{"frameskip": 1, **kwargs})  # AtariPreprocessing skips frames itself
        if len(env.observation_space.shape) != 3:  # the RAM variants: a vector, no screen to preprocess
            return env
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=ATARI_NOOP_MAX, frame_skip=ATARI_FRAME_SKIP, screen_size=ATARI_SCREEN_SIZE
        )
        return gym.wrappers.FrameStackObservation(env, ATARI_FRAME_STACK)
    if env_id.startswith("MinAtar/"):
        return gym.make(env_id, **{"max_episode_steps": MINATAR_MAX_EPISODE_STEPS, **kwargs})
    return gym.make(env_id, **kwargs)


def _uses_mujoco(env_id: str) -> bool:
    """True for Gymnasium's MuJoCo environments and any environment whose module already loaded MuJoCo."""
    if "mujoco" in sys.modules:
        return True
    spec = gym.registry.get(env_id)
    return spec is not None and "mujoco" in str(spec.entry_point)


_mujoco_messages: set[str] = set()


def route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to the log instead of MUJOCO_LOG.TXT, a file MuJoCo appends to in the working
    directory of every process that makes an environment. Each distinct message is logged once: deprecations
    in the models Gymnasium ships at DEBUG (nothing a user can act on), anything else (unstable simulation: NaN,
    Inf or huge values) at WARNING."""
    import mujoco

    def warn(message: str) -> None:
        if message in _mujoco_messages:
            return
        _mujoco_messages.add(message)
        level = logging.DEBUG if "is deprecated" in message else logging.WARNING
        log.log(level, "MuJoCo: %s", message.strip())

    mujoco.set_mju_user_warning(warn)


def make_vector_env(
    env: EnvChoice | str, num_envs: int, *, same_step_autoreset: bool = True
) -> gym.vector.VectorEnv:
    """`num_envs` copies of `make_env(env)` stepped together. With `same_step_autoreset` (exploring actors) a
    step that ends an episode returns the next episode's first observation and the last one in
    info["final_obs"], so every step yields one transition per copy. Without it (the evaluator, which ignores what
    follows an episode's end), an environment family's own vectorised implementation is used when it has one and
    needs no preprocessing nor arguments: Gymnasium's CartPoleVectorEnv steps 100 copies ~12x faster than 100
    Python ones."""
    from functools import partial

    choice = as_choice(env)
    import_env_modules(choice)
    env_id = choice.registered_id
    _register(env_id)
    if (
        not same_step_autoreset
        and not choice.kwargs
        and not is_atari(env_id)
        and not env_id.startswith("MinAtar/")
    ):
        spec = gym.spec(env_id) if env_id in gym.registry else None
        if spec is not None and spec.vector_entry_point is not None:
            return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    return gym.vector.SyncVectorEnv(
        [partial(make_env, choice) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


# Solve bars of environments whose registration has no reward_threshold but whose community has one.
USUAL_THRESHOLDS = {
    "Pendulum-v1": -150.0
}  # rl-baselines3-zoo's and most papers' bar; Gymnasium registers none


def reward_threshold(env: EnvChoice | str) -> float | None:
    """The return at which `env` counts as solved: the reward_threshold its registration gives (Gymnasium's, or
    gym 0.26's for an id only gym registers; a plugin module's own registration included), else the usual bar of
    `USUAL_THRESHOLDS` (None when neither has one, as the Atari and MinAtar games, or for an unknown id)."""
    choice = as_choice(env)
    try:
        import_env_modules(choice)
    except ValueError:
        return None
    env_id = choice.registered_id
    _register(env_id)
    spec = gym.registry.get(env_id)
    if spec is not None:
        threshold = spec.reward_threshold
    elif gym26_registered(env_id):
        threshold = gym26_reward_threshold(env_id)
    else:
        return None
    if threshold is None:
        return USUAL_THRESHOLDS.get(env_id)
    return float(threshold)


def env_spaces(env: EnvChoice | str) -> EnvSpaces:
    """Make `env` once and return its sizes; ValueError for an unknown id or unsupported spaces."""
    made = make_env(env)
    try:
        return check_spaces(made, as_choice(env).id)
    finally:
        made.close()


def import_env_modules(choice: EnvChoice) -> None:
    """Import the modules `choice` names (`--env-module`, and the module of a `module:Id` id) so that their
    registrations run. A module found neither on sys.path nor installed is looked for in the working directory
    last, as `python -m` would (the `apexrl` script does not put it on sys.path); ValueError naming the module.
    A choice read from a file (`trusted` false) imports nothing: ValueError naming its modules and how to allow
    them, since a run directory or a checkpoint must never run code unless the user says so."""
    if not choice.trusted and choice.all_modules:
        names = ", ".join(choice.all_modules)
        raise ValueError(
            f"the checkpoint names environment modules ({names}) whose import would run their code; name them "
            f"yourself (--env-module {','.join(choice.modules) or names}) or pass --trust-env-modules "
            f"(load_policy: make_env(trust_env_modules=True)) if you trust where this run directory came from"
        )
    for module in choice.all_modules:
        try:
            with _without_working_directory(choice.from_file):
                importlib.import_module(module)
        except ModuleNotFoundError as err:
            cwd = os.getcwd()
            if err.name != module.split(".")[0] or cwd in sys.path or choice.from_file:
                raise ValueError(f"cannot import environment module {module!r}: {err}") from None
            sys.path.append(cwd)
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as again:
                raise ValueError(
                    f"cannot import environment module {module!r}: {again} (install it, or put its "
                    f"folder on PYTHONPATH)"
                ) from None
            except Exception as again:
                raise ValueError(
                    f"environment module {module!r} failed to import: {_reason(again)}"
                ) from None
        except Exception as err:  # the module's own code
            raise ValueError(f"environment module {module!r} failed to import: {_reason(err)}") from None


@contextlib.contextmanager
def _without_working_directory(active: bool) -> Iterator[None]:
    """While a module named by a file is imported, sys.path holds neither the working directory nor '' (which
    `python -m` and `python -c` put first): a module lying beside a downloaded run directory is not found."""
    if not active:
        yield
        return
    saved = list(sys.path)
    cwd = os.getcwd()
    sys.path[:] = [entry for entry in saved if entry not in ("", ".", cwd)]
    try:
        yield
    finally:
        sys.path[:] = saved


def _one_hot_encoded(env: gym.Env | gym.vector.VectorEnv) -> bool:
    """Whether make_env one-hot encoded this environment's observations (of its first copy, for a vector one)."""
    inner = env.envs[0] if isinstance(env, gym.vector.VectorEnv) and getattr(env, "envs", None) else env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, OneHotObservation):
            return True
        inner = inner.env
    return False


def _reason(err: BaseException) -> str:
    """An exception in one line: gymnasium's own errors as their message, others with their type."""
    text = " ".join(str(err).split())
    if isinstance(err, gym.error.Error | ImportError | ValueError):
        return text
    return f"{type(err).__name__}: {text}"


def _register(env_id: str) -> None:
    """Register the environments apexrl ships (CartPoleNoVel-v1) and the optional families an id may belong to
    (ale-py, minatar) when their package is installed."""
    if env_id in gym.registry:
        return
    if env_id in NO_VELOCITY:
        base = gym.spec(NO_VELOCITY[env_id][0])
        gym.register(
            env_id,
            entry_point="apexrl.common.env_adapters:make_cartpole_no_velocity",
            max_episode_steps=base.max_episode_steps,
            reward_threshold=base.reward_threshold,
        )
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


def _extra_hint(env_id: str, err: BaseException | None = None) -> str:
    if isinstance(err, gym.error.DependencyNotInstalled) and "pygame" in str(err):
        return " (rendering needs the render extra: pip install 'apexrl[render]')"
    if env_id.startswith(("ALE/", "MinAtar/")):
        return " (Atari and MinAtar need the atari extra: pip install 'apexrl[atari]')"
    entry_point = str(getattr(gym.registry.get(env_id), "entry_point", ""))
    for family in ("mujoco", "box2d"):
        if entry_point.startswith(f"gymnasium.envs.{family}"):
            return f" (Gymnasium's {family} environments need the {family} extra: pip install 'apexrl[{family}]')"
    return ""

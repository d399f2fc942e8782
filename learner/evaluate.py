"""`apexrl evaluate`: play a learner checkpoint greedily and report its returns.

    apexrl evaluate runs/CartPole-v1-20250101-120000 --episodes 100 --seed 0
    apexrl evaluate runs/CartPole-v1-20250101-120000 --episodes 3 --record-video videos/

Prints one line per episode, then one JSON line: episodes, mean_return, std_return, min_return, max_return (and
videos, the files written, with --record-video), its floats rounded as in every apexrl JSON line
(`apexrl.common.report`). The environment is built as training built it: the checkpoint's id, plugin modules and
constructor arguments, through the same `make_env`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from apexrl.algorithms.checkpoint_files import weights_setting
from apexrl.common.env_settings import NO_KWARGS, EnvChoice, EnvKwargs
from apexrl.common.report import json_line, plural
from apexrl.common.settings import SettingsError, setting
from apexrl.common.spaces import EnvSpaces

log = logging.getLogger("apexrl.evaluate")


HELP = "play a learner checkpoint greedily and report its returns"
RENDER_HINT = "rendering needs pygame: pip install 'apexrl[render]'"
VIDEO_HINT = "--record-video needs moviepy: pip install 'apexrl[video]'"


@dataclass(frozen=True)
class EvaluateConfig:
    path: str = setting(
        help="a run directory (its kept policy, checkpoints/best.npz, or with --weights last its last "
        "checkpoint), or a checkpoint file",
        metavar="RUN_DIR_OR_CHECKPOINT",
        positional=True,
    )
    weights: str = weights_setting()
    episodes: int = setting(10, "greedy episodes to play")
    seed: int | None = setting(None, "episode k resets the environment with seed S + k (none: unseeded)")
    render: bool = setting(
        False,
        "show the episodes in a window (render_mode='human'; needs the render extra); "
        "off for headless machines",
    )
    record_video: str | None = setting(
        None,
        "write every episode as an MP4 file into this folder (Gymnasium's "
        "RecordVideo; needs the video extra); works on headless machines",
        metavar="DIR",
    )
    env: str | None = setting(
        None, "play this Gymnasium id instead of the checkpoint's own (same spaces required)"
    )
    env_module: tuple[str, ...] | None = setting(
        None,
        "modules to import before the environment is made (none: the checkpoint's own)",
        metavar="MODULES",
    )
    env_kwargs: EnvKwargs | None = setting(
        None,
        "constructor arguments of the environment, a JSON object (none: the ones it was trained with)",
        metavar="JSON",
    )
    trust_env_modules: bool = setting(
        False,
        "import the environment modules the checkpoint names (a `module:Id` id's too): importing runs their "
        "code, so a run directory from elsewhere runs none unless this is given or --env-module names them; "
        "never from the working directory",
    )

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes ({self.episodes}) must be at least 1")
        if self.render and self.record_video is not None:
            raise ValueError(
                "render and record_video exclude each other (a window, or frames for a video file)"
            )


CONFIG = EvaluateConfig


def run(args: EvaluateConfig, stop: threading.Event) -> int:
    import numpy as np

    from apexrl.common.environments import check_spaces
    from apexrl.learner.policy import load_policy

    try:
        policy = load_policy(args.path, args.weights)
    except (FileNotFoundError, ValueError) as err:
        raise SettingsError(str(err)) from None
    trained = policy.env  # another --env keeps the plugin modules but not the arguments meant for this one
    choice = EnvChoice(
        args.env or trained.id,
        trained.modules if args.env_module is None else args.env_module,
        args.env_kwargs if args.env_kwargs is not None else trained.kwargs if args.env is None else NO_KWARGS,
    )
    # Modules read from the checkpoint (its plugin modules, its `module:Id` id) run code only when trusted.
    from_file = (args.env_module is None and bool(trained.modules)) or (
        args.env is None and ":" in trained.id
    )
    if from_file:
        choice = choice.read_from_file()
        if args.trust_env_modules:
            choice = choice.trusting()
    env = _make(choice, args)
    try:
        spaces = check_spaces(env, choice.id)
    except ValueError as err:
        env.close()
        raise SettingsError(str(err)) from None
    saved = policy.spaces
    if (spaces.obs_dim, spaces.num_actions, spaces.action_low, spaces.action_high) != (
        saved.obs_dim,
        saved.num_actions,
        saved.action_low,
        saved.action_high,
    ):
        env.close()
        raise SettingsError(
            f"{choice.id} has observations of size {spaces.obs_dim} and {_actions(spaces)}; the "
            f"checkpoint's policy expects {saved.obs_dim} and {_actions(saved)}"
        )
    try:  # the actors' own code: the policy rebuilt from the weights the parameter service would publish
        policy.act(np.asarray(env.observation_space.sample()), policy.initial_state())
    except (ValueError, RuntimeError) as err:  # another environment's images, damaged weights
        env.close()
        raise SettingsError(f"{policy.path} does not fit {choice.id}: {err}") from None
    print(
        f"evaluating {policy.path} ({policy.algorithm}, {policy.describe()}) "
        f"on {choice.describe()} for {plural(args.episodes, 'greedy episode')}",
        flush=True,
    )
    returns = []
    try:
        for k in range(args.episodes):
            if stop.is_set():
                raise KeyboardInterrupt
            obs, _info = _reset(env, None if args.seed is None else args.seed + k, args)
            total, length, done = 0.0, 0, False
            state = policy.initial_state()  # a recurrent policy's memory, fresh for each episode
            while not done:
                action, state = policy.act(obs, state)
                obs, reward, terminated, truncated, _info = env.step(action)
                state = policy.observe(state, reward)
                total += float(reward)
                length += 1
                done = terminated or truncated
            returns.append(total)
            print(f"episode {k + 1}/{args.episodes}: return {total:.1f}, length {length}", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted after {plural(len(returns), 'episode')}", file=sys.stderr)
        if not returns:
            return 1
    finally:
        env.close()  # RecordVideo writes the last video here
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    summary = {
        "episodes": len(returns),
        "mean_return": mean,
        "std_return": std,
        "min_return": min(returns),
        "max_return": max(returns),
    }
    if args.record_video is not None:
        summary["videos"] = sorted(str(p) for p in Path(args.record_video).glob("*.mp4"))
    print(json_line(summary), flush=True)
    return 0


def _make(choice: EnvChoice, args: EvaluateConfig):
    """The environment as training built it, in the render mode the flags ask for, wrapped to record videos;
    SettingsError in one line naming the extra to install when rendering or recording cannot work."""
    import gymnasium as gym

    from apexrl.common.environments import make_env

    render_mode = "human" if args.render else "rgb_array" if args.record_video is not None else None
    if (
        render_mode is not None
    ):  # pygame's SDL: no sound to play; no window for frames only (headless machines)
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        if render_mode == "rgb_array":
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        env = make_env(choice, render_mode=render_mode)
    except ValueError as err:
        raise SettingsError(f"--env: {err}") from None
    if args.record_video is None:
        return env
    try:
        return gym.wrappers.RecordVideo(
            env, args.record_video, episode_trigger=lambda _: True, name_prefix=choice.run_name()
        )
    except gym.error.DependencyNotInstalled:
        env.close()
        raise SettingsError(VIDEO_HINT) from None
    except ValueError as err:  # an environment that renders no frames
        env.close()
        raise SettingsError(f"--record-video: {choice.id} cannot render frames: {err}") from None


def _reset(env, seed: int | None, args: EvaluateConfig):
    """env.reset, where rendering first happens (a window opens, a first frame is drawn): a missing pygame or a
    machine without a display is one line naming what to do, not a traceback."""
    import gymnasium as gym

    if not args.render and args.record_video is None:
        return env.reset(seed=seed)
    try:
        return env.reset(seed=seed)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        text = " ".join(str(err).split())
        raise SettingsError(RENDER_HINT if "pygame" in text.lower() else f"cannot render: {text}") from None
    except Exception as err:  # pygame.error and the like: no display to open a window on
        if not args.render:
            raise
        raise SettingsError(
            f"--render: cannot open a window ({type(err).__name__}: {err}); on a machine without a "
            f"display use --record-video DIR"
        ) from None


def _actions(spaces: EnvSpaces) -> str:
    if spaces.num_actions:
        return f"{spaces.num_actions} actions"
    return f"actions in {list(spaces.action_low)}..{list(spaces.action_high)}"

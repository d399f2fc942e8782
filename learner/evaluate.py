"""`apexrl evaluate`: play a learner checkpoint greedily and report its returns.

    apexrl evaluate runs/CartPole-v1-20250101-120000 --episodes 100 --seed 0

Prints one line per episode, then one JSON line: episodes, mean_return, std_return, min_return, max_return.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from dataclasses import dataclass

from apexrl.common.settings import SettingsError, setting
from apexrl.common.spaces import EnvSpaces

log = logging.getLogger("apexrl.evaluate")


HELP = "play a learner checkpoint greedily and report its returns"


@dataclass(frozen=True)
class EvaluateConfig:
    path: str = setting(help="a checkpoint file, or a run directory holding checkpoints/checkpoint.pt",
                        metavar="RUN_DIR_OR_CHECKPOINT", positional=True)
    episodes: int = setting(10, "greedy episodes to play")
    seed: int | None = setting(None, "episode k resets the environment with seed S + k (none: unseeded)")
    render: bool = setting(False, "show the episodes in a window (render_mode='human'); off for headless machines")
    env: str | None = setting(None, "play this Gymnasium id instead of the checkpoint's own (same spaces required)")

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes ({self.episodes}) must be at least 1")


CONFIG = EvaluateConfig


def run(args: EvaluateConfig, stop: threading.Event) -> int:
    import numpy as np

    from apexrl.algorithms.registry import get
    from apexrl.common.environments import check_spaces, make_env
    from apexrl.learner.checkpoint import load_checkpoint, resolve_checkpoint

    try:
        file = resolve_checkpoint(args.path)
        checkpoint = load_checkpoint(file)
        algorithm = get(checkpoint.algorithm)
    except (FileNotFoundError, ValueError) as err:
        raise SettingsError(str(err)) from None
    env_id = args.env or checkpoint.env_id
    try:  # the same preprocessing the actors played with (Atari frame stacks, ...)
        env = make_env(env_id, render_mode="human" if args.render else None)
        spaces = check_spaces(env, env_id)
    except ValueError as err:
        raise SettingsError(str(err)) from None
    saved = checkpoint.spaces
    if (spaces.obs_dim, spaces.num_actions, spaces.action_low, spaces.action_high) != \
            (saved.obs_dim, saved.num_actions, saved.action_low, saved.action_high):
        env.close()
        raise SettingsError(f"{env_id} has observations of size {spaces.obs_dim} and {_actions(spaces)}; the "
                            f"checkpoint's policy expects {saved.obs_dim} and {_actions(saved)}")
    try:  # the actors' own code: the policy rebuilt from the weights the parameter service would publish
        policy = algorithm.acting().make_policy(checkpoint.acting_weights, spaces)
        policy.greedy(np.asarray(env.observation_space.sample())[None])
    except (ValueError, RuntimeError) as err:  # another environment's images, damaged weights
        env.close()
        raise SettingsError(f"{file} does not fit {env_id}: {err}") from None
    print(f"evaluating {file} ({algorithm.name}, updates {checkpoint.updates}, weights v{checkpoint.weight_version}) "
          f"on {env_id} for {args.episodes} greedy episodes", flush=True)
    returns = []
    try:
        for k in range(args.episodes):
            if stop.is_set():
                raise KeyboardInterrupt
            obs, _info = env.reset(seed=None if args.seed is None else args.seed + k)
            total, length, done = 0.0, 0, False
            while not done:
                action = policy.greedy(np.asarray(obs)[None])[0]
                obs, reward, terminated, truncated, _info = env.step(action if action.ndim else int(action))
                total += float(reward)
                length += 1
                done = terminated or truncated
            returns.append(total)
            print(f"episode {k + 1}/{args.episodes}: return {total:.1f}, length {length}", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted after {len(returns)} episodes", file=sys.stderr)
        if not returns:
            return 1
    finally:
        env.close()
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    print(json.dumps({"episodes": len(returns), "mean_return": mean, "std_return": std,
                      "min_return": min(returns), "max_return": max(returns)}), flush=True)
    return 0


def _actions(spaces: EnvSpaces) -> str:
    if spaces.num_actions:
        return f"{spaces.num_actions} actions"
    return f"actions in {list(spaces.action_low)}..{list(spaces.action_high)}"

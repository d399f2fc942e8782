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
    import torch

    from apexrl.common.environments import check_spaces, make_env
    from apexrl.learner.checkpoint import load_checkpoint, resolve_checkpoint
    from apexrl.learner.networks import build_network

    try:
        file = resolve_checkpoint(args.path)
        checkpoint = load_checkpoint(file)
    except (FileNotFoundError, ValueError) as err:
        raise SettingsError(str(err)) from None
    env_id = args.env or checkpoint.env_id
    try:  # the same preprocessing the actors played with (Atari frame stacks, ...)
        env = make_env(env_id, render_mode="human" if args.render else None)
    except ValueError as err:
        raise SettingsError(str(err)) from None
    obs_dim = int(np.prod(env.observation_space.shape or (0,)))
    num_actions = getattr(env.action_space, "n", None)
    if obs_dim != checkpoint.obs_dim or num_actions != checkpoint.num_actions:
        env.close()
        raise SettingsError(f"{env_id} has observations of size {obs_dim} and {num_actions} actions; the "
                            f"checkpoint's network expects {checkpoint.obs_dim} and {checkpoint.num_actions}")
    try:
        net = build_network(checkpoint.network, check_spaces(env, env_id), checkpoint.hidden_sizes)
        net.load_state_dict(checkpoint.online)
    except (ValueError, RuntimeError) as err:  # another environment's images, a damaged state dict
        env.close()
        raise SettingsError(f"{file} does not fit {env_id}: {err}") from None
    net.eval()
    print(f"evaluating {file} (updates {checkpoint.updates}, weights v{checkpoint.weight_version}) on {env_id} "
          f"for {args.episodes} greedy episodes", flush=True)
    returns = []
    try:
        for k in range(args.episodes):
            if stop.is_set():
                raise KeyboardInterrupt
            obs, _info = env.reset(seed=None if args.seed is None else args.seed + k)
            total, length, done = 0.0, 0, False
            while not done:
                with torch.no_grad():
                    q = net(torch.as_tensor(np.asarray(obs)[None]))  # the network casts and scales
                obs, reward, terminated, truncated, _info = env.step(int(q.argmax(dim=1).item()))
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

"""`apexrl evaluate`: play a learner checkpoint greedily and report its returns.

    apexrl evaluate runs/CartPole-v1-20250101-120000 --episodes 100 --seed 0

Prints one line per episode, then one JSON line: episodes, mean_return, std_return, min_return, max_return.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys

log = logging.getLogger("apexrl.evaluate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a checkpoint file, or a run directory holding checkpoints/checkpoint.pt")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes to play (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None,
                        help="episode k resets the environment with seed S + k (default: unseeded)")
    render = parser.add_mutually_exclusive_group()
    render.add_argument("--render", action="store_const", const="human", dest="render_mode", default=None,
                        help="show the episodes in a window (render_mode='human')")
    render.add_argument("--render-none", action="store_const", const=None, dest="render_mode",
                        help="render nothing (the default; for headless machines and scripts)")
    parser.add_argument("--env", default=None,
                        help="play this Gymnasium id instead of the checkpoint's own (same spaces required)")


def run(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        print(f"apexrl evaluate: error: --episodes ({args.episodes}) must be at least 1", file=sys.stderr)
        return 2
    import gymnasium as gym
    import numpy as np
    import torch

    from apexrl.learner.checkpoint import load_checkpoint, resolve_checkpoint
    from apexrl.learner.networks import DuelingQNetwork

    try:
        file = resolve_checkpoint(args.path)
        checkpoint = load_checkpoint(file)
    except (FileNotFoundError, ValueError) as err:
        print(f"apexrl evaluate: error: {err}", file=sys.stderr)
        return 2
    env_id = args.env or checkpoint.env_id
    net = DuelingQNetwork(checkpoint.obs_dim, checkpoint.num_actions, checkpoint.hidden_sizes)
    net.load_state_dict(checkpoint.online)
    net.eval()
    env = gym.make(env_id, render_mode=args.render_mode)
    obs_dim = int(np.prod(env.observation_space.shape or (0,)))
    num_actions = getattr(env.action_space, "n", None)
    if obs_dim != checkpoint.obs_dim or num_actions != checkpoint.num_actions:
        env.close()
        print(f"apexrl evaluate: error: {env_id} has observations of size {obs_dim} and {num_actions} actions; "
              f"the checkpoint's network expects {checkpoint.obs_dim} and {checkpoint.num_actions}", file=sys.stderr)
        return 2
    print(f"evaluating {file} (updates {checkpoint.updates}, weights v{checkpoint.weight_version}) on {env_id} "
          f"for {args.episodes} greedy episodes", flush=True)
    returns = []
    try:
        for k in range(args.episodes):
            obs, _info = env.reset(seed=None if args.seed is None else args.seed + k)
            total, length, done = 0.0, 0, False
            while not done:
                with torch.no_grad():
                    q = net(torch.as_tensor(np.asarray(obs, dtype=np.float32).reshape(1, -1)))
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

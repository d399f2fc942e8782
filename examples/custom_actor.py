"""A custom actor written on the apexrl SDK only: plays CartPole with its own (random or greedy) policy and
streams 1-step transitions to a replay shard, pulling weights when a parameter service is given.

    python examples/custom_actor.py --replay 127.0.0.1:7000 [--params 127.0.0.1:7200] --steps 2000

Any language can do the same from protos/apexrl/proto/*.proto; the SDK adds batching, acknowledged streaming
with resend, and deadlines.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

from apexrl.actor import ParameterClient, ReplayClient
from apexrl.common.errors import UnavailableError


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replay", required=True, help="host:port of a replay shard")
    parser.add_argument("--params", default=None, help="host:port of a parameter service (optional)")
    parser.add_argument("--steps", type=int, default=2000, help="environment steps to play")
    parser.add_argument("--batch-size", type=int, default=64, help="transitions per insert")
    args = parser.parse_args()

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    replay = ReplayClient(args.replay)
    params = ParameterClient(args.params) if args.params else None
    version, weights = 0, None
    obs, _ = env.reset(seed=0)
    rows: list[tuple] = []
    for step in range(args.steps):
        if params is not None and step % 200 == 0:
            try:
                fetched = params.fetch(version)  # None when nothing newer: no bytes moved
            except UnavailableError:
                fetched = None  # keep acting with what we have
            if fetched is not None:
                version, weights = fetched
        action = int(rng.integers(env.action_space.n))  # a real actor would use `weights` here
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, reward, 0.0 if terminated else 0.99, next_obs))
        obs = env.reset()[0] if terminated or truncated else next_obs
        if len(rows) == args.batch_size:
            o, a, r, d, n = zip(*rows, strict=True)
            replay.insert(
                {
                    "obs": np.array(o, np.float32),
                    "action": np.array(a, np.int64),
                    "reward": np.array(r, np.float32),
                    "discount": np.array(d, np.float32),
                    "next_obs": np.array(n, np.float32),
                },
                priorities=np.ones(len(rows)),  # or |TD error| from your own network
            )
            rows.clear()
    replay.flush()  # wait for the shard's acknowledgements
    info = replay.info()
    print(f"shard holds {info.size} rows; weights version {version}")
    replay.close()
    if params is not None:
        params.close()


if __name__ == "__main__":
    main()

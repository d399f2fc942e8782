"""A custom actor written on the apexrl SDK only: plays CartPole with its own (random or greedy) policy and
streams 1-step transitions to the replay shards, pulling weights when a parameter service is given.

    python examples/custom_actor.py --replay 127.0.0.1:7000,127.0.0.1:7001 [--params 127.0.0.1:7200] --steps 2000

`--replay` takes every shard's host:port, or dns:///NAME:PORT for every address NAME resolves to. A fleet that
requires a bearer token needs `--token-file` (or APEXRL_TOKEN): a local `apexrl launch` given none makes one and
keeps it in RUN_DIR/token (its shards' ports are in RUN_DIR/ports/, the parameter service's in config.json). Any language can
do the same from protos/apexrl/proto/*.proto; the SDK adds batching, acknowledged streaming with resend,
deadlines, and (ShardedWriter) round-robin over the shards with failover and back pressure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from apexrl.actor import ParameterClient, ShardedWriter
from apexrl.common.errors import UnavailableError


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--replay", required=True, help="comma-separated host:port of the replay shards (or dns:///NAME:PORT)"
    )
    parser.add_argument("--params", default=None, help="host:port of a parameter service (optional)")
    parser.add_argument("--steps", type=int, default=2000, help="environment steps to play")
    parser.add_argument("--batch-size", type=int, default=64, help="transitions per insert")
    parser.add_argument("--actor-index", type=int, default=0, help="this actor's number: its first shard")
    parser.add_argument(
        "--token-file",
        default=None,
        help="file holding the fleet's bearer token, e.g. RUN_DIR/token of a local `apexrl launch` "
        "(default: the APEXRL_TOKEN environment variable, else no token)",
    )
    args = parser.parse_args()
    # From a file or the environment, never a flag's value: every local user can read a command line.
    token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("APEXRL_TOKEN")

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    # One batch to each shard in turn (from shard actor_index mod S); a shard that is down is skipped until it is
    # back, and inserts wait when every shard's backlog is full.
    replay = ShardedWriter(args.replay.split(","), first_shard=args.actor_index, token=token)
    params = ParameterClient(args.params, token=token) if args.params else None
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
                    # The weights the actions came from: a launched fleet's shards require this column too.
                    "weight_version": np.full(len(rows), version, np.int64),
                },
                priorities=np.ones(len(rows)),  # or |TD error| from your own network
            )
            rows.clear()
    replay.flush()  # wait for the shards' acknowledgements
    sizes = [shard.info().size for shard in replay.shards]
    print(
        f"{len(sizes)} shards hold {sum(sizes)} rows ({', '.join(map(str, sizes))}); weights version {version}"
    )
    replay.close()
    if params is not None:
        params.close()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback
        print("interrupted", file=sys.stderr)
        sys.exit(130)

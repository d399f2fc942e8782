"""The rows the replay benchmarks insert: CartPole-size (48 B) and Atari-size (56,464 B) transitions with
priorities. Numpy only: the cpprb worker imports this under an interpreter with just numpy and cpprb."""

from __future__ import annotations

import numpy as np

SAMPLE_BATCH = 256
UPDATE_BATCH = 256
FILL_BATCH = 16384  # rows per insert while filling a shard or table to capacity


def cartpole_batch(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((rows, 4), dtype=np.float32),
        "action": rng.integers(0, 2, rows).astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.99**3, dtype=np.float32),
        "next_obs": rng.standard_normal((rows, 4), dtype=np.float32),
    }


def atari_batch(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.integers(0, 256, (rows, 84, 84, 4), dtype=np.uint8),
        "action": rng.integers(0, 18, rows).astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.99**3, dtype=np.float32),
        "next_obs": rng.integers(0, 256, (rows, 84, 84, 4), dtype=np.uint8),
    }


WORKLOADS = {"cartpole": cartpole_batch, "atari": atari_batch}


def pong_transitions(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`count` real Pong transitions as the built-in actor makes them (uint8 [4, 84, 84] frame stacks, 3-step
    returns, random actions), played now with ale-py: random bytes do not compress, real frames do. Needs the
    `atari` extra (imported here only, so the cpprb worker never needs it)."""
    from apexrl.algorithms.nstep import NStepWriter, item_columns
    from apexrl.common.environments import make_env

    env = make_env("ALE/Pong-v5")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    accumulator = NStepWriter(3, 0.99)
    transitions = []
    while len(transitions) < count:
        action = int(rng.integers(env.action_space.n))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        transitions += accumulator.push(
            obs, action, float(np.clip(reward, -1, 1)), next_obs, terminated, truncated
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    columns = item_columns(transitions[:count])
    columns["weight_version"] = np.zeros(count, dtype=np.int64)
    return columns


def row_nbytes(batch: dict[str, np.ndarray]) -> int:
    rows = len(next(iter(batch.values())))
    return sum(a.nbytes for a in batch.values()) // rows


def priorities(rows: int, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
    return (rng.random(rows) + 0.01).astype(dtype)

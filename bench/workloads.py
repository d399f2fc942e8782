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


def row_nbytes(batch: dict[str, np.ndarray]) -> int:
    rows = len(next(iter(batch.values())))
    return sum(a.nbytes for a in batch.values()) // rows


def priorities(rows: int, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
    return (rng.random(rows) + 0.01).astype(dtype)

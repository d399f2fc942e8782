"""The learner benchmark's feeds: the same synthetic CartPole rows in 2 replay shards (own processes, gRPC)
and in 2 in-process ReplayTables, checked identical; the sampler of each mode; and the reference (one batch
reused)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

OBS_DIM, NUM_ACTIONS = 4, 2  # CartPole
FILL_BATCH = 5_000

Rows = tuple[dict[str, np.ndarray], np.ndarray]  # columns and raw priorities of one shard


def shard_rows(shard: int, rows: int, seed: int) -> Rows:
    """Synthetic CartPole n-step transitions (3-step, 5 % terminal) and raw priorities of one shard."""
    rng = np.random.default_rng([seed, shard])
    steps = rng.integers(1, 4, rows)
    terminal = rng.random(rows) < 0.05
    columns = {
        "obs": (rng.standard_normal((rows, OBS_DIM)) * 0.5).astype(np.float32),
        "action": rng.integers(0, NUM_ACTIONS, rows).astype(np.int64),
        "reward": ((1 - 0.99**steps) / 0.01).astype(np.float32),  # 1 + 0.99 + ... for k steps
        "discount": np.where(terminal, 0.0, 0.99**steps).astype(np.float32),
        "next_obs": (rng.standard_normal((rows, OBS_DIM)) * 0.5).astype(np.float32),
    }
    priorities = (rng.exponential(1.0, rows) + 1e-3).astype(np.float32)
    return columns, priorities


def batches(columns: dict[str, np.ndarray], priorities: np.ndarray) -> Iterator[Rows]:
    rows = len(priorities)
    for start in range(0, rows, FILL_BATCH):
        end = min(rows, start + FILL_BATCH)
        yield {k: v[start:end] for k, v in columns.items()}, priorities[start:end]


def fill_shards(addresses: Sequence[str], data: Sequence[Rows]) -> float:
    """Insert each shard's rows through the SDK; returns the seconds it took."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    t0 = time.perf_counter()
    for address, (columns, pri) in zip(addresses, data, strict=True):
        with ReplayClient(address, timeout=120) as client:
            for batch, p in batches(columns, pri):
                client.insert(batch, p)
            client.flush(120)
    return time.perf_counter() - t0


def build_tables(data: Sequence[Rows], capacity: int, alpha: float, seed: int) -> list:
    """In-process tables with the shards' TableConfig and seeds, filled with the same rows in the same
    batches."""
    from apexrl.replay_server.core.table import ReplayTable, TableConfig

    tables = []
    for i, (columns, pri) in enumerate(data):
        table = ReplayTable(TableConfig(capacity=capacity, alpha=alpha, seed=seed + i))
        for batch, p in batches(columns, pri):
            table.insert(batch, p)
        tables.append(table)
    return tables


def reset_priorities(addresses: Sequence[str], tables: Sequence, data: Sequence[Rows]) -> None:
    """Set every row's priority back to its initial value, on the shards and in the tables."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    for address, table, (_, pri) in zip(addresses, tables, data, strict=True):
        keys = np.arange(len(pri), dtype=np.uint64)
        with ReplayClient(address, timeout=60) as client:
            client.update_priorities(keys, pri, incarnation=0)
        table.update_priorities(keys, pri)


def check_same_contents(addresses: Sequence[str], tables: Sequence, data: Sequence[Rows]) -> dict:
    """Both sides hold the same rows: equal size, total and min priority; sampled rows equal the source, and
    with the same seed each shard and its table draw the same rows."""
    out = [
        _check_pair(address, table, columns)
        for address, table, (columns, _) in zip(addresses, tables, data, strict=True)
    ]
    return {"shards": out, "identical": True}


def _check_pair(address: str, table, columns: dict[str, np.ndarray]) -> dict:
    from apexrl.replay_server.client.replay_client import ReplayClient

    with ReplayClient(address, timeout=60) as client:
        remote = client.info()
        sample = client.sample(256)
    local = table.info()
    for side, info in (("shard", remote), ("table", local)):
        if info.size != len(columns["obs"]):
            raise RuntimeError(f"{side} {address} holds {info.size} rows, expected {len(columns['obs'])}")
    if (remote.size, remote.total_priority, remote.min_priority) != (
        local.size,
        local.total_priority,
        local.min_priority,
    ):
        raise RuntimeError(
            f"shard {address} and its in-process table differ: "
            f"{remote.size}/{remote.total_priority!r}/{remote.min_priority!r} vs "
            f"{local.size}/{local.total_priority!r}/{local.min_priority!r}"
        )
    keys = sample.keys.astype(np.int64)
    for name, col in columns.items():
        if not np.array_equal(sample.columns[name], col[keys]):
            raise RuntimeError(f"shard {address}: sampled column {name} differs from the inserted rows")
    if not np.array_equal(table.sample(256).keys, sample.keys):  # both sampling RNGs stay in step
        raise RuntimeError(f"shard {address} and its in-process table drew different rows")
    return {"size": remote.size, "total_priority": remote.total_priority, "min_priority": remote.min_priority}


def grpc_sampler(config):
    """The learner's own sampler: `make_sampler(config)` over the shards' addresses: a sampler process
    (`config.sampler_process`) or a ShardedReplayClient sampled by a thread of the learner."""
    from apexrl.learner.learner import make_sampler

    return make_sampler(config)


def in_process_sampler(config, shards: Sequence):
    """The learner's ShardedReplayClient with in-process shards in place of the addresses: the same arguments
    (deadline, seed, priority coalescing); only the transport differs. `ThreadFeed(it, config)` feeds a Learner."""
    from apexrl.learner.sampler_process import replay_sampler

    return replay_sampler(config, shards)


def check_same_batches(config, shards: Sequence) -> bool:
    """The gRPC and the in-process sampler, same seeds, draw the same prioritized batch: keys, shards,
    probabilities, importance weights and columns."""
    from apexrl.learner.sampler_process import replay_sampler

    with replay_sampler(config) as client:
        remote = client.sample(config.batch_size, beta=0.4)
    with in_process_sampler(config, shards) as sampler:
        local = sampler.sample(config.batch_size, beta=0.4)
    for name in ("keys", "shard_ids", "probabilities", "weights"):
        if not np.array_equal(getattr(remote, name), getattr(local, name)):
            raise RuntimeError(f"gRPC and in-process batches differ in {name}")
    for name, col in remote.columns.items():
        if not np.array_equal(col, local.columns[name]):
            raise RuntimeError(f"gRPC and in-process batches differ in column {name}")
    return True


class ReusedBatchSampler:
    """Reference: the same pre-sampled batch every time, priority updates dropped (free replay)."""

    def __init__(self, batch) -> None:
        self.batch = batch
        self.fleet_size = batch.fleet_size
        self.updates_stale = self.updates_dropped = 0

    def refresh(self, *, timeout: float | None = None) -> None:
        return None

    def sample(self, batch_size: int, *, beta: float = 0.4, timeout: float | None = None):
        return self.batch

    def sample_batches(
        self, batch_size: int, batches: int, *, beta: float = 0.4, timeout: float | None = None
    ):
        return [self.batch] * batches

    def update_priorities(self, batch, priorities) -> None:
        return None

    def flush_updates(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None

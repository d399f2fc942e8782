"""What the learner's unit tests inject: an in-process stand-in for ShardedReplayClient (it hands out hand-made
batches and records every call), a recording publish callable, and a small learner built on both."""

from __future__ import annotations

import threading

import numpy as np
import torch

from apexrl.common.spaces import EnvSpaces
from apexrl.learner.config import LearnerConfig
from apexrl.learner.feed import ThreadFeed
from apexrl.learner.learner import Learner
from apexrl.learner.sharded_client import PrioritizedBatch


def make_batch(
    keys,
    obs_dim: int = 4,
    num_actions: int = 2,
    shards: int = 2,
    seed: int = 0,
    row_version: int | None = None,
    action_dim: int | None = None,
) -> PrioritizedBatch:
    """A CartPole-shaped batch: row j has key keys[j], lives on shard keys[j] % shards, and its columns, probability
    and weight are functions of its key (so a row can be recognised after shuffling). With `row_version`, every
    row also carries that weight_version; with `action_dim`, actions are float32 vectors in [-1, 1] (a Box)."""
    keys = np.asarray(keys, dtype=np.uint64)
    k = keys.astype(np.int64)
    rng = np.random.default_rng(seed)
    versions = {} if row_version is None else {"weight_version": np.full(len(k), row_version, dtype=np.int64)}
    return PrioritizedBatch(
        columns={
            **versions,
            "obs": (rng.normal(size=(len(k), obs_dim)) + k[:, None]).astype(np.float32),
            "action": (k % num_actions).astype(np.int64)
            if action_dim is None
            else np.sin(k[:, None] + np.arange(action_dim)).astype(np.float32),
            "reward": (k % 3).astype(np.float32),
            "discount": np.where(k % 5 == 0, 0.0, 0.97).astype(np.float32),
            "next_obs": rng.normal(size=(len(k), obs_dim)).astype(np.float32),
        },
        shard_ids=(k % shards).astype(np.int32),
        keys=keys,
        probabilities=1.0 / (k + 10.0),
        weights=(1.0 / (1.0 + (k % 7))).astype(np.float32),
        incarnations=tuple(101 + s for s in range(shards)),
        fleet_size=1000,
    )


class FakeSampler:
    """sample_batches / refresh / fleet_size / update_priorities / flush_updates / close, as the learner uses them.

    `fleet_sizes` are the successive values refresh() reports; `failures` are exceptions a draw raises first.
    Batches hold consecutive keys in the order they were drawn (`drawn`); `sample_calls` records each draw as
    (batch_size, batches, beta)."""

    def __init__(
        self,
        *,
        fleet_sizes=(1000,),
        failures=(),
        obs_dim: int = 4,
        row_version: int | None = None,
        action_dim: int | None = None,
    ) -> None:
        self.row_version = row_version
        self.action_dim = action_dim
        self._lock = threading.Lock()
        self._fleet_sizes = list(fleet_sizes)
        self.fleet_size = 0
        self.refreshes = 0
        self.failures = list(failures)
        self.obs_dim = obs_dim
        self.sample_calls: list[tuple[int, int, float]] = []  # (batch_size, batches, beta)
        self.drawn: list[PrioritizedBatch] = []
        self.updates: list[tuple[PrioritizedBatch, np.ndarray]] = []
        self.flushed = 0
        self.closed = False
        self.updates_stale = 0
        self.updates_dropped = 0
        self.updates_outstanding = 0
        self._next_key = 0

    def refresh(self, *, timeout: float | None = None) -> None:
        with self._lock:
            self.refreshes += 1
            if self._fleet_sizes:
                self.fleet_size = self._fleet_sizes.pop(0)

    def sample(self, batch_size: int, *, beta: float = 0.4, timeout: float | None = None) -> PrioritizedBatch:
        return self.sample_batches(batch_size, 1, beta=beta, timeout=timeout)[0]

    def sample_batches(
        self, batch_size: int, batches: int, *, beta: float = 0.4, timeout: float | None = None
    ) -> list[PrioritizedBatch]:
        with self._lock:
            self.sample_calls.append((batch_size, batches, beta))
            if self.failures:
                raise self.failures.pop(0)
            drawn = []
            for _ in range(batches):
                drawn.append(
                    make_batch(
                        range(self._next_key, self._next_key + batch_size),
                        obs_dim=self.obs_dim,
                        seed=self._next_key,
                        row_version=self.row_version,
                        action_dim=self.action_dim,
                    )
                )
                self._next_key += batch_size
            self.drawn.extend(drawn)
            return drawn

    def update_priorities(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
        self.updates.append((batch, np.asarray(priorities)))

    def flush_updates(self, timeout: float | None = None) -> None:
        self.flushed += 1

    def close(self) -> None:
        self.closed = True


class Publisher:
    """The publish callable: records (version asked, weights) and answers the version it stored."""

    def __init__(self) -> None:
        self.published: list[tuple[int, dict[str, np.ndarray]]] = []

    def __call__(self, weights: dict[str, np.ndarray], version: int) -> int:
        self.published.append((version, weights))
        return version


def config(tmp_path=None, **changes) -> LearnerConfig:
    values = {
        "replay": ("fake:1",),
        "device": "cpu",
        "seed": 0,
        "hidden_sizes": (16,),
        "batch_size": 8,
        "learning_rate": 1e-2,
        "target_update_period": 3,
        "publish_every": 2,
        "min_replay_size": 1,
        "beta_start": 0.4,
        "beta_end": 1.0,
        "beta_anneal_updates": 10,
        "prefetch_depth": 2,
        "sample_batches_per_call": 1,
        "run_dir": str(tmp_path) if tmp_path else None,
        **changes,
    }
    return LearnerConfig(**values)


def learner(cfg: LearnerConfig, sampler: FakeSampler | None = None) -> tuple[Learner, FakeSampler, Publisher]:
    sampler = sampler or FakeSampler()
    publish = Publisher()
    return Learner(cfg, EnvSpaces.vector(4, 2), ThreadFeed(sampler, cfg), publish), sampler, publish


def params(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

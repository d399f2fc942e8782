#!/usr/bin/env python
"""Learner benchmark: updates/s fed by 2 replay shards over gRPC versus an in-process buffer of the same contents.

One run:

  1. starts 2 replay shards in their own processes (`python -m apexrl.launcher replay --port 0 --port-file F`,
     what operators run) and fills each through the SDK `ReplayClient` with `--rows` synthetic CartPole-shaped
     n-step transitions (obs float32[4], action int64, reward float32, discount float32, next_obs float32[4])
     with random priorities, from a fixed seed;
  2. builds the in-process equivalent: two `ReplayTable`s with the same `TableConfig` (capacity, alpha) filled
     with the same rows and priorities in the same batches, checks that both sides hold the same rows (same
     size, total and minimum priority; sampled rows equal the source rows), and wraps the tables in
     `InProcessShardedSampler`, a `ShardedReplayClient` whose transport is a method call: same lock, views,
     multinomial allocation across tables and (inherited, not copied) `_assemble` importance-weight math;
  3. measures the real `Learner.run` loop (`Learner.train_step` fed by the real `Prefetcher`, weights published
     into an in-process `WeightStore`, `torch.set_num_threads(1)`, CPU) with `--batch-size` 256 in phases of
     `--warmup` + `--seconds`, alternating the modes (gRPC, in-process, gRPC, in-process, ...) to cancel drift.
     Each phase gets a fresh Learner with the same seed, and every shard/table's priorities are reset to the
     initial ones before it, so each phase starts from identical contents;
  4. (unless `--no-reference`) a reference phase where the Prefetcher hands out one pre-sampled batch again and
     again: the learner's speed with free sampling, the ceiling of both modes on this machine.

Per phase it records updates/s, the fraction of wall time the train loop waited for a batch (sample wait) and
spent in train_step, and the CPU seconds of the learner process (all threads) and of each shard process
(/proc/<pid>/stat). The summary is the ratio distributed / in-process (total updates / total measured seconds per
mode) against the issue's target (>= 0.85), plus the per-round ratios.

    /work/venv/bin/python bench/learner_bench.py --json /tmp/learner_bench.json    # full run, ~1.5 minutes
    /work/venv/bin/python bench/learner_bench.py --quick                           # smoke run, ~20 s

Progress goes to stderr, the table to stdout; `--json PATH` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_bench import Child, metadata, process_cpu_seconds, progress  # noqa: E402  (same directory)

TARGET_RATIO = 0.85  # the issue: distributed >= 85 % of the in-process rate
OBS_DIM, NUM_ACTIONS = 4, 2  # CartPole
FILL_BATCH = 5_000
MODES = ("grpc", "inprocess")
MODE_NAMES = {
    "grpc": "gRPC, 2 shard processes",
    "inprocess": "in-process, 2 tables",
    "reference": "reference: one batch reused",
}


# --------------------------------------------------------------------------------------------------- the data


def shard_rows(shard: int, rows: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
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


def batches(columns: dict[str, np.ndarray], priorities: np.ndarray):
    rows = len(priorities)
    for start in range(0, rows, FILL_BATCH):
        end = min(rows, start + FILL_BATCH)
        yield {k: v[start:end] for k, v in columns.items()}, priorities[start:end]


# ------------------------------------------------------------------------------------- the in-process sampler


def _in_process_sampler_class():
    """Defined lazily so `--help` does not import torch/grpc."""
    from apexrl.common.errors import FailedPreconditionError
    from apexrl.learner.sharded_client import PrioritizedBatch, ShardedReplayClient, _ShardView
    from apexrl.replay_server.table import ReplayTable
    from apexrl.replay_server.wire import SampledBatch

    class InProcessShardedSampler(ShardedReplayClient):
        """A ShardedReplayClient whose shards are in-process ReplayTables (the surface Learner and Prefetcher
        use: sample, update_priorities, fleet_size, refresh, flush_updates, the update counters, close).

        Inherited unchanged: `sample` (argument check, refresh when empty, the lock), `fleet_size`, `_live` and
        `_assemble` (fleet-wide probabilities and importance weights). Replaced: the transport. `_sample_locked`
        does the same allocation as ShardedReplayClient (multinomial over the shards' totals) but calls
        `ReplayTable.sample` instead of a Sample RPC, one table after the other; `update_priorities` calls
        `ReplayTable.update_priorities` synchronously in the caller's thread instead of queueing on a stream.
        """

        def __init__(self, tables: Sequence[ReplayTable], *, seed: int | None = None) -> None:
            # Not super().__init__(): that opens one gRPC channel and one priority stream per address.
            self.tables = list(tables)
            self.shards = [SimpleNamespace(address=f"in-process-{i}") for i in range(len(self.tables))]
            self.timeout = 10.0
            self.max_backoff = 10.0
            self._views = [_ShardView() for _ in self.tables]
            self._rng = np.random.default_rng(seed)
            self._lock = threading.Lock()
            self._applied = 0
            self._stale = 0

        def refresh(self, *, timeout: float | None = None) -> None:
            for view, table in zip(self._views, self.tables, strict=True):
                info = table.info()
                view.observe(info.total_priority, info.size, info.min_priority, info.incarnation)
                view.min_size = info.min_size_to_sample

        def _sample_locked(self, batch_size: int, beta: float, timeout: float | None) -> PrioritizedBatch:
            live = self._live()
            if not live:
                self.refresh()
                live = self._live()
                if not live:
                    raise FailedPreconditionError("no in-process table can be sampled")
            mass = np.array([self._views[s].total for s in live])
            if mass.sum() <= 0:
                mass = np.array([float(self._views[s].size) for s in live])
            share = mass / mass.sum()
            counts = self._rng.multinomial(batch_size, share)
            parts: dict[int, tuple[float, SampledBatch]] = {}
            for s, sh, k in zip(live, share, counts, strict=True):
                if k == 0:
                    continue
                r = self.tables[s].sample(int(k), timeout=self.timeout if timeout is None else timeout)
                part = SampledBatch(keys=r.keys, priorities=r.priorities, columns=r.columns,
                                    total_priority=r.total_priority, size=r.size, min_priority=r.min_priority,
                                    incarnation=r.incarnation)
                parts[s] = (float(sh), part)
                self._views[s].observe(part.total_priority, part.size, part.min_priority, part.incarnation)
            return self._assemble(parts, beta)

        def update_priorities(self, batch: PrioritizedBatch, priorities: np.ndarray) -> None:
            priorities = np.asarray(priorities, dtype=np.float64)
            if priorities.shape != batch.keys.shape:
                raise ValueError(f"priorities {list(priorities.shape)} must match the batch "
                                 f"{list(batch.keys.shape)}")
            for s in np.unique(batch.shard_ids):
                mask = batch.shard_ids == s
                applied, stale = self.tables[s].update_priorities(batch.keys[mask], priorities[mask],
                                                                  batch.incarnations[s])
                self._applied += applied
                self._stale += stale

        @property
        def updates_applied(self) -> int:
            return self._applied

        @property
        def updates_stale(self) -> int:
            return self._stale

        @property
        def updates_dropped(self) -> int:
            return 0

        @property
        def update_errors(self) -> int:
            return 0

        def flush_updates(self, timeout: float | None = None) -> None:
            return None

        def close(self) -> None:
            return None

    return InProcessShardedSampler


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

    def update_priorities(self, batch, priorities) -> None:
        return None

    def flush_updates(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


# --------------------------------------------------------------------------------------------- measurement


@dataclass
class Phase:
    index: int
    mode: str
    round: int
    updates: int = 0
    seconds: float = 0.0
    updates_per_s: float = 0.0
    sample_wait_fraction: float = 0.0  # wall time the loop spent in Prefetcher.get, per measured second
    train_step_fraction: float = 0.0  # wall time in Learner.train_step, per measured second
    sample_wait_ms: float = 0.0  # per update
    train_step_ms: float = 0.0  # per update
    learner_cpu_s: float = 0.0  # this process, all threads, during the measured window
    shard_cpu_s: list[float] = field(default_factory=list)  # each shard process, same window
    load_average_1min: float = 0.0  # at the end of the phase
    priority_updates_dropped: int = 0
    updates_before_window: int = 0


def snapshot(learner, registry, shard_pids: Sequence[int]) -> dict:
    return {
        "wall": time.perf_counter(),
        "updates": learner.updates,
        "wait": registry.get_sample_value("apexrl_learner_sample_wait_seconds_sum") or 0.0,
        "step": registry.get_sample_value("apexrl_learner_train_step_seconds_sum") or 0.0,
        "cpu": time.process_time(),
        "shards": [process_cpu_seconds(pid) for pid in shard_pids],
    }


def join_prefetch_threads(timeout: float = 5.0) -> None:
    """Learner.run stops its Prefetcher without joining it; join here so it cannot run into the next phase."""
    for thread in threading.enumerate():
        if thread.name == "apexrl-prefetch":
            thread.join(timeout)


def warm_up_torch(make_config: Callable, batch, steps: int = 30) -> None:
    from apexrl.learner.learner import Learner
    from apexrl.parameter_server.store import WeightStore

    learner = Learner(make_config(), WeightStore().publish)
    learner.sampler.close()
    learner.sampler = ReusedBatchSampler(batch)
    for _ in range(steps):
        learner.train_step(batch)


def run_phase(phase: Phase, make_config: Callable, sampler, shard_pids: Sequence[int], warmup: float,
              seconds: float) -> Phase:
    """One fresh Learner running `Learner.run` for warmup + seconds; figures from the measured window only.
    `sampler` None keeps the Learner's own ShardedReplayClient (gRPC), otherwise it replaces it."""
    from prometheus_client import CollectorRegistry

    from apexrl.learner.learner import Learner
    from apexrl.parameter_server.store import WeightStore

    registry = CollectorRegistry()
    store = WeightStore()
    learner = Learner(make_config(), store.publish, registry)
    if sampler is not None:
        learner.sampler.close()  # the gRPC client the constructor opened
        learner.sampler = sampler
    stop = threading.Event()
    marks: list[dict] = []

    def monitor() -> None:
        if stop.wait(warmup):
            return
        marks.append(snapshot(learner, registry, shard_pids))
        if stop.wait(seconds):
            return
        marks.append(snapshot(learner, registry, shard_pids))
        stop.set()

    watcher = threading.Thread(target=monitor, name="bench-monitor", daemon=True)
    watcher.start()
    try:
        learner.run(stop, progress_every=1e9)
    finally:
        stop.set()
        watcher.join()
        dropped = learner.sampler.updates_dropped
        learner.close()
        join_prefetch_threads()
    if len(marks) != 2:
        raise RuntimeError(f"phase {phase.index} ({phase.mode}) ended before its measured window")
    a, b = marks
    wall = b["wall"] - a["wall"]
    n = b["updates"] - a["updates"]
    phase.updates, phase.seconds = n, wall
    phase.updates_per_s = n / wall
    phase.sample_wait_fraction = (b["wait"] - a["wait"]) / wall
    phase.train_step_fraction = (b["step"] - a["step"]) / wall
    phase.sample_wait_ms = (b["wait"] - a["wait"]) / max(1, n) * 1e3
    phase.train_step_ms = (b["step"] - a["step"]) / max(1, n) * 1e3
    phase.learner_cpu_s = b["cpu"] - a["cpu"]
    phase.shard_cpu_s = [y - x for x, y in zip(a["shards"], b["shards"], strict=True)]
    phase.load_average_1min = os.getloadavg()[0]
    phase.priority_updates_dropped = dropped
    phase.updates_before_window = a["updates"]
    return phase


# ----------------------------------------------------------------------------------------------------- bench


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.phases: list[Phase] = []
        self.contents: dict = {}
        self.fill_seconds = 0.0

    def start_shards(self, workdir: str) -> list[Child]:
        a = self.args
        children = []
        for i in range(2):
            children.append(Child(f"shard-{i}", [
                sys.executable, "-m", "apexrl.launcher", "--log-level", "WARNING", "replay",
                "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
                "--capacity", str(a.capacity), "--alpha", str(a.alpha), "--seed", str(a.seed + i),
            ], workdir))
        return children

    def fill(self, addresses: Sequence[str], data) -> None:
        from apexrl.actor import ReplayClient

        t0 = time.perf_counter()
        for address, (columns, pri) in zip(addresses, data, strict=True):
            with ReplayClient(address, timeout=120) as client:
                for batch, p in batches(columns, pri):
                    client.insert(batch, p)
                client.flush(120)
        self.fill_seconds = time.perf_counter() - t0

    def build_tables(self, data):
        from apexrl.replay_server.table import ReplayTable, TableConfig

        tables = []
        for i, (columns, pri) in enumerate(data):
            table = ReplayTable(TableConfig(capacity=self.args.capacity, alpha=self.args.alpha,
                                            seed=self.args.seed + i))
            for batch, p in batches(columns, pri):
                table.insert(batch, p)
            tables.append(table)
        return tables

    def reset_priorities(self, addresses: Sequence[str], tables, data) -> None:
        """Set every row's priority back to its initial value, on the shards and in the tables."""
        from apexrl.actor import ReplayClient

        for address, table, (_, pri) in zip(addresses, tables, data, strict=True):
            keys = np.arange(len(pri), dtype=np.uint64)
            with ReplayClient(address, timeout=60) as client:
                client.update_priorities(keys, pri)
            table.update_priorities(keys, pri)

    def check_same_contents(self, addresses: Sequence[str], tables, data) -> dict:
        """Both sides hold the same rows: equal size, total and min priority; sampled rows equal the source."""
        from apexrl.actor import ReplayClient

        out = []
        for address, table, (columns, _) in zip(addresses, tables, data, strict=True):
            with ReplayClient(address, timeout=60) as client:
                remote = client.info()
                sample = client.sample(256)
            local = table.info()
            for side, info in (("shard", remote), ("table", local)):
                if info.size != len(columns["obs"]):
                    raise RuntimeError(f"{side} {address} holds {info.size} rows, expected {len(columns['obs'])}")
            same = (remote.size == local.size and remote.total_priority == local.total_priority
                    and remote.min_priority == local.min_priority)
            if not same:
                raise RuntimeError(f"shard {address} and its in-process table differ: "
                                   f"{remote.size}/{remote.total_priority!r}/{remote.min_priority!r} vs "
                                   f"{local.size}/{local.total_priority!r}/{local.min_priority!r}")
            keys = sample.keys.astype(np.int64)
            for name, col in columns.items():
                if not np.array_equal(sample.columns[name], col[keys]):
                    raise RuntimeError(f"shard {address}: sampled column {name} differs from the inserted rows")
            # Same seed and contents: the table draws the same rows (and both sampling RNGs stay in step).
            if not np.array_equal(table.sample(256).keys, sample.keys):
                raise RuntimeError(f"shard {address} and its in-process table drew different rows")
            out.append({"size": remote.size, "total_priority": remote.total_priority,
                        "min_priority": remote.min_priority})
        return {"shards": out, "identical": True}

    def check_same_batches(self, addresses: Sequence[str], sampler) -> bool:
        """ShardedReplayClient (gRPC) and the in-process sampler, same seeds, draw the same prioritized batch:
        keys, shards, probabilities and importance weights (the allocation and weight math are the same)."""
        from apexrl.learner.sharded_client import ShardedReplayClient

        with ShardedReplayClient(addresses, seed=self.args.seed) as client:
            remote = client.sample(self.args.batch_size, beta=0.4)
        local = sampler.sample(self.args.batch_size, beta=0.4)
        for name in ("keys", "shard_ids", "probabilities", "weights"):
            if not np.array_equal(getattr(remote, name), getattr(local, name)):
                raise RuntimeError(f"gRPC and in-process batches differ in {name}")
        for name, col in remote.columns.items():
            if not np.array_equal(col, local.columns[name]):
                raise RuntimeError(f"gRPC and in-process batches differ in column {name}")
        return True

    def run(self) -> None:
        import torch

        from apexrl.common.grpc_util import wait_for_health
        from apexrl.learner.learner import LearnerConfig

        a = self.args
        torch.set_num_threads(1)
        self.load_before = os.getloadavg()[0]
        workdir = tempfile.mkdtemp(prefix="learner_bench_")
        children: list[Child] = []
        try:
            progress(f"starting 2 replay shards (capacity {a.capacity:,}, alpha {a.alpha})")
            children = self.start_shards(workdir)
            addresses = [c.address for c in children]
            for address in addresses:
                wait_for_health(address, timeout=60)
            pids = [c.proc.pid for c in children]
            data = [shard_rows(i, a.rows, a.seed) for i in range(2)]
            progress(f"filling each shard with {a.rows:,} CartPole rows through ReplayClient")
            self.fill(addresses, data)
            progress(f"  filled in {self.fill_seconds:.1f}s; building the in-process tables")
            tables = self.build_tables(data)
            self.contents = self.check_same_contents(addresses, tables, data)
            sampler_class = _in_process_sampler_class()
            self.contents["same_first_batch"] = self.check_same_batches(addresses, sampler_class(tables, seed=a.seed))
            progress("  shards and in-process tables hold the same rows and priorities and, with the same seeds, "
                     "ShardedReplayClient and the in-process sampler draw the same batch")

            def make_config() -> LearnerConfig:
                return LearnerConfig(replay_addresses=tuple(addresses), obs_dim=OBS_DIM, num_actions=NUM_ACTIONS,
                                     batch_size=a.batch_size, device="cpu", seed=a.seed,
                                     min_replay_size=1_000)

            # Untimed: the first Learner in a process pays for torch's lazy initialisation (allocator, autograd
            # kernels); do it here so phase 1 is not disadvantaged.
            self.reset_priorities(addresses, tables, data)
            ref_batch = sampler_class(tables, seed=a.seed).sample(a.batch_size, beta=0.4)
            warm_up_torch(make_config, ref_batch)

            order = [(r, m) for r in range(a.rounds) for m in (MODES if r % 2 == 0 or not a.abba else MODES[::-1])]
            order = [(r, m) for r, m in order if m in a.modes]
            for r, mode in order:
                self.reset_priorities(addresses, tables, data)
                phase = Phase(len(self.phases) + 1, mode, r + 1)
                progress(f"phase {phase.index}: {MODE_NAMES[mode]} (round {r + 1}), "
                         f"{a.warmup:g}s warm-up + {a.seconds:g}s")
                sampler = None if mode == "grpc" else sampler_class(tables, seed=a.seed)
                self.phases.append(run_phase(phase, make_config, sampler, pids, a.warmup, a.seconds))
                progress(f"  {phase.updates_per_s:,.1f} updates/s, sample wait {phase.sample_wait_fraction:.1%}, "
                         f"learner CPU {phase.learner_cpu_s / phase.seconds:.2f} cores, shards "
                         f"{sum(phase.shard_cpu_s) / phase.seconds:.2f} cores, load {phase.load_average_1min:.2f}")
            if a.reference:
                phase = Phase(len(self.phases) + 1, "reference", 0)
                progress(f"phase {phase.index}: {MODE_NAMES['reference']}, {a.warmup:g}s warm-up + {a.seconds:g}s")
                self.phases.append(run_phase(phase, make_config, ReusedBatchSampler(ref_batch), pids, a.warmup,
                                             a.seconds))
                progress(f"  {phase.updates_per_s:,.1f} updates/s")
        finally:
            for child in children:
                child.stop()
            shutil.rmtree(workdir, ignore_errors=True)
            self.load_after = os.getloadavg()[0]

    # -- summary
    def summary(self) -> dict:
        per_mode = {}
        for mode in (*MODES, "reference"):
            ps = [p for p in self.phases if p.mode == mode]
            if not ps:
                continue
            updates, seconds = sum(p.updates for p in ps), sum(p.seconds for p in ps)
            per_mode[mode] = {
                "updates_per_s": updates / seconds,
                "updates": updates,
                "seconds": seconds,
                "sample_wait_fraction": sum(p.sample_wait_fraction * p.seconds for p in ps) / seconds,
                "train_step_fraction": sum(p.train_step_fraction * p.seconds for p in ps) / seconds,
                "learner_cores": sum(p.learner_cpu_s for p in ps) / seconds,
                "shard_cores": sum(sum(p.shard_cpu_s) for p in ps) / seconds,
                "total_cores": sum(p.learner_cpu_s + sum(p.shard_cpu_s) for p in ps) / seconds,
                "learner_cpu_ms_per_update": sum(p.learner_cpu_s for p in ps) / updates * 1e3,
                "shard_cpu_ms_per_update": sum(sum(p.shard_cpu_s) for p in ps) / updates * 1e3,
            }
        out: dict = {"per_mode": per_mode, "target_ratio": TARGET_RATIO}
        if "grpc" in per_mode and "inprocess" in per_mode:
            ratio = per_mode["grpc"]["updates_per_s"] / per_mode["inprocess"]["updates_per_s"]
            rounds = sorted({p.round for p in self.phases if p.mode in MODES})
            round_ratios = []
            for r in rounds:
                g = [p for p in self.phases if p.round == r and p.mode == "grpc"]
                i = [p for p in self.phases if p.round == r and p.mode == "inprocess"]
                if g and i:
                    round_ratios.append(g[0].updates_per_s / i[0].updates_per_s)
            out.update(ratio=ratio, round_ratios=round_ratios, met=ratio >= TARGET_RATIO)
        if "reference" in per_mode:
            ref = per_mode["reference"]["updates_per_s"]
            out["share_of_reference"] = {m: per_mode[m]["updates_per_s"] / ref for m in MODES if m in per_mode}
        return out


# ----------------------------------------------------------------------------------------------------- output


def print_table(bench: Bench, summary: dict, file=sys.stdout) -> None:
    a = bench.args
    headers = ["#", "mode", "updates/s", "updates", "s", "wait", "step", "wait ms", "step ms",
               "learner cores", "shard cores", "load"]
    rows = []
    for p in bench.phases:
        rows.append([str(p.index), MODE_NAMES[p.mode], f"{p.updates_per_s:,.1f}", f"{p.updates:,}",
                     f"{p.seconds:.1f}", f"{p.sample_wait_fraction:.1%}", f"{p.train_step_fraction:.1%}",
                     f"{p.sample_wait_ms:.2f}", f"{p.train_step_ms:.2f}", f"{p.learner_cpu_s / p.seconds:.2f}",
                     "+".join(f"{c / p.seconds:.2f}" for c in p.shard_cpu_s), f"{p.load_average_1min:.2f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    left = {1}

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in
                         enumerate(zip(cells, widths, strict=True))).rstrip()

    print(f"Learner updates/s, batch {a.batch_size}, CartPole rows, {a.rows:,} rows per shard/table "
          f"(capacity {a.capacity:,}, alpha {a.alpha}), torch {bench.torch_version} CPU, 1 intra-op thread",
          file=file)
    print(fmt(headers), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in rows:
        print(fmt(r), file=file)
    print(file=file)
    for mode, m in summary["per_mode"].items():
        print(f"{MODE_NAMES[mode]:<30} {m['updates_per_s']:8,.1f} updates/s over {m['seconds']:5.1f}s; "
              f"sample wait {m['sample_wait_fraction']:.1%}; CPU per update: learner "
              f"{m['learner_cpu_ms_per_update']:.2f} ms + shards {m['shard_cpu_ms_per_update']:.2f} ms; "
              f"{m['total_cores']:.2f} cores in all",
              file=file)
    if "ratio" in summary:
        print(f"ratio gRPC / in-process = {summary['ratio']:.3f} (per round: "
              f"{', '.join(f'{r:.3f}' for r in summary['round_ratios'])}); target >= {TARGET_RATIO:.2f}: "
              f"{'met' if summary['met'] else 'NOT met'}", file=file)
    if "share_of_reference" in summary:
        print("share of the reference (sampling free): " + ", ".join(
            f"{MODE_NAMES[m]} {v:.1%}" for m, v in summary["share_of_reference"].items()), file=file)
    print("""\
wait / step: share of measured wall time the train loop spent waiting in Prefetcher.get / in train_step
  (forward, backward, optimiser, priority update hand-off); ms: the same per update.
learner cores: CPU of this process (train loop, prefetch thread, gRPC threads) / wall; shard cores: each shard
  process (/proc/<pid>/stat). On 2 cores the gRPC mode runs 3 busy processes, the in-process mode 1.""", file=file)
    load = bench.load_before, bench.load_after
    group = autogroup()
    print(f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} CPUs"
          + ("  ** other processes were busy: figures are disturbed **" if max(load) > 1.5 else "")
          + (f"; niceness {os.nice(0)}" if os.nice(0) else "")
          + (f"; scheduler autogroup {group}" if group else ""), file=file)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}", file=file)


def autogroup() -> str | None:
    """This process's scheduler autogroup and its nice value when autogroups are on (then `nice` only ranks
    processes within the group; `echo -10 > /proc/$$/autogroup` ranks the group against other sessions)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return None
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="measured time per phase (default 10; 3 quick)")
    parser.add_argument("--warmup", type=float, default=None, help="unmeasured time per phase (default 2; 1 quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of (gRPC, in-process) phases (default 2; 1 with --quick)")
    parser.add_argument("--abba", action="store_true",
                        help="reverse the order in odd rounds (A B B A) instead of A B A B")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="modes to measure (default both; one mode is useful under a profiler)")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the reference phase (one batch reused, sampling free)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rows", type=int, default=None, help="rows per shard (default 50,000; 20,000 quick)")
    parser.add_argument("--capacity", type=int, default=100_000, help="slots per shard/table (default 100,000)")
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="short phases, one round (~20 s smoke run)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = parser.parse_args(argv)
    for name, full, quick in (("seconds", 10.0, 3.0), ("warmup", 2.0, 1.0), ("rounds", 2, 1),
                              ("rows", 50_000, 20_000)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if not 1_000 <= args.rows <= args.capacity:
        parser.error(f"--rows must be in [1000, --capacity ({args.capacity})]")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    bench = Bench(args)
    bench.torch_version = torch.__version__
    bench.run()
    summary = bench.summary()
    print_table(bench, summary)
    if args.json:
        data = {
            "meta": {**metadata(args), "torch": torch.__version__, "autogroup": autogroup(),
                     "command": shlex.join([sys.executable, *sys.argv])},
            "load_average_1min": [bench.load_before, bench.load_after],
            "fill_seconds": bench.fill_seconds,
            "contents": bench.contents,
            "phases": [asdict(p) for p in bench.phases],
            "summary": summary,
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        progress(f"wrote {args.json}")
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

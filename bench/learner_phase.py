"""One measured phase of the learner benchmark: a fresh `Learner` running its real `run` loop (train_step fed
by the real Prefetcher) on one feed for warm-up + measured seconds; and the summary per mode over all
phases."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.timing import Timing, process_cpu_seconds
from learner_feed import NUM_ACTIONS, OBS_DIM, ReusedBatchSampler

TARGET_RATIO = 0.85  # the issue: distributed >= 85 % of the in-process rate
MODES = ("grpc", "grpc-thread", "inprocess")
MODE_NAMES = {
    "grpc": "gRPC, 2 shards, sampler process",
    "grpc-thread": "gRPC, 2 shards, sampler thread",
    "inprocess": "in-process, 2 tables",
    "reference": "reference: one batch reused",
}


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


def new_learner(config, sampler, registry=None):
    """A Learner with the benchmark's network shape, publishing into an in-process WeightStore."""
    from apexrl.common.spaces import EnvSpaces
    from apexrl.learner.learner import Learner
    from apexrl.parameter_server.store import WeightStore

    return Learner(config, EnvSpaces.vector(OBS_DIM, NUM_ACTIONS), sampler, WeightStore().publish, registry)


def warm_up_torch(config, batch, steps: int = 30) -> None:
    """Untimed: the first Learner in a process pays for torch's lazy initialisation (allocator, autograd
    kernels); pay it before phase 1 so that phase is not disadvantaged."""
    learner = new_learner(config, ReusedBatchSampler(batch))
    for _ in range(steps):
        learner.train_step(batch)


def run_phase(phase: Phase, config, sampler, shard_pids: Sequence[int], timing: Timing) -> Phase:
    """A fresh Learner on `sampler` (a Feed: learner/feed.py) running `Learner.run` for warm-up + seconds; figures from the measured
    window only (two snapshots taken by a monitor thread)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    learner = new_learner(config, sampler, registry)
    stop = threading.Event()
    marks: list[dict] = []

    def monitor() -> None:
        for wait in (timing.warmup, timing.seconds):
            if stop.wait(wait):
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
    record(phase, *marks)
    phase.priority_updates_dropped = dropped
    return phase


def snapshot(learner, registry, shard_pids: Sequence[int]) -> dict:
    return {
        "wall": time.perf_counter(),
        "updates": learner.updates,
        "wait": registry.get_sample_value("apexrl_learner_sample_wait_seconds_sum") or 0.0,
        "step": registry.get_sample_value("apexrl_learner_train_step_seconds_sum") or 0.0,
        "cpu": time.process_time() + sampler_child_cpu(learner),
        "shards": [process_cpu_seconds(pid) for pid in shard_pids],
    }


def sampler_child_cpu(learner) -> float:
    """CPU seconds of the learner's sampler process, if it has one: counted as the learner's."""
    pid = getattr(learner.sampler, "pid", None)  # SamplerProcess's; a ThreadFeed samples in this process
    return process_cpu_seconds(pid) if pid else 0.0


def record(phase: Phase, a: dict, b: dict) -> None:
    """The phase's figures from the snapshots at the start (a) and the end (b) of its measured window."""
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
    phase.updates_before_window = a["updates"]


def join_prefetch_threads(timeout: float = 5.0) -> None:
    """Learner.run stops its Prefetcher without joining it; join here so it cannot run into the next phase."""
    for thread in threading.enumerate():
        if thread.name == "apexrl-prefetch":
            thread.join(timeout)


# ---------------------------------------------------------------------------------------------------- summary


def mode_summary(phases: Sequence[Phase]) -> dict:
    updates, seconds = sum(p.updates for p in phases), sum(p.seconds for p in phases)
    learner_cpu = sum(p.learner_cpu_s for p in phases)
    shard_cpu = sum(sum(p.shard_cpu_s) for p in phases)
    return {
        "updates_per_s": updates / seconds,
        "updates": updates,
        "seconds": seconds,
        "sample_wait_fraction": sum(p.sample_wait_fraction * p.seconds for p in phases) / seconds,
        "train_step_fraction": sum(p.train_step_fraction * p.seconds for p in phases) / seconds,
        "learner_cores": learner_cpu / seconds,
        "shard_cores": shard_cpu / seconds,
        "total_cores": (learner_cpu + shard_cpu) / seconds,
        "learner_cpu_ms_per_update": learner_cpu / updates * 1e3,
        "shard_cpu_ms_per_update": shard_cpu / updates * 1e3,
    }


def summarize(phases: Sequence[Phase]) -> dict:
    """Per mode: rate over all its phases (total updates / total measured seconds) and CPU; the ratio gRPC /
    in-process against the target, with the per-round ratios; each mode's share of the reference."""
    per_mode = {
        mode: mode_summary([p for p in phases if p.mode == mode])
        for mode in (*MODES, "reference")
        if any(p.mode == mode for p in phases)
    }
    out: dict = {"per_mode": per_mode, "target_ratio": TARGET_RATIO}
    if "grpc" in per_mode and "inprocess" in per_mode:
        ratio = per_mode["grpc"]["updates_per_s"] / per_mode["inprocess"]["updates_per_s"]
        round_ratios = []
        for r in sorted({p.round for p in phases if p.mode in MODES}):
            g = [p for p in phases if p.round == r and p.mode == "grpc"]
            i = [p for p in phases if p.round == r and p.mode == "inprocess"]
            if g and i:
                round_ratios.append(g[0].updates_per_s / i[0].updates_per_s)
        out.update(ratio=ratio, round_ratios=round_ratios, met=ratio >= TARGET_RATIO)
    if "reference" in per_mode:
        ref = per_mode["reference"]["updates_per_s"]
        out["share_of_reference"] = {m: per_mode[m]["updates_per_s"] / ref for m in MODES if m in per_mode}
    return out

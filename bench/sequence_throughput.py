#!/usr/bin/env python
"""Sequence (R2D2) throughput of one replay shard: items inserted through the SDK, batches of items sampled over
gRPC, and an R2D2 learner fed by the shard against its sampling-free rate (issue 30).

One run, on one shard in its own process (`python -m apexrl.launcher replay --max-sequence-length 80
--signature ... --item-signature ...`, what `apexrl launch --algorithm r2d2` starts) holding CartPole-sized steps
(obs float32[4], action int64, reward and discount float32: 32 B) and 80-step items every 40 steps (the paper's
overlap), each with R2D2's item fields (state float32[2, 64], previous action and reward, episode start, weight
version: 529 B):

  1. insert: one actor environment's steps appended to the SDK's `SequenceWriter` (over a `ShardedWriter`, as
     R2D2 actors write: each step sent once, an item with the request holding its last step, the actor's
     `--windows-per-request` (2 for these windows: algorithms/r2d2/writing.py Geometry) per request; priority:
     the shard's max, so the actor's priority function is not timed) for `--warmup` + `--seconds`, one long
     episode, until every item is acknowledged: items/s (one item per 40 steps);
  2. sample, on the shard that insert filled (`--capacity` steps): `ReplayClient.sample(64)` blocking, and the
     learner's draw, `ShardedReplayClient.sample_batches(64, 4)` (its default 4 batches per Sample call):
     batches of 64 items per second;
  3. learner: an R2D2 `Learner` (LSTM 64, burn-in 40 of the 80 steps, batch 64, CPU, one torch thread) doing
     the body of `Learner.run` (get a batch from its feed, `train_step`, priorities back through the feed) fed by
     the shard through the sampler process (the default feed) and through a thread feed, against the same learner
     on one sampled batch reused (sampling removed: its ceiling here); timed from each feed's first batch on,
     phases in the order process, thread, reference, reference, thread, process (`--rounds` 2) so drift cancels.
     Ratio: fed / reference, total updates over total measured seconds per feed.

The issue's targets, per shard: >= 2,000 items/s inserted, >= 50 sampled batches of 64 items/s, the learner fed
at >= 0.9x its sampling-free rate. Progress goes to stderr, the table to stdout; `--json PATH` writes every figure.

    .venv/bin/python bench/sequence_throughput.py --json /tmp/sequence_throughput.json   # ~1.5 minutes
    .venv/bin/python bench/sequence_throughput.py --quick                                 # smoke run, ~30 s
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np
from harness.processes import Children, shard_argv, wait_healthy
from harness.report import load_line, metadata, progress, write_json
from harness.results import Results, print_rows
from harness.timing import Measurement, Timing, measure_loop, process_cpu_seconds, with_cpu
from learner_feed import NUM_ACTIONS, OBS_DIM, ReusedBatchSampler
from learner_phase import join_prefetch_threads, new_learner, warm_up_torch

LENGTH, PERIOD, CORE, BURN_IN = 80, 40, 64, 40  # the paper's windows; R2D2's vector LSTM
BATCH = 64  # items per sampled batch (R2D2's default batch)
BATCHES_PER_CALL = 4  # the learner's default sample_batches_per_call
TARGETS = {"insert": 2_000.0, "sample": 50.0, "ratio": 0.9}
FEEDS = {"process": "sampler process (default)", "thread": "thread feed", "reference": "one batch reused"}
SECTION = "one shard, CartPole-sized steps (float32[4]), 80-step items every 40 steps, R2D2 state 2 x 64"


def signatures() -> tuple[str, str]:
    """The shard's step and item signatures, as `apexrl launch --algorithm r2d2` gives them."""
    from apexrl.algorithms.r2d2.writing import item_signature, replay_signature
    from apexrl.common.spaces import EnvSpaces

    steps = replay_signature(EnvSpaces.vector(OBS_DIM, NUM_ACTIONS), None)
    return str(steps), str(item_signature(CORE))


def actor_windows_per_request() -> int:
    """What an R2D2 actor writing these windows sends per request (writing.Geometry)."""
    from apexrl.algorithms.r2d2.writing import Geometry

    return Geometry(BURN_IN, LENGTH - BURN_IN, PERIOD, gamma=0.99).windows_per_request


def step_stream(count: int, seed: int) -> list[tuple[dict, dict]]:
    """`count` steps (and each one's item fields) cycled through by the writer: built once, never timed."""
    from apexrl.common.signature import ROW_VERSION_COLUMN

    rng = np.random.default_rng(seed)
    return [
        (
            {
                "obs": rng.standard_normal(OBS_DIM).astype(np.float32),
                "action": np.int64(rng.integers(NUM_ACTIONS)),
                "reward": np.float32(1.0),
                "discount": np.float32(0.99),
            },
            {
                "state": rng.standard_normal((2, CORE)).astype(np.float32),
                "prev_action": np.int64(rng.integers(NUM_ACTIONS)),
                "prev_reward": np.float32(1.0),
                "episode_start": np.bool_(False),
                ROW_VERSION_COLUMN: np.int64(1),
            },
        )
        for _ in range(count)
    ]


def item_bytes(steps: list[tuple[dict, dict]]) -> tuple[int, int]:
    """Bytes of one step's columns and of one item's fields."""
    step, fields = steps[0]
    return sum(np.asarray(v).nbytes for v in step.values()), sum(
        np.asarray(v).nbytes for v in fields.values()
    )


# ------------------------------------------------------------------------------------------------------ insert
def measure_insert(args, results: Results, address: str, shard_pid: int) -> None:
    from apexrl.replay_server import ShardedWriter
    from apexrl.replay_server.client.sequence_writer import SequenceWriter

    steps = step_stream(1_000, args.seed)
    step_bytes, field_bytes = item_bytes(steps)
    progress(f"insert: SequenceWriter, {args.warmup:g}s warm-up + {args.seconds:g}s")
    with ShardedWriter(address, timeout=120) as sharded:
        writer = SequenceWriter(
            sharded, length=LENGTH, period=PERIOD, windows_per_request=args.windows_per_request
        )
        position = [0]

        def one_item() -> None:  # PERIOD steps: one window completes
            for _ in range(PERIOD):
                step, fields = steps[position[0] % len(steps)]
                writer.append(step, fields)
                position[0] += 1

        sent = [0]

        def acknowledged() -> None:
            writer.flush(120)
            sent[0] = writer.items_sent

        before = writer.items_sent
        m = with_cpu(shard_pid, measure_loop, one_item, args.seconds, args.warmup, finish=acknowledged)
    results.figure(
        "insert_items",
        SECTION,
        "insert: items/s through SequenceWriter (acknowledged)",
        m,
        "items/s",
        row_bytes=PERIOD * step_bytes + field_bytes,
        target=TARGETS["insert"],
        note=f"{m.rate * PERIOD:,.0f} steps/s; {sent[0] - before:,} items in all, "
        f"{args.windows_per_request} per request",
    )


# ------------------------------------------------------------------------------------------------------ sample
def measure_sample(args, results: Results, address: str, shard_pid: int) -> None:
    from apexrl.learner import ShardedReplayClient
    from apexrl.replay_server.client.replay_client import ReplayClient

    step_bytes, field_bytes = item_bytes(step_stream(1, args.seed))
    batch_bytes = BATCH * (LENGTH * step_bytes + field_bytes)
    progress(f"sample: ReplayClient.sample({BATCH}), {args.warmup:g}s warm-up + {args.seconds:g}s")
    with ReplayClient(address, timeout=60) as client:
        size = client.info().size
        m = with_cpu(shard_pid, measure_loop, lambda: client.sample(BATCH), args.seconds, args.warmup)
    results.figure(
        "sample_blocking",
        SECTION,
        f"sample: ReplayClient.sample({BATCH}) batches/s, blocking",
        m,
        "batches/s",
        row_bytes=batch_bytes,
        target=TARGETS["sample"],
        note=f"{m.rate * BATCH:,.0f} items/s from {size:,} items held",
    )
    progress(
        f"sample: ShardedReplayClient.sample_batches({BATCH}, {BATCHES_PER_CALL}), {args.warmup:g}s warm-up + "
        f"{args.seconds:g}s"
    )
    with ShardedReplayClient([address], timeout=60, seed=args.seed) as sampler:
        m = with_cpu(
            shard_pid,
            measure_loop,
            lambda: sampler.sample_batches(BATCH, BATCHES_PER_CALL, beta=0.6),
            args.seconds,
            args.warmup,
        )
    results.figure(
        "sample_learner_draw",
        SECTION,
        f"sample: the learner's draw, {BATCHES_PER_CALL} batches of {BATCH} per call, batches/s",
        m,
        "batches/s",
        per_call=BATCHES_PER_CALL,
        row_bytes=batch_bytes,
        target=TARGETS["sample"],
    )


# ----------------------------------------------------------------------------------------------------- learner
def learner_config(args, address: str):
    from apexrl.learner.config import LearnerConfig

    return LearnerConfig(
        replay=(address,),
        env="CartPole-v1",
        algorithm="r2d2",
        batch_size=BATCH,
        sequence_burn_in=BURN_IN,
        lstm_size=CORE,
        device="cpu",
        seed=args.seed,
        min_replay_size=1,
        torch_threads=1,
    )


def feed_order(rounds: int) -> list[str]:
    """process, thread, reference, then the reverse, and so on: ABC CBA."""
    order = list(FEEDS)
    return [feed for r in range(rounds) for feed in (order if r % 2 == 0 else order[::-1])]


def measure_learner(args, results: Results, address: str, shard_pid: int) -> list[dict]:
    from apexrl.learner import ShardedReplayClient
    from apexrl.learner.feed import ThreadFeed
    from apexrl.learner.learner import make_sampler

    config = learner_config(args, address)
    with ShardedReplayClient([address], timeout=60, seed=args.seed) as sampler:
        reused = sampler.sample(BATCH, beta=0.6)
    progress("learner: warming torch up on one batch (untimed)")
    warm_up_torch(config, reused.for_learning(), steps=5)
    timing = Timing(args.seconds, args.warmup)
    phases: list[dict] = []
    for feed_name in feed_order(args.rounds):
        if feed_name == "reference":
            feed = ThreadFeed(ReusedBatchSampler(reused), config)
        else:
            feed = make_sampler(dataclasses.replace(config, sampler_process=feed_name == "process"))
        progress(
            f"learner phase {len(phases) + 1}: {FEEDS[feed_name]}, {args.warmup:g}s warm-up + {args.seconds:g}s"
        )
        phase = fed_phase(new_learner(config, feed), shard_pid, timing)
        phases.append({"feed": feed_name, **phase})
        progress(
            f"  {phase['updates'] / phase['seconds']:,.1f} updates/s, waited for a batch "
            f"{phase['wait_s'] / phase['seconds']:.1%}, learner {phase['learner_cpu_s'] / phase['seconds']:.2f} "
            f"cores (its sampler process included), shard {phase['shard_cpu_s'] / phase['seconds']:.2f}"
        )
    rates = {feed: _rate([p for p in phases if p["feed"] == feed]) for feed in FEEDS}
    for feed, (m, waited) in rates.items():
        ceiling = None if feed == "reference" else rates["reference"][0].rate
        results.figure(
            f"learner_{feed}",
            SECTION,
            f"R2D2 learner updates/s, {FEEDS[feed]}",
            m,
            "updates/s",
            ceiling=ceiling,
            ceiling_name=None if ceiling is None else "one batch reused",
            ratio_target=None if ceiling is None else TARGETS["ratio"],
            note=f"waited for a batch {waited:.1%} of the time",
        )
    return phases


def fed_phase(learner, shard_pid: int, timing: Timing) -> dict:
    """The body of `Learner.run` (get a batch, train_step, priorities back through the feed) for warm-up +
    seconds, timed from the first batch on (a sampler process's start is not the feed's rate). The measured
    window's updates, seconds, time spent waiting for a batch, and the CPU seconds of this process with its
    sampler process and of the shard."""
    feed = learner.sampler.start(learner.beta)
    waited, marks = [0.0], []

    def step() -> None:
        t0 = time.perf_counter()
        batch = feed.get(timeout=60)
        waited[0] += time.perf_counter() - t0
        if batch is None:
            raise TimeoutError("no batch within 60 s")
        learner.train_step(batch)

    def mark() -> None:
        child = getattr(feed, "pid", None)  # the sampler process's CPU counts as the learner's
        cpu = time.process_time() + (process_cpu_seconds(child) if child else 0.0)
        marks.append((learner.updates, time.perf_counter(), waited[0], cpu, process_cpu_seconds(shard_pid)))

    try:
        first = feed.get(timeout=120)
        if first is None:
            raise TimeoutError("no first batch within 120 s")
        learner.train_step(first)
        measure_loop(step, timing.seconds, timing.warmup, finish=mark)
    finally:
        feed.stop(wait=False)
        learner.close()
        join_prefetch_threads()
    (u1, t1, w1, c1, s1), (u2, t2, w2, c2, s2) = marks
    return {
        "updates": u2 - u1,
        "seconds": t2 - t1,
        "wait_s": w2 - w1,
        "learner_cpu_s": c2 - c1,
        "shard_cpu_s": s2 - s1,
    }


def _rate(phases: list[dict]) -> tuple[Measurement, float]:
    """One feed's phases together: updates over measured seconds, the cores of the learner (with its sampler
    process) and of the shard, and the share of the time spent waiting for a batch."""
    seconds = sum(p["seconds"] for p in phases)
    m = Measurement(
        sum(p["updates"] for p in phases),
        seconds,
        sum(p["learner_cpu_s"] for p in phases) / seconds,
        sum(p["shard_cpu_s"] for p in phases) / seconds,
    )
    return m, sum(p["wait_s"] for p in phases) / seconds


# --------------------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> tuple[Results, list[dict], float, float]:
    import torch

    torch.set_num_threads(1)
    results = Results()
    load_before = os.getloadavg()[0]
    steps, items = signatures()
    with tempfile.TemporaryDirectory(prefix="sequence_throughput_") as workdir, Children(workdir) as children:
        argv = shard_argv(args.capacity, seed=args.seed)
        argv += ["--max-sequence-length", str(LENGTH), "--signature", steps, "--item-signature", items]
        shard = children.start("shard-0", argv)
        wait_healthy([shard])
        progress(f"one sequence shard (capacity {args.capacity:,} steps), pid {shard.pid}")
        measure_insert(args, results, shard.address, shard.pid)
        measure_sample(args, results, shard.address, shard.pid)
        phases = measure_learner(args, results, shard.address, shard.pid)
    return results, phases, load_before, os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure or phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    parser.add_argument("--rounds", type=int, default=2, help="learner rounds (each: every feed once)")
    parser.add_argument("--capacity", type=int, default=100_000, help="the shard's capacity, steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--windows-per-request",
        type=int,
        default=actor_windows_per_request(),
        help="windows the SequenceWriter sends per request (default: an R2D2 actor's for these windows)",
    )
    parser.add_argument("--quick", action="store_true", help="1 s figures, one learner round")
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.rounds = 1.0, 0.5, 1
    results, phases, before, after = run(args)
    print_rows(results)
    for key, row in results.by_key.items():
        if row.note:
            print(f"{key}: {row.note}")
    print(load_line(before, after))
    if args.json:
        write_json(
            args.json,
            {
                "metadata": metadata(args),
                "figures": {key: asdict(row) for key, row in results.by_key.items()},
                "learner_phases": phases,
                "load_average": {"before": before, "after": after},
            },
        )
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    progress(f"done in {time.perf_counter() - started:.0f}s")
    sys.exit(code)

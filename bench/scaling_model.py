#!/usr/bin/env python
"""A MODEL of aggregate insert and learner throughput against the number of replay shards (1, 2, 4, 8), built from
CPU costs measured here per operation on each side. Not a scaling measurement: this machine has 2 cores, and a
measurement of S shards needs S + 2 cores or more (no larger machine was lent to the session that wrote this).

    .venv/bin/python bench/scaling_model.py --json /tmp/scaling_model.json      # ~1 minute
    .venv/bin/python bench/scaling_model.py --quick                             # ~20 s

Measured (one real shard process, `apexrl replay`, and this process as its client, CartPole rows):
  * shard CPU per inserted row, in batches of 256 through `ReplayClient.insert` (the actors' path);
  * shard CPU per Sample call of b rows and per priority update of b keys (over StreamUpdatePriorities, as the
    learner sends them), for b = 32 and 256, fitted as fixed + per-row cost (CPU time, not wall time, so the
    figures hold on a busy machine better than rates do);
  * client CPU of the same Sample calls (decoding: what the learner's sampler process pays), same fit;
  * the learner's train step on a reused batch of 256 (CPU torch, 1 thread): the serial part.
Model, for S shards each on its own core, the learner's train step on its own core (or a GPU) and its sampler
process on another (actors elsewhere), samples_per_insert k (rows sampled per row inserted; 16 is the default):
  * insert ceiling (rows/s) = S / shard_cpu_per_row: shards doing nothing but inserts;
  * per update, each shard answers one Sample of 256/S rows and one priority update of 256/S keys, and stores
    256/k new rows; a shard's core is full at  U * (sample(256/S) + update(256/S) + 256/k * insert_row) = 1;
  * the sampler process makes S Sample calls per update: U * S * client_sample(256/S) = 1;
  * learner updates/s U = min(1 / train_step, sampler bound, shard bound); the table names the bound that binds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from harness.processes import Children, wait_healthy
from harness.report import load_line, metadata, progress, render_table, write_json
from harness.timing import process_cpu_seconds
from learner_feed import shard_rows

BATCH = 256
SIZES = (32, 256)
MIN_INSERT_CPU_SECONDS = 0.2  # shard CPU to measure the insert cost over (20 clock ticks: a 5 % resolution)


def shard_cpu(pid: int, action, calls: int) -> tuple[float, float]:
    """(shard CPU seconds per call, client CPU seconds per call) of `calls` calls of `action`."""
    s0, c0 = process_cpu_seconds(pid), time.process_time()
    for _ in range(calls):
        action()
    return (process_cpu_seconds(pid) - s0) / calls, (time.process_time() - c0) / calls


def fit(costs: dict[int, float]) -> tuple[float, float]:
    """(fixed, per-row) through the two measured sizes."""
    (b1, c1), (b2, c2) = sorted(costs.items())
    per_row = max(0.0, (c2 - c1) / (b2 - b1))
    return max(0.0, c1 - per_row * b1), per_row


def measure(args: argparse.Namespace) -> dict:
    from apexrl.replay_server.client.replay_client import ReplayClient

    with tempfile.TemporaryDirectory(prefix="scaling_model_") as workdir, Children(workdir) as children:
        shard = children.start_shard("shard", args.rows, seed=0)
        wait_healthy([shard])
        columns, priorities = shard_rows(0, args.rows, seed=0)
        with ReplayClient(shard.address, timeout=120) as client:
            progress(f"inserting {args.rows:,} CartPole rows in batches of {BATCH}")
            s0, c0, t0 = process_cpu_seconds(shard.pid), time.process_time(), time.perf_counter()
            inserted = 0
            # Again (the ring overwriting itself) until the shard's CPU clock, which counts in ticks of 10 ms, has
            # moved enough to divide by: the quick mode's 20,000 rows take a few ticks on a fast machine.
            while not inserted or process_cpu_seconds(shard.pid) - s0 < MIN_INSERT_CPU_SECONDS:
                for start in range(0, args.rows, BATCH):
                    part = {k: v[start : start + BATCH] for k, v in columns.items()}
                    client.insert(part, priorities[start : start + BATCH])
                client.flush(120)
                inserted += args.rows
            rows_s = inserted / (time.perf_counter() - t0)
            insert_row = (process_cpu_seconds(shard.pid) - s0) / inserted
            insert_row_client = (time.process_time() - c0) / inserted
            sample, sample_client, update = {}, {}, {}
            for b in SIZES:
                progress(f"Sample({b}) and priority updates of {b} keys, {args.calls} calls each")
                client.sample(b)  # warm
                sample[b], sample_client[b] = shard_cpu(shard.pid, lambda b=b: client.sample(b), args.calls)
                keys = client.sample(b).keys
                stream = client.priority_stream(max_in_flight=32)
                try:
                    s0 = process_cpu_seconds(shard.pid)
                    for _ in range(args.calls):
                        stream.send(keys, np.ones(b), 0)
                    stream.flush(60)  # every update applied before the shard's CPU is read
                    update[b] = (process_cpu_seconds(shard.pid) - s0) / args.calls
                finally:
                    stream.close()
    progress("the learner's train step on a reused batch")
    train_step = learner_step_seconds(args.steps)
    return {
        "insert_row": insert_row,
        "insert_row_client": insert_row_client,
        "insert_rows_per_s_one_client": rows_s,
        "sample": fit(sample),
        "sample_client": fit(sample_client),
        "update": fit(update),
        "train_step": train_step,
        "raw": {"sample": sample, "sample_client": sample_client, "update": update},
    }


def learner_step_seconds(steps: int) -> float:
    import torch
    from learner_phase import new_learner

    from apexrl.learner.config import LearnerConfig
    from apexrl.learner.sharded_client import PrioritizedBatch

    torch.set_num_threads(1)
    columns, _ = shard_rows(0, BATCH, seed=1)
    batch = PrioritizedBatch(
        columns,
        np.zeros(BATCH, np.int32),
        np.arange(BATCH, dtype=np.uint64),
        np.full(BATCH, 1 / BATCH),
        np.ones(BATCH, np.float32),
        (1,),
        BATCH,
    )

    class Discard:
        def update_priorities(self, batch, priorities) -> None:
            pass

    learner = new_learner(
        LearnerConfig(replay=("unused:1",), batch_size=BATCH, device="cpu", seed=0), Discard()
    )
    for _ in range(20):
        learner.train_step(batch)
    c0 = time.process_time()
    for _ in range(steps):
        learner.train_step(batch)
    return (time.process_time() - c0) / steps


def model(costs: dict, spi: float, per_call: int) -> list[dict]:
    """Updates/s and its bound for 1, 2, 4, 8 shards; `per_call` batches share one Sample call and one priority
    update per shard (the learner's sample_batches_per_call and priority_coalesce_batches, 4 by default)."""
    (s_fixed, s_row), (c_fixed, c_row), (u_fixed, u_row) = (
        costs["sample"],
        costs["sample_client"],
        costs["update"],
    )
    rows = []
    for shards in (1, 2, 4, 8):
        part = BATCH / shards  # rows of one update each shard serves
        per_update_shard = (
            s_fixed / per_call
            + s_row * part
            + u_fixed / per_call
            + u_row * part
            + BATCH / spi * costs["insert_row"]
        )
        bounds = {
            "train step": 1 / costs["train_step"],
            "sampler process": 1 / (shards * (c_fixed / per_call + c_row * part)),
            "shards": 1 / per_update_shard,
        }
        binding = min(bounds, key=bounds.get)
        rows.append(
            {
                "shards": shards,
                "insert_rows_per_s": shards / costs["insert_row"],
                "updates_per_s": bounds[binding],
                "bound": binding,
                "bounds": bounds,
                "updates_per_s_gpu_step_free": min(bounds["sampler process"], bounds["shards"]),
                "insert_rows_per_s_at_that_rate": bounds[binding] * BATCH / spi,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=None, help="rows inserted and held (default 200,000)")
    parser.add_argument(
        "--calls", type=int, default=None, help="calls per measured operation (default 2,000)"
    )
    parser.add_argument("--steps", type=int, default=None, help="train steps measured (default 300)")
    parser.add_argument("--samples-per-insert", type=float, default=16.0)
    parser.add_argument(
        "--batches-per-call",
        type=int,
        default=4,
        help="batches per Sample call and per priority update (the learner's default: 4)",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the measured costs and the model here")
    args = parser.parse_args()
    for name, full, quick in (("rows", 200_000, 20_000), ("calls", 2_000, 200), ("steps", 300, 30)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    load_before = os.getloadavg()[0]
    costs = measure(args)
    rows = model(costs, args.samples_per_insert, args.batches_per_call)
    us = 1e6
    print("Measured CPU per operation (one shard process, CartPole rows):")
    print(
        f"  shard: insert {costs['insert_row'] * us:.2f} us/row (batches of {BATCH}); Sample "
        f"{costs['sample'][0] * us:.0f} us + {costs['sample'][1] * us:.2f} us/row; priority update "
        f"{costs['update'][0] * us:.0f} us + {costs['update'][1] * us:.2f} us/key"
    )
    print(
        f"  client: Sample decode {costs['sample_client'][0] * us:.0f} us + {costs['sample_client'][1] * us:.2f} "
        f"us/row; insert {costs['insert_row_client'] * us:.2f} us/row; learner train step (batch {BATCH}, CPU, 1 "
        f"thread) {costs['train_step'] * 1e3:.2f} ms"
    )
    print(
        f"  measured wall rate of one client inserting: {costs['insert_rows_per_s_one_client']:,.0f} rows/s (the "
        f"CPU ceiling below assumes enough writers to keep a shard's core busy)"
    )
    print(
        f"MODEL (not a measurement): S shards on S cores, samples_per_insert {args.samples_per_insert:g}, "
        f"{args.batches_per_call} batches per call"
    )
    lines = [
        [
            str(r["shards"]),
            f"{r['insert_rows_per_s']:,.0f}",
            f"{r['updates_per_s']:,.0f}",
            r["bound"],
            f"{r['bounds']['shards']:,.0f}",
            f"{r['bounds']['sampler process']:,.0f}",
            f"{r['updates_per_s_gpu_step_free']:,.0f}",
            f"{r['insert_rows_per_s_at_that_rate']:,.0f}",
        ]
        for r in rows
    ]
    print(
        "\n".join(
            render_table(
                [
                    "shards",
                    "insert ceiling rows/s",
                    "updates/s (CPU step)",
                    "bound by",
                    "shard bound",
                    "sampler bound",
                    "updates/s (free step)",
                    "rows/s inserted",
                ],
                lines,
                left={3},
            )
        )
    )
    print(
        "free step: the bound with a train step that costs nothing (a fast GPU): shards or the one sampler "
        "process decide"
    )
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"meta": metadata(args), "costs": costs, "model": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

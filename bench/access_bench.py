#!/usr/bin/env python
"""Access-control benchmark: what roles cost a replay shard (docs/security.md), measured in one run.

Two shard processes, exactly as operators run them: one with a single fleet token (`--token-file`, the
one-machine mode) and one with role tokens (`--role-tokens DIR`, five identities). Each round measures, on each
shard in turn (A B, then B A in the next round, so drift in the machine's load falls on both):

  - insert: SDK inserts of CartPole rows (batches of 64 with priorities, streamed with acks), rows per second;
  - sample: Sample(256) per second, blocking, on the filled shard;
  - update: UpdatePriorities(256) per second, blocking.

Printed: the median of the rounds for each figure and mode, and roles / single token as a ratio (target >= 0.95).

    .venv/bin/python bench/access_bench.py                     # 5 rounds of 3 s per figure (~2 minutes)
    .venv/bin/python bench/access_bench.py --quick             # a smoke test (~20 s)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from harness.processes import Children, shard_argv, wait_healthy
from harness.report import load_line, metadata, progress, render_table, write_json

from apexrl.replay_server.client import ReplayClient

SIGNATURE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
TOKENS = {"actor": "bench-actor", "actor.m2": "bench-actor-m2", "learner": "bench-learner",
          "evaluator": "bench-evaluator", "operator": "bench-operator"}
FLEET_TOKEN = "bench-fleet"
FIGURES = ("insert rows/s", "sample(256)/s", "update(256)/s")


def batch(rows: int, start: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows)
    return {"obs": np.tile(ids[:, None], (1, 4)).astype(np.float32), "action": ids.astype(np.int64),
            "reward": np.ones(rows, np.float32), "discount": np.full(rows, 0.99, np.float32),
            "next_obs": np.tile(ids[:, None] + 1, (1, 4)).astype(np.float32)}


def measure(address: str, writer_token: str, learner_token: str, seconds: float, start: int) -> dict[str, float]:
    """One round of the three figures against one shard."""
    out: dict[str, float] = {}
    with ReplayClient(address, token=writer_token, writer_id=f"bench-{start}") as writer:
        rows, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            writer.insert(batch(64, start + rows), priorities=np.ones(64))
            rows += 64
        writer.flush(timeout=120)
        out["insert rows/s"] = rows / (time.perf_counter() - t0)
    with ReplayClient(address, token=learner_token) as learner:
        sampled = learner.sample(256)
        priorities = np.full(256, 2.0)
        for figure, call in (("sample(256)/s", lambda: learner.sample(256)),
                             ("update(256)/s", lambda: learner.update_priorities(
                                 sampled.keys, priorities, incarnation=sampled.incarnation))):
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                call()
                calls += 1
            out[figure] = calls / (time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per figure per round")
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s (a smoke test)")
    parser.add_argument("--json", help="write the figures as JSON to this path")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 2, 1.0
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="apexrl-access-bench-") as workdir, Children(workdir) as children:
        tokens_dir = os.path.join(workdir, "tokens")
        os.mkdir(tokens_dir, 0o700)
        for name, token in TOKENS.items():
            with open(os.path.join(tokens_dir, name), "w") as f:
                f.write(token)
        fleet_file = os.path.join(workdir, "fleet-token")
        with open(fleet_file, "w") as f:
            f.write(FLEET_TOKEN)
        common = shard_argv(args.capacity, seed=0) + ["--signature", SIGNATURE]
        shards = {
            "single token": (children.start("single", common + ["--token-file", fleet_file]),
                             FLEET_TOKEN, FLEET_TOKEN),
            "roles": (children.start("roles", common + ["--role-tokens", tokens_dir]),
                      TOKENS["actor"], TOKENS["learner"]),
        }
        wait_healthy([child for child, _, _ in shards.values()])
        results: dict[str, dict[str, list[float]]] = {mode: {f: [] for f in FIGURES} for mode in shards}
        for round_index in range(args.rounds):
            order = list(shards) if round_index % 2 == 0 else list(reversed(shards))
            for mode in order:
                child, writer, learner = shards[mode]
                figures = measure(child.address, writer, learner, args.seconds, start=round_index * 10_000_000)
                for figure, value in figures.items():
                    results[mode][figure].append(value)
                progress(f"round {round_index + 1}/{args.rounds} {mode}: "
                         + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
    medians = {mode: {f: statistics.median(v) for f, v in figs.items()} for mode, figs in results.items()}
    lines = [[figure, f"{medians['single token'][figure]:,.0f}", f"{medians['roles'][figure]:,.0f}",
              f"{medians['roles'][figure] / medians['single token'][figure]:.2f}x"] for figure in FIGURES]
    print("\n".join(render_table(["figure (median of rounds)", "single token", "roles", "roles / single"],
                                 lines, left={0})))
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"meta": metadata(args), "rounds": results, "medians": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())

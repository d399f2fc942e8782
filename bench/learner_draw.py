#!/usr/bin/env python
"""The learner's draw of k batches, two ways, on the same 2 replay shards in one run: `sample_batches(B, k)` (what
the prefetcher calls: each batch allocated over the shards and stratified on each shard on its own, all k in one
Sample call per shard) against one `sample(B * k)` cut into k batches at random (what it called before issue 17).
Blocks of draws alternate between the two (A B B A ...) to cancel drift on a shared machine; per way it reports
batches/s and CPU per batch of this process (the client) and of the shards.

    .venv/bin/python bench/learner_draw.py            # ~30 s
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from harness.processes import Children, wait_healthy
from harness.timing import process_cpu_seconds
from learner_feed import fill_shards, shard_rows


def measure(draw: Callable[[], list], draws: int, shard_pids: list[int]) -> tuple[float, float, float, int]:
    """(wall s, this process's CPU s, the shards' CPU s, batches) of `draws` draws."""
    shards_before = sum(process_cpu_seconds(pid) for pid in shard_pids)
    cpu, wall = time.process_time(), time.perf_counter()
    batches = sum(len(draw()) for _ in range(draws))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, sum(process_cpu_seconds(pid) for pid in shard_pids) - shards_before, batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows per shard (default 20,000)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=4, help="batches per draw (the learner's default 4)")
    parser.add_argument("--draws", type=int, default=60, help="draws per block (default 60)")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per way (default 8)")
    args = parser.parse_args(argv)

    from apexrl.learner.sharded_client import ShardedReplayClient

    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="learner_draw_") as workdir, Children(workdir) as children:
        shards = [children.start_shard(f"shard-{i}", 100_000, seed=i, alpha=0.6) for i in range(2)]
        wait_healthy(shards)
        fill_shards([c.address for c in shards], [shard_rows(i, args.rows, 0) for i in range(2)])
        b, k = args.batch_size, args.batches
        with ShardedReplayClient([c.address for c in shards], seed=0) as client:
            ways = {
                "sample_batches(B, k)": lambda: client.sample_batches(b, k, beta=0.4),
                "sample(B*k), split": lambda: client.sample(b * k, beta=0.4).split(k, rng),
            }
            for draw in ways.values():  # warm-up: connections, caches
                measure(draw, 10, [])
            totals = {name: np.zeros(4) for name in ways}
            for block in range(2 * args.blocks):
                name = list(ways)[(block + block // 2) % 2]  # A B B A A B B A ...
                totals[name] += measure(ways[name], args.draws, [c.pid for c in shards])
    print(
        f"{k} batches of {b} per draw, 2 shards x {args.rows:,} CartPole rows; "
        f"load average {load_before:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    for name, (wall, cpu, shard_cpu, batches) in totals.items():
        print(
            f"{name:22s} {batches / wall:7.1f} batches/s; CPU per batch: client {cpu / batches * 1e3:.3f} ms, "
            f"shards {shard_cpu / batches * 1e3:.3f} ms"
        )
    new, old = (totals[name] for name in ways)
    print(f"sample_batches / split: {(new[3] / new[0]) / (old[3] / old[0]):.3f}x the batches/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

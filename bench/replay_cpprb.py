#!/usr/bin/env python
"""Replay figures, part 4 (only with `--cpprb`; cpprb is never required): cpprb's PrioritizedReplayBuffer with
the same CartPole fields at the same capacity, as an in-process reference for the table's cycle.

`PrioritizedReplayBuffer(capacity, alpha=0.6)`: `add` of 256 rows (into an empty buffer), then, filled to
capacity, `sample(256, beta=0.4)` (gather + importance weights), `update_priorities(256)`, and the cycle
sample + update. cpprb is not a dependency of apexrl, so this file also runs as a worker under an interpreter
that has numpy and cpprb (`--cpprb-python`); it prints one JSON line of (calls, seconds) per figure:

    bench/results/cpprb-venv/bin/python bench/replay_cpprb.py --capacity 1000000 --seconds 3 --warmup 0.5

Only numpy and the benchmarks' numpy-only modules are imported at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from harness.timing import measure_loop
from workloads import FILL_BATCH, cartpole_batch, priorities

FIGURES = (  # key, name, unit
    ("add", "PrioritizedReplayBuffer.add x256", "transitions/s"),
    ("sample", "sample(256) (+ gather, IS weights)", "calls/s"),
    ("update", "update_priorities(256)", "calls/s"),
    ("cycle", "cycle: sample(256) + update(256)", "cycles/s"),
)


def measure_cpprb(results, python: str, capacity: int, seconds: float, warmup: float) -> str | None:
    """Run the worker under `python` and add its figures; compare the in-process table cycle with cpprb's.
    Returns why cpprb was skipped (the worker's stderr), or None."""
    from harness.report import progress
    from harness.results import Row

    progress(f"cpprb: PrioritizedReplayBuffer({capacity:,}) with {python}")
    cmd = [
        python,
        os.path.abspath(__file__),
        "--capacity",
        str(capacity),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        stderr = proc.stderr.strip()
        progress(f"  cpprb skipped: {stderr.splitlines()[-1] if stderr else proc.returncode}")
        return stderr[-500:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    section = f"cpprb {figures['version']} ({capacity:,} slots, in-process)"
    for key, name, unit in FIGURES:
        calls, elapsed = figures[key]
        rate = calls / elapsed * (256 if key == "add" else 1)
        results.add(f"cpprb_{key}", Row(section, name, rate, unit, calls=calls, seconds=elapsed))
    ours = results.by_key.get("table_cycle")
    if ours is not None:
        theirs = results.by_key["cpprb_cycle"].value
        ours.compare(theirs, "cpprb cycle", theirs, ">= cpprb")
    return None


def worker(capacity: int, seconds: float, warmup: float) -> dict:
    """The figures, measured in this process (which must have cpprb)."""
    import importlib.metadata

    import cpprb

    rng = np.random.default_rng(0)
    env_dict = {
        "obs": {"shape": 4, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "discount": {"dtype": np.float32},
        "next_obs": {"shape": 4, "dtype": np.float32},
    }
    rb = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=0.6)
    batch, pri = cartpole_batch(256, rng), priorities(256, rng)
    out: dict = {"version": importlib.metadata.version("cpprb")}
    out["add"] = measure_loop(lambda: rb.add(**batch, priorities=pri), seconds, warmup)
    big = cartpole_batch(FILL_BATCH, rng)
    while rb.get_stored_size() < capacity:
        rb.add(**big, priorities=priorities(FILL_BATCH, rng))
    pri_pool = [rng.random(256) * 3 + 0.01 for _ in range(64)]
    idx_pool = [rb.sample(256, beta=0.4)["indexes"] for _ in range(64)]
    counter = [0]

    def update() -> None:
        i = counter[0] = (counter[0] + 1) % 64
        rb.update_priorities(idx_pool[i], pri_pool[i])

    def cycle() -> None:
        s = rb.sample(256, beta=0.4)
        i = counter[0] = (counter[0] + 1) % 64
        rb.update_priorities(s["indexes"], pri_pool[i])

    out["sample"] = measure_loop(lambda: rb.sample(256, beta=0.4), seconds, warmup)
    out["update"] = measure_loop(update, seconds, warmup)
    out["cycle"] = measure_loop(cycle, seconds, warmup)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(worker(args.capacity, args.seconds, args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

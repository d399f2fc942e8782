#!/usr/bin/env python
"""Access-control benchmark: what roles cost a replay shard (docs/security.md), measured in one run.

Three shard processes, exactly as operators run them: the `--baseline` commit's code (before roles and quotas)
with a single fleet token, and this checkout's with a single fleet token (`--token-file`, the one-machine mode)
and with role tokens (`--role-tokens DIR`, five identities); quotas and the connection policy at their defaults.
Each round measures, on each shard in turn (the order reverses every round, so drift in the machine's load falls
on all of them):

  - insert: SDK inserts of CartPole rows (batches of 64 with priorities, streamed with acks), rows per second;
  - sample: Sample(256) per second, blocking, on the filled shard;
  - update: UpdatePriorities(256) per second, blocking.

Printed: the median of the rounds for each figure and shard, and each of this checkout's against the baseline
as a ratio (target >= 0.95 for roles and quotas on against the code without them).

    .venv/bin/python bench/access_bench.py --baseline 0318ce6     # 5 rounds of 3 s per figure (~3 minutes)
    .venv/bin/python bench/access_bench.py --quick                # a smoke test, HEAD as the baseline (~30 s)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness.baseline import ROOT, baseline_pythonpath, describe, imported_from
from harness.processes import Child, Children, shard_argv, wait_healthy
from harness.report import load_line, metadata, progress, render_table, write_json

from apexrl.replay_server.client.replay_client import ReplayClient

SIGNATURE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
TOKENS = {
    "actor": "bench-actor",
    "actor.m2": "bench-actor-m2",
    "learner": "bench-learner",
    "evaluator": "bench-evaluator",
    "operator": "bench-operator",
}
FLEET_TOKEN = "bench-fleet"
FIGURES = ("insert rows/s", "sample(256)/s", "update(256)/s")


def batch(rows: int, start: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows)
    return {
        "obs": np.tile(ids[:, None], (1, 4)).astype(np.float32),
        "action": ids.astype(np.int64),
        "reward": np.ones(rows, np.float32),
        "discount": np.full(rows, 0.99, np.float32),
        "next_obs": np.tile(ids[:, None] + 1, (1, 4)).astype(np.float32),
    }


def measure(
    address: str, writer_token: str, learner_token: str, seconds: float, start: int
) -> dict[str, float]:
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
        for figure, call in (
            ("sample(256)/s", lambda: learner.sample(256)),
            (
                "update(256)/s",
                lambda: learner.update_priorities(sampled.keys, priorities, incarnation=sampled.incarnation),
            ),
        ):
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                call()
                calls += 1
            out[figure] = calls / (time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per figure per round")
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s (a smoke test)")
    parser.add_argument(
        "--baseline",
        default="HEAD",
        help="git ref of the shard code to compare with (default HEAD: the last commit)",
    )
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
        path = baseline_pythonpath(args.baseline, Path(workdir) / "baseline")
        old_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])),
        }
        if not imported_from("apexrl.replay_server.server.service", old_env, workdir).is_relative_to(workdir):
            raise RuntimeError("the baseline shard would not import the baseline's code")
        old = Child("baseline", common + ["--token-file", fleet_file], workdir, env=old_env, cwd=workdir)
        children.started.append(old)
        baseline = f"baseline {describe(args.baseline)}"
        shards = {
            baseline: (old, FLEET_TOKEN, FLEET_TOKEN),
            "single token": (
                children.start("single", common + ["--token-file", fleet_file]),
                FLEET_TOKEN,
                FLEET_TOKEN,
            ),
            "roles": (
                children.start("roles", common + ["--role-tokens", tokens_dir]),
                TOKENS["actor"],
                TOKENS["learner"],
            ),
        }
        if not imported_from(
            "apexrl.replay_server.server.service", dict(os.environ), str(ROOT)
        ).is_relative_to(ROOT):
            raise RuntimeError("this checkout's shards would not import its code")
        wait_healthy([child for child, _, _ in shards.values()])
        results: dict[str, dict[str, list[float]]] = {mode: {f: [] for f in FIGURES} for mode in shards}
        for round_index in range(args.rounds):
            order = list(shards) if round_index % 2 == 0 else list(reversed(shards))
            for mode in order:
                child, writer, learner = shards[mode]
                figures = measure(
                    child.address, writer, learner, args.seconds, start=round_index * 10_000_000
                )
                for figure, value in figures.items():
                    results[mode][figure].append(value)
                progress(
                    f"round {round_index + 1}/{args.rounds} {mode}: "
                    + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items())
                )
    medians = {mode: {f: statistics.median(v) for f, v in figs.items()} for mode, figs in results.items()}
    lines = [
        [
            figure,
            *(f"{medians[mode][figure]:,.0f}" for mode in medians),
            f"{medians['single token'][figure] / medians[baseline][figure]:.2f}x",
            f"{medians['roles'][figure] / medians[baseline][figure]:.2f}x",
        ]
        for figure in FIGURES
    ]
    print(
        "\n".join(
            render_table(
                ["figure (median of rounds)", *medians, "single / baseline", "roles / baseline"],
                lines,
                left={0},
            )
        )
    )
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"meta": metadata(args), "rounds": results, "medians": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())

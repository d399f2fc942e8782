#!/usr/bin/env python
"""Sequence items inserted through the SDK into one shard: another commit's shard and SequenceWriter against this
checkout's, with one or several windows per request (`SequenceWriter(windows_per_request=k)`), in one run (issue 30).

The insert figure of bench/sequence_throughput.py (CartPole-sized steps, 80-step items every 40, R2D2's item
fields), for each version: a shard process and a writer process, both running that version's apexrl (the baseline's
through harness/baseline.py, `git archive` of `--baseline`), rounds in alternating order (ABC, CBA, ...) so that the
machine's drift cancels. Per configuration: the median of the rounds' items/s (acknowledged), and the CPU the
writer process and the shard spent per item (the cores columns of the other benchmarks, divided by the rate).

    .venv/bin/python bench/sequence_insert_ab.py --baseline HEAD --windows 1,2,4    # 3 rounds of 3 s, ~3 minutes
    .venv/bin/python bench/sequence_insert_ab.py --quick                            # smoke run, ~1 minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.baseline import ROOT, baseline_pythonpath, describe, imported_from
from harness.processes import Child, Children, shard_argv, wait_healthy
from harness.report import load_line, progress, render_table, write_json
from harness.timing import measure_loop, with_cpu

LENGTH, PERIOD, CORE = 80, 40, 64  # as bench/sequence_throughput.py
STEPS = "obs:float32[4],action:int64[],reward:float32[],discount:float32[]"
ITEMS = f"state:float32[2,{CORE}],prev_action:int64[],prev_reward:float32[],episode_start:bool[],weight_version:int64[]"


# ------------------------------------------------------------------------------------------- the writer process
def write(address: str, shard_pid: int, windows: int, seconds: float, warmup: float, seed: int) -> dict:
    """One version's writer (this process imports that version): items/s and CPU per item of both sides."""
    import numpy as np

    from apexrl.replay_server import ShardedWriter
    from apexrl.replay_server.client.sequence_writer import SequenceWriter

    rng = np.random.default_rng(seed)
    steps = [
        (
            {
                "obs": rng.standard_normal(4).astype(np.float32),
                "action": np.int64(rng.integers(2)),
                "reward": np.float32(1.0),
                "discount": np.float32(0.99),
            },
            {
                "state": rng.standard_normal((2, CORE)).astype(np.float32),
                "prev_action": np.int64(0),
                "prev_reward": np.float32(1.0),
                "episode_start": np.bool_(False),
                "weight_version": np.int64(1),
            },
        )
        for _ in range(1_000)
    ]
    extra = {} if windows == 1 else {"windows_per_request": windows}  # a baseline may not know the option
    with ShardedWriter(address, timeout=120) as sharded:
        writer = SequenceWriter(sharded, length=LENGTH, period=PERIOD, **extra)
        position = [0]

        def one_item() -> None:  # PERIOD steps: one window completes
            for _ in range(PERIOD):
                step, fields = steps[position[0] % len(steps)]
                writer.append(step, fields)
                position[0] += 1

        def acknowledged() -> None:
            writer.flush(120)

        m = with_cpu(shard_pid, measure_loop, one_item, seconds, warmup, finish=acknowledged)
    return {  # cores (over warm-up and measured window) over items/s: CPU seconds per item
        "items_per_s": m.rate,
        "writer_us_per_item": m.client_cpu / m.rate * 1e6,
        "shard_us_per_item": m.server_cpu / m.rate * 1e6,
    }


def run_writer(child: Child, env: dict[str, str] | None, windows: int, args: argparse.Namespace) -> dict:
    argv = [sys.executable, __file__, "--writer", child.address, "--shard-pid", str(child.pid)]
    argv += ["--windows", str(windows), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the writer failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------- run
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline", default="HEAD", help="git ref of the code to compare with (default HEAD)"
    )
    parser.add_argument("--windows", default="1,2,4", help="this checkout's windows_per_request values")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per figure per round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--capacity", type=int, default=100_000, help="each shard's capacity, steps")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s")
    parser.add_argument("--json", metavar="PATH", help="write every round's figures here")
    parser.add_argument("--writer", metavar="ADDRESS", help=argparse.SUPPRESS)  # the writer process
    parser.add_argument("--shard-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        windows = int(args.windows)
        print(json.dumps(write(args.writer, args.shard_pid, windows, args.seconds, args.warmup, 0)))
        return 0
    if args.quick:
        args.rounds, args.seconds, args.warmup = 2, 1.0, 0.5
    windows = [int(w) for w in args.windows.split(",")]
    load_before = os.getloadavg()[0]
    shard = shard_argv(args.capacity, seed=0)
    shard += ["--max-sequence-length", str(LENGTH), "--signature", STEPS, "--item-signature", ITEMS]
    with tempfile.TemporaryDirectory(prefix="sequence_insert_ab_") as workdir, Children(workdir) as children:
        path = baseline_pythonpath(args.baseline, Path(workdir) / "baseline")
        old_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])),
        }
        if not imported_from("apexrl.replay_server.server.service", old_env, workdir).is_relative_to(workdir):
            raise RuntimeError("the baseline would not import the baseline's code")
        old = Child("baseline", shard, workdir, env=old_env, cwd=workdir)
        children.started.append(old)
        new = children.start("checkout", shard)
        wait_healthy([old, new])
        baseline = f"baseline {describe(args.baseline)}, 1 window/request"
        configs = {baseline: (old, old_env, 1)}
        configs.update({f"this checkout, {k} windows/request": (new, None, k) for k in windows})
        rounds: dict[str, list[dict]] = {name: [] for name in configs}
        for r in range(args.rounds):
            for name in list(configs) if r % 2 == 0 else list(reversed(configs)):
                child, env, k = configs[name]
                figures = run_writer(child, env, k, args)
                rounds[name].append(figures)
                progress(
                    f"round {r + 1}/{args.rounds} {name}: {figures['items_per_s']:,.0f} items/s, writer "
                    f"{figures['writer_us_per_item']:,.0f} us/item, shard {figures['shard_us_per_item']:,.0f}"
                )
    medians = {
        name: {f: statistics.median(x[f] for x in runs) for f in runs[0]} for name, runs in rounds.items()
    }
    base = medians[baseline]["items_per_s"]
    lines = [
        [
            name,
            f"{m['items_per_s']:,.0f}",
            f"{m['items_per_s'] / base:.2f}x",
            f"{m['writer_us_per_item']:,.0f}",
            f"{m['shard_us_per_item']:,.0f}",
        ]
        for name, m in medians.items()
    ]
    headers = [
        "configuration (median of rounds)",
        "items/s",
        "vs baseline",
        "writer us/item",
        "shard us/item",
    ]
    print("\n".join(render_table(headers, lines, left={0})))
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"rounds": rounds, "medians": medians, "root": str(ROOT)})
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    if "--writer" not in sys.argv:
        progress(f"done in {time.perf_counter() - started:.0f}s")
    sys.exit(code)

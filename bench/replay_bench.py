#!/usr/bin/env python
"""Replay shard benchmark: apexrl over loopback gRPC, in-process, next to the raw gRPC ceiling (and cpprb).

One run measures, each figure for `--seconds` after an unmeasured `--warmup`:

  1. `replay_insert`: SDK insert throughput (ReplayClient.insert, streamed with acks) into a shard running in
     another process, CartPole-size and Atari-size rows, batches of 64 and 256 rows with priorities.
  2. `replay_sample_update`: on a FULL shard (`--capacity` rows, 1,000,000 by default): sample(256)/s blocking
     and pipelined, update_priorities(256)/s blocking, pipelined and streamed, and a learner-like cycle.
  3. `replay_inprocess`: the same operations in-process on SumTree and ReplayTable (no gRPC, no codec).
  4. The raw gRPC ceiling of every gRPC figure (`harness/ceiling.py`): the same call shape and message size
     against a bytes-only server in its own process; every apexrl figure is printed next to it as a ratio.
  5. `replay_cpprb`, with `--cpprb`: cpprb's PrioritizedReplayBuffer at the same capacity, run by
     `--cpprb-python` (an interpreter where `import cpprb` works; cpprb is never required).
  6. `replay_pixels`: real Pong frames (played with ale-py), compressed (zstd, LZ4) against raw in the same run:
     the actor's compression cost, inserts into one shard, bytes per stored transition, and the learner's data
     path (sampler process, decompression included) in batches of 256 per second.

Servers (the replay shard through `python -m apexrl.launcher replay`, and the ceiling server) run in separate
processes, so the client and the server do not share a GIL. Progress goes to stderr, the table to stdout, and
`--json PATH` writes every figure as JSON. `--quick` runs small sizes for a smoke test (~20 s).

    .venv/bin/python bench/replay_bench.py --json /tmp/replay_bench.json
    .venv/bin/python bench/replay_bench.py --quick
    .venv/bin/python bench/replay_bench.py --cpprb --cpprb-python bench/results/cpprb-venv/bin/python
    .venv/bin/python bench/replay_bench.py --sections pixels            # the pixel figures alone (~1 minute)

(bench/README.md says how to make the cpprb interpreter.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import asdict, dataclass

import numpy as np
from harness.ceiling import CeilingClient, start_ceiling_server
from harness.processes import Children, wait_healthy
from harness.report import load_line, metadata, progress, write_json
from harness.results import Results, print_aio_rows, print_rows
from harness.timing import Timing
from replay_cpprb import measure_cpprb
from replay_inprocess import measure_in_process
from replay_insert import measure_inserts
from replay_pixels import measure_pixels
from replay_sample_update import fill_shard, measure_full_shard
from workloads import FILL_BATCH

SECTIONS = ("insert", "shard", "inprocess", "pixels")
FOOTER = """\
ceiling: the raw gRPC figure for the same call shape and message size, measured in this run against a
  bytes-only server in its own process, in the unit of the figure; ratio = value / ceiling (in-process cycle:
  value / cpprb).
MB/s: row payload (1 MB = 1e6 B); message bytes for the ceilings.
cores: CPU used by the client process + the server process during the figure (1.00 = one core busy).
CPU us/call: those CPU seconds per call (per batch or message for streams) in each process. Other processes'
  load lowers the rates much more than these (a VM's stolen time still inflates them); 1e6 / the larger of the
  two roughly bounds the rate on an idle machine."""


@dataclass
class RunInfo:
    """What the run reports besides its figures."""

    load_before: float
    load_after: float = 0.0
    fill_rate: float | None = None  # rows/s while filling the CartPole shard
    cpprb_skipped: str | None = None  # why the cpprb worker failed
    pixels_skipped: str | None = None  # why the pixel figures could not run (no ale-py, zstandard or lz4)


def run(args: argparse.Namespace, results: Results) -> RunInfo:
    info = RunInfo(os.getloadavg()[0])
    timing = Timing(args.seconds, args.warmup)
    rng = np.random.default_rng(0)
    try:
        if set(args.sections) & {"insert", "shard"}:
            info.fill_rate = run_grpc(args, results, timing, rng)
        if "inprocess" in args.sections:
            measure_in_process(results, timing, args.capacity, args.atari_capacity, rng)
        if "pixels" in args.sections:
            try:
                with tempfile.TemporaryDirectory(prefix="replay_bench_pixels_") as workdir:
                    measure_pixels(
                        results, timing, args.atari_capacity, args.pong_rows, args.insert_window, workdir
                    )
            except ImportError as err:  # the `atari` extra (ale-py) or the `compression` one is missing
                info.pixels_skipped = f"{err} (in the clone: pip install -e '.[atari]')"
        if args.cpprb:
            info.cpprb_skipped = measure_cpprb(
                results, args.cpprb_python or sys.executable, args.capacity, args.seconds, args.warmup
            )
    finally:
        info.load_after = os.getloadavg()[0]
    return info


def run_grpc(
    args: argparse.Namespace, results: Results, timing: Timing, rng: np.random.Generator
) -> float | None:
    """The gRPC figures (parts 1 and 2) with their ceilings; returns the fill rate of the full shard."""
    fill_rate = None
    with tempfile.TemporaryDirectory(prefix="replay_bench_") as workdir, Children(workdir) as children:
        progress("starting the ceiling server and the replay shards (separate processes)")
        echo = start_ceiling_server(children)
        echo_aio = start_ceiling_server(children, aio=True) if "shard" in args.sections else None
        shards = {"cartpole": children.start_shard("shard-cartpole", args.capacity)}
        if "insert" in args.sections:
            shards["atari"] = children.start_shard("shard-atari", args.atari_capacity)
        echo.wait_ready()
        wait_healthy(list(shards.values()))
        ceiling = CeilingClient(echo, timing)
        aio_ceiling = CeilingClient(echo_aio, timing) if echo_aio is not None else None
        try:
            if "insert" in args.sections:
                measure_inserts(results, ceiling, shards, timing, args.insert_window, rng)
            if "shard" in args.sections:
                fill_rate = fill_shard(shards["cartpole"].address, args.capacity, rng)
                measure_full_shard(
                    results,
                    ceiling,
                    shards["cartpole"],
                    timing,
                    args.window,
                    args.sample_window,
                    rng,
                    sample_batches=args.sample_batches,
                    aio_ceiling=aio_ceiling,
                )
        finally:
            ceiling.close()
            if aio_ceiling is not None:
                aio_ceiling.close()
    return fill_rate


def print_report(results: Results, info: RunInfo, file=sys.stdout) -> None:
    print_rows(results, file)
    print(FOOTER, file=file)
    print_aio_rows(results, file)
    if info.fill_rate:
        print(
            f"Shard filled at {info.fill_rate:,.0f} rows/s in batches of {FILL_BATCH:,} through the SDK.",
            file=file,
        )
    if info.pixels_skipped:
        print(f"Pixel figures skipped: {info.pixels_skipped}.", file=file)
    print(load_line(info.load_before, info.load_after, nice_label="this run's niceness"), file=file)


# ------------------------------------------------------------------------------------------------------- main


def _add_size_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=None, help="measured time per figure (default 3; 0.3 with --quick)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="unmeasured warm-up before each figure (default 0.5; 0.1 with --quick)",
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="slots of the full CartPole shard and the in-process table (default 1,000,000; "
        "50,000 with --quick)",
    )
    parser.add_argument(
        "--atari-capacity",
        type=int,
        default=None,
        help="slots of the Atari shard/table; rows are 56 KiB (default 20,000; 1,000 with --quick)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=16,
        help="priority updates in flight for the pipelined and streamed figures (default 16)",
    )
    parser.add_argument(
        "--sample-window",
        type=int,
        default=4,
        help="samples in flight for the pipelined sample figure (default 4)",
    )
    parser.add_argument(
        "--sample-batches",
        type=int,
        default=4,
        help="256-row batches per Sample answer for the multi-batch figures (SampleRequest.batch_rows; "
        "default 4, the learner's sample_batches_per_call)",
    )
    parser.add_argument(
        "--pong-rows",
        type=int,
        default=None,
        help="real Pong transitions played for the pixel figures (default 2,048; 512 with --quick)",
    )
    parser.add_argument(
        "--insert-window",
        type=int,
        default=32,
        help="ReplayClient max_in_flight for the insert figures (default 32, the SDK default)",
    )


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sections",
        nargs="+",
        default=list(SECTIONS),
        choices=SECTIONS,
        help="what to measure (default: all)",
    )
    parser.add_argument(
        "--cpprb",
        action="store_true",
        help="also measure cpprb's PrioritizedReplayBuffer (needs `import cpprb` in --cpprb-python)",
    )
    parser.add_argument(
        "--cpprb-python",
        default=None,
        help="interpreter with numpy and cpprb for --cpprb (default: this one)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and short figures (~20 s smoke run)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_size_args(parser)
    _add_run_args(parser)
    args = parser.parse_args(argv)
    defaults = {
        "seconds": (3.0, 0.3),
        "warmup": (0.5, 0.1),
        "capacity": (1_000_000, 50_000),
        "atari_capacity": (20_000, 1_000),
        "pong_rows": (2048, 512),
    }
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    if args.capacity < FILL_BATCH or args.atari_capacity < 256:
        parser.error(f"--capacity must be >= {FILL_BATCH} and --atari-capacity >= 256")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = Results()
    info = run(args, results)
    print_report(results, info)
    if args.json:
        write_json(
            args.json,
            {
                "meta": metadata(args),
                "load_average_1min": [info.load_before, info.load_after],
                "fill_rows_per_s": info.fill_rate,
                "cpprb_skipped": info.cpprb_skipped,
                "pixels_skipped": info.pixels_skipped,
                "figures": {key: asdict(row) for key, row in results.by_key.items()},
            },
        )
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

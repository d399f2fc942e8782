#!/usr/bin/env python
"""Learner benchmark: updates/s fed by 2 replay shards over gRPC versus in-process shards of the same rows.

One run:

  1. starts 2 replay shards in their own processes (`python -m apexrl.launcher replay --port 0 --port-file F`,
     what operators run) and fills each through the SDK `ReplayClient` with `--rows` synthetic CartPole-shaped
     n-step transitions (obs float32[4], action int64, reward float32, discount float32, next_obs float32[4])
     with random priorities, from a fixed seed (`learner_feed`);
  2. builds the in-process equivalent: two `ReplayTable`s with the same `TableConfig` (capacity, alpha,
     seed) filled with the same rows and priorities in the same batches, wrapped as in-process shards
     (`inprocess_shard.TableShard`, the `Shard` protocol) and handed to the real `ShardedReplayClient` by
     the learner's own `make_sampler`: the same allocation across shards, importance weights and priority
     coalescing as the gRPC mode; only the transport differs. Before measuring it checks that both sides hold
     the same rows and that, with the same seeds, both samplers draw the same batch; it stops otherwise;
  3. measures the real `Learner.run` loop (`train_step` fed by the real `Prefetcher`, weights published into
     an in-process `WeightStore`, `torch.set_num_threads(1)`, CPU) with `--batch-size` 256 in phases of
     `--warmup` + `--seconds`, alternating the modes (gRPC, in-process, gRPC, in-process, ...) to cancel
     drift (`learner_phase`). Each phase gets a fresh Learner with the same seed, and every shard/table's
     priorities are reset to the initial ones before it, so each phase starts from identical contents;
  4. (unless `--no-reference`) a reference phase where the Prefetcher hands out one pre-sampled batch again
     and again: the learner's speed with free sampling, the ceiling of both modes on this machine.

Per phase it records updates/s, the fraction of wall time the train loop waited for a batch (sample wait) and
spent in train_step, and the CPU seconds of the learner process (all threads) and of each shard process
(/proc/<pid>/stat). The summary is the ratio distributed / in-process (total updates / total measured seconds
per mode) against the issue's target (>= 0.85), plus the per-round ratios.

    .venv/bin/python bench/learner_bench.py --json /tmp/learner_bench.json    # full run, ~1.5 minutes
    .venv/bin/python bench/learner_bench.py --quick                           # smoke run, ~20 s

Progress goes to stderr, the table to stdout; `--json PATH` writes every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from harness.processes import Children, wait_healthy
from harness.report import autogroup, load_line, metadata, progress, render_table, write_json
from harness.timing import Timing
from inprocess_shard import TableShard
from learner_feed import (
    ReusedBatchSampler,
    build_tables,
    check_same_batches,
    check_same_contents,
    fill_shards,
    grpc_sampler,
    in_process_sampler,
    reset_priorities,
    shard_rows,
)
from learner_phase import MODE_NAMES, MODES, TARGET_RATIO, Phase, run_phase, summarize, warm_up_torch


@dataclass
class Run:
    """What one run measured, besides the per-phase figures."""

    load_before: float
    load_after: float = 0.0
    fill_seconds: float = 0.0
    contents: dict = field(default_factory=dict)
    phases: list[Phase] = field(default_factory=list)


def run(args: argparse.Namespace) -> Run:
    import torch

    torch.set_num_threads(1)
    result = Run(os.getloadavg()[0])
    try:
        with tempfile.TemporaryDirectory(prefix="learner_bench_") as workdir, Children(workdir) as children:
            progress(f"starting 2 replay shards (capacity {args.capacity:,}, alpha {args.alpha})")
            shards = [children.start_shard(f"shard-{i}", args.capacity, seed=args.seed + i, alpha=args.alpha)
                      for i in range(2)]
            wait_healthy(shards)
            measure(args, result, [c.address for c in shards], [c.pid for c in shards])
    finally:
        result.load_after = os.getloadavg()[0]
    return result


def learner_config(args: argparse.Namespace, addresses: list[str]):
    from apexrl.learner.config import LearnerConfig

    return LearnerConfig(replay=tuple(addresses), env="CartPole-v1", batch_size=args.batch_size, device="cpu",
                         seed=args.seed, min_replay_size=1_000, torch_threads=1)


def measure(args: argparse.Namespace, result: Run, addresses: list[str], pids: list[int]) -> None:
    """Fill both feeds, check them identical, then run the phases."""
    data = [shard_rows(i, args.rows, args.seed) for i in range(2)]
    progress(f"filling each shard with {args.rows:,} CartPole rows through ReplayClient")
    result.fill_seconds = fill_shards(addresses, data)
    progress(f"  filled in {result.fill_seconds:.1f}s; building the in-process tables")
    tables = build_tables(data, args.capacity, args.alpha, args.seed)
    shards = [TableShard(table, f"in-process-{i}") for i, table in enumerate(tables)]
    config = learner_config(args, addresses)
    result.contents = check_same_contents(addresses, tables, data)
    result.contents["same_first_batch"] = check_same_batches(config, shards)
    progress("  shards and in-process tables hold the same rows and priorities and, with the same seeds, "
             "the gRPC and the in-process ShardedReplayClient draw the same batch")
    reset_priorities(addresses, tables, data)
    with in_process_sampler(config, shards) as sampler:
        ref_batch = sampler.sample(args.batch_size, beta=0.4)
    warm_up_torch(config, ref_batch)
    timing = Timing(args.seconds, args.warmup)
    for r, mode in phase_order(args):
        reset_priorities(addresses, tables, data)
        phase = Phase(len(result.phases) + 1, mode, r + 1)
        progress(f"phase {phase.index}: {MODE_NAMES[mode]} (round {r + 1}), {args.warmup:g}s warm-up + "
                 f"{args.seconds:g}s")
        if mode == "inprocess":
            sampler = in_process_sampler(config, shards)
        else:
            sampler = grpc_sampler(dataclasses.replace(config, sampler_process=mode == "grpc"))
        result.phases.append(run_phase(phase, config, sampler, pids, timing))
        progress(f"  {phase.updates_per_s:,.1f} updates/s, sample wait {phase.sample_wait_fraction:.1%}, "
                 f"learner CPU {phase.learner_cpu_s / phase.seconds:.2f} cores, shards "
                 f"{sum(phase.shard_cpu_s) / phase.seconds:.2f} cores, load {phase.load_average_1min:.2f}")
    if args.reference:
        phase = Phase(len(result.phases) + 1, "reference", 0)
        progress(f"phase {phase.index}: {MODE_NAMES['reference']}, {args.warmup:g}s warm-up + "
                 f"{args.seconds:g}s")
        result.phases.append(run_phase(phase, config, ReusedBatchSampler(ref_batch), pids, timing))
        progress(f"  {phase.updates_per_s:,.1f} updates/s")


def phase_order(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(round, mode) pairs: A B A B, or A B B A with --abba; only the modes asked for."""
    order = [(r, m) for r in range(args.rounds)
             for m in (MODES if r % 2 == 0 or not args.abba else MODES[::-1])]
    return [(r, m) for r, m in order if m in args.modes]


# ----------------------------------------------------------------------------------------------------- output

NOTES = """\
wait / step: share of measured wall time the train loop spent waiting in Prefetcher.get / in train_step
  (forward, backward, optimiser, priority update hand-off); ms: the same per update.
learner cores: CPU of this process (train loop, prefetch thread, gRPC threads) and of its sampler process / wall; shard cores: each shard
  process (/proc/<pid>/stat). On 2 cores the gRPC mode runs 3 busy processes, the in-process mode 1."""


def phase_cells(p: Phase) -> list[str]:
    return [str(p.index), MODE_NAMES[p.mode], f"{p.updates_per_s:,.1f}", f"{p.updates:,}", f"{p.seconds:.1f}",
            f"{p.sample_wait_fraction:.1%}", f"{p.train_step_fraction:.1%}", f"{p.sample_wait_ms:.2f}",
            f"{p.train_step_ms:.2f}", f"{p.learner_cpu_s / p.seconds:.2f}",
            "+".join(f"{c / p.seconds:.2f}" for c in p.shard_cpu_s), f"{p.load_average_1min:.2f}"]


def print_report(args: argparse.Namespace, result: Run, summary: dict, torch_version: str,
                 file=sys.stdout) -> None:
    headers = ["#", "mode", "updates/s", "updates", "s", "wait", "step", "wait ms", "step ms",
               "learner cores", "shard cores", "load"]
    print(f"Learner updates/s, batch {args.batch_size}, CartPole rows, {args.rows:,} rows per shard/table "
          f"(capacity {args.capacity:,}, alpha {args.alpha}), torch {torch_version} CPU, 1 intra-op thread",
          file=file)
    for line in render_table(headers, [phase_cells(p) for p in result.phases], left={1}):
        print(line, file=file)
    print(file=file)
    for mode, m in summary["per_mode"].items():
        print(f"{MODE_NAMES[mode]:<30} {m['updates_per_s']:8,.1f} updates/s over {m['seconds']:5.1f}s; "
              f"sample wait {m['sample_wait_fraction']:.1%}; CPU per update: learner "
              f"{m['learner_cpu_ms_per_update']:.2f} ms + shards {m['shard_cpu_ms_per_update']:.2f} ms; "
              f"{m['total_cores']:.2f} cores in all", file=file)
    if "ratio" in summary:
        print(f"ratio gRPC / in-process = {summary['ratio']:.3f} (per round: "
              f"{', '.join(f'{r:.3f}' for r in summary['round_ratios'])}); target >= {TARGET_RATIO:.2f}: "
              f"{'met' if summary['met'] else 'NOT met'}", file=file)
    if "share_of_reference" in summary:
        print("share of the reference (sampling free): " + ", ".join(
            f"{MODE_NAMES[m]} {v:.1%}" for m, v in summary["share_of_reference"].items()), file=file)
    print(NOTES, file=file)
    print(load_line(result.load_before, result.load_after, show_autogroup=True), file=file)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}", file=file)


# ------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None,
                        help="measured time per phase (default 10; 3 with --quick)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="unmeasured time per phase (default 2; 1 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of (gRPC, in-process) phases (default 2; 1 with --quick)")
    parser.add_argument("--abba", action="store_true",
                        help="reverse the order in odd rounds (A B B A) instead of A B A B")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="modes to measure (default both; one mode is useful under a profiler)")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the reference phase (one batch reused, sampling free)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per shard (default 50,000; 20,000 with --quick)")
    parser.add_argument("--capacity", type=int, default=100_000,
                        help="slots per shard/table (default 100,000)")
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
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    result = run(args)
    summary = summarize(result.phases)
    print_report(args, result, summary, torch.__version__)
    if args.json:
        write_json(args.json, {
            "meta": {**metadata(args), "torch": torch.__version__, "autogroup": autogroup(),
                     "command": shlex.join([sys.executable, *sys.argv])},
            "load_average_1min": [result.load_before, result.load_after],
            "fill_seconds": result.fill_seconds,
            "contents": result.contents,
            "phases": [asdict(p) for p in result.phases],
            "summary": summary,
        })
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

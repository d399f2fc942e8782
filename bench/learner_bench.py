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

With `--env` other than CartPole-v1 (image environments: ALE/Pong-v5, MinAtar/Breakout-v1) it measures the
network the learner picks for that environment instead (Nature's conv net for Atari's uint8 [4, 84, 84] stacks,
MinAtar's for its [10, 10, C] planes): real transitions played with random actions, stored zstd-compressed (as
actors send them) in 2 shard processes, then per `--pixel-batch-sizes` one Learner doing `train_step` on batches
from its sampler process (sampling and decompression in the child) and the same Learner on one batch reused
(sampling removed: its ceiling here), side by side with the ratio (`measure_env`).

    .venv/bin/python bench/learner_bench.py --json /tmp/learner_bench.json    # full run, ~1.5 minutes
    .venv/bin/python bench/learner_bench.py --quick                           # smoke run, ~20 s
    .venv/bin/python bench/learner_bench.py --env ALE/Pong-v5 MinAtar/Breakout-v1   # conv nets, ~1 minute

Progress goes to stderr, the table to stdout; `--json PATH` writes every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np
from harness.processes import Children, wait_healthy
from harness.report import autogroup, load_line, metadata, progress, render_table, write_json
from harness.results import Results, print_rows
from harness.timing import Measurement, Timing, measure_loop, process_cpu_seconds, with_cpu
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
from workloads import priorities

from apexrl.learner.feed import ThreadFeed

CARTPOLE = "CartPole-v1"


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
            shards = [
                children.start_shard(f"shard-{i}", args.capacity, seed=args.seed + i, alpha=args.alpha)
                for i in range(2)
            ]
            wait_healthy(shards)
            measure(args, result, [c.address for c in shards], [c.pid for c in shards])
    finally:
        result.load_after = os.getloadavg()[0]
    return result


def learner_config(args: argparse.Namespace, addresses: list[str]):
    from apexrl.learner.config import LearnerConfig

    return LearnerConfig(
        replay=tuple(addresses),
        env="CartPole-v1",
        batch_size=args.batch_size,
        device="cpu",
        seed=args.seed,
        min_replay_size=1_000,
        torch_threads=1,
    )


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
    progress(
        "  shards and in-process tables hold the same rows and priorities and, with the same seeds, "
        "the gRPC and the in-process ShardedReplayClient draw the same batch"
    )
    reset_priorities(addresses, tables, data)
    with in_process_sampler(config, shards) as sampler:
        ref_batch = sampler.sample(args.batch_size, beta=0.4)
    warm_up_torch(config, ref_batch)
    timing = Timing(args.seconds, args.warmup)
    for r, mode in phase_order(args):
        reset_priorities(addresses, tables, data)
        phase = Phase(len(result.phases) + 1, mode, r + 1)
        progress(
            f"phase {phase.index}: {MODE_NAMES[mode]} (round {r + 1}), {args.warmup:g}s warm-up + "
            f"{args.seconds:g}s"
        )
        if mode == "inprocess":
            sampler = ThreadFeed(in_process_sampler(config, shards), config)
        else:
            sampler = grpc_sampler(dataclasses.replace(config, sampler_process=mode == "grpc"))
        result.phases.append(run_phase(phase, config, sampler, pids, timing))
        progress(
            f"  {phase.updates_per_s:,.1f} updates/s, sample wait {phase.sample_wait_fraction:.1%}, "
            f"learner CPU {phase.learner_cpu_s / phase.seconds:.2f} cores, shards "
            f"{sum(phase.shard_cpu_s) / phase.seconds:.2f} cores, load {phase.load_average_1min:.2f}"
        )
    if args.reference:
        phase = Phase(len(result.phases) + 1, "reference", 0)
        progress(
            f"phase {phase.index}: {MODE_NAMES['reference']}, {args.warmup:g}s warm-up + {args.seconds:g}s"
        )
        # One batch per draw, so the reference stays comparable with the runs in bench/README.md.
        reference = dataclasses.replace(config, sample_batches_per_call=1)
        feed = ThreadFeed(ReusedBatchSampler(ref_batch), reference)
        result.phases.append(run_phase(phase, reference, feed, pids, timing))
        progress(f"  {phase.updates_per_s:,.1f} updates/s")


def phase_order(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(round, mode) pairs: A B A B, or A B B A with --abba; only the modes asked for."""
    order = [
        (r, m) for r in range(args.rounds) for m in (MODES if r % 2 == 0 or not args.abba else MODES[::-1])
    ]
    return [(r, m) for r, m in order if m in args.modes]


# ------------------------------------------------------------------------------------ other envs: conv nets

SHARDS = 2  # as the default local fleet
FILL_BATCH_ROWS = 256


@dataclass
class EnvRun:
    """What the `--env` run reports besides its figures: per environment, its network and stored rows."""

    load_before: float
    load_after: float = 0.0
    envs: dict[str, dict] = field(default_factory=dict)


def run_envs(args: argparse.Namespace, results: Results) -> EnvRun:
    import torch

    torch.set_num_threads(1)  # the learner's default (torch_threads): the fleet shares the cores
    result = EnvRun(os.getloadavg()[0])
    try:
        with (
            tempfile.TemporaryDirectory(prefix="learner_bench_envs_") as workdir,
            Children(workdir) as children,
        ):
            for env_id in args.env:
                result.envs[env_id] = measure_env(args, results, children, env_id)
    finally:
        result.load_after = os.getloadavg()[0]
    return result


def measure_env(args: argparse.Namespace, results: Results, children: Children, env_id: str) -> dict:
    """Play and store real transitions of `env_id` in 2 fresh shards, then measure each batch size."""
    from apexrl.algorithms.torso_specs import resolve_network
    from apexrl.common.compression import compress_image_columns
    from apexrl.common.environments import env_spaces

    spaces = env_spaces(env_id)
    network = resolve_network("auto", spaces)
    total = args.rows * SHARDS
    progress(f"{env_id}: playing {total:,} transitions with random actions ({network} network)")
    started = time.perf_counter()
    columns = compress_image_columns(play_transitions(env_id, total, args.seed), "zstd")
    slug = env_id.replace("/", "_")
    shards = [
        children.start_shard(f"shard-{slug}-{i}", args.rows, seed=args.seed + i, alpha=args.alpha)
        for i in range(SHARDS)
    ]
    wait_healthy(shards)
    addresses = [shard.address for shard in shards]
    stored = fill_env_shards(addresses, columns, args.seed)
    progress(f"  played and stored in {time.perf_counter() - started:.1f}s: {stored:,.0f} B per stored row")
    section = (
        f"learner updates/s: {env_id}, {network} net on {spaces.obs_dtype}{list(spaces.obs_shape)}, "
        f"{spaces.num_actions} actions, CPU, 1 torch thread"
    )
    for batch_size in args.pixel_batch_sizes:
        config = env_learner_config(args, env_id, addresses, batch_size)
        measure_batch_size(
            results,
            section,
            f"{slug}_{batch_size}",
            config,
            spaces,
            [s.pid for s in shards],
            Timing(args.seconds, args.warmup),
        )
    for shard in shards:  # idle from here on; the next environment gets its own
        shard.stop()
    return {
        "network": network,
        "obs_shape": list(spaces.obs_shape),
        "obs_dtype": spaces.obs_dtype,
        "num_actions": spaces.num_actions,
        "rows": total,
        "stored_bytes_per_row": stored,
    }


def play_transitions(env_id: str, count: int, seed: int) -> dict[str, np.ndarray]:
    """`count` n-step transitions as the built-in actor makes them (its preprocessing, 3-step returns, rewards
    clipped where actors clip them), random actions: real frames, which compress as a fleet's do."""
    from apexrl.algorithms.nstep import NStepWriter, item_columns
    from apexrl.common.environments import clips_rewards, make_env

    env = make_env(env_id)
    rng = np.random.default_rng(seed)
    clip = clips_rewards(env_id)
    obs, _ = env.reset(seed=seed)
    accumulator = NStepWriter(3, 0.99)
    transitions: list = []
    while len(transitions) < count:
        action = int(rng.integers(env.action_space.n))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        reward = float(np.clip(reward, -1, 1)) if clip else float(reward)
        transitions += accumulator.push(obs, action, reward, next_obs, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    columns = item_columns(transitions[:count])
    columns["weight_version"] = np.zeros(count, dtype=np.int64)
    return columns


def fill_env_shards(addresses: list[str], columns: dict, seed: int) -> float:
    """Split the rows evenly over the shards (SDK inserts, random priorities); bytes per stored row, as the
    shards count them."""
    from apexrl.common.compression import take_rows
    from apexrl.replay_server.client.replay_client import ReplayClient

    rng = np.random.default_rng(seed)
    per_shard = len(columns["action"]) // len(addresses)
    stored = size = 0
    for i, address in enumerate(addresses):
        with ReplayClient(address, timeout=120) as client:
            for start in range(i * per_shard, (i + 1) * per_shard, FILL_BATCH_ROWS):
                rows = slice(start, min(start + FILL_BATCH_ROWS, (i + 1) * per_shard))
                batch = {name: take_rows(column, rows) for name, column in columns.items()}
                client.insert(batch, priorities(len(batch["action"]), rng))
            client.flush(120)
            info = client.info()
        stored, size = stored + info.stored_bytes, size + info.size
    return stored / size


def env_learner_config(args: argparse.Namespace, env_id: str, addresses: list[str], batch_size: int):
    """The learner's defaults (sampler process, prefetch depth, batches per call, publish every 10 updates)."""
    from apexrl.learner.config import LearnerConfig

    return LearnerConfig(
        replay=tuple(addresses),
        env=env_id,
        batch_size=batch_size,
        device="cpu",
        seed=args.seed,
        min_replay_size=1,
        torch_threads=1,
    )


def measure_batch_size(
    results: Results, section: str, key: str, config, spaces, shard_pids: list[int], timing: Timing
) -> None:
    """One Learner: train_step on batches from its sampler process, then on one batch reused (the ceiling)."""
    from apexrl.learner.learner import Learner, make_sampler
    from apexrl.parameter_server.store import WeightStore

    b = config.batch_size
    progress(
        f"  batch {b}: train_step fed by the sampler process, {timing.warmup:g}s warm-up + {timing.seconds:g}s"
    )
    learner = Learner(config, spaces, make_sampler(config), WeightStore().publish)
    fed, wait_share, shard_cores, batch = fed_phase(learner, shard_pids, timing)
    progress(f"  batch {b}: the same Learner on one batch reused (sampling removed)")
    learner.sampler = ReusedBatchSampler(batch)
    ceiling = with_cpu(None, measure_loop, lambda: learner.train_step(batch), timing.seconds, timing.warmup)
    row_bytes = b * sum(column[0].nbytes for column in batch.columns.values())
    results.figure(
        f"learner_{key}_fed",
        section,
        f"batch {b}: fed by its sampler process ({SHARDS} shards, zstd)",
        fed,
        "updates/s",
        row_bytes=row_bytes,
        ceiling=ceiling.rate,
        ceiling_name="one batch reused",
        note=f"{fed.rate * b:,.0f} rows/s, waited for a batch {wait_share:.1%} of the time, shards "
        f"{shard_cores:.2f} cores",
    )
    results.figure(
        f"learner_{key}_reference",
        section,
        f"batch {b}: one batch reused (sampling removed)",
        ceiling,
        "updates/s",
        row_bytes=row_bytes,
        note="the ceiling of the line above",
    )


def fed_phase(learner, shard_pids: list[int], timing: Timing) -> tuple[Measurement, float, float, object]:
    """Updates/s of `learner` on its sampler process's batches (the body of Learner.run); also the share of the
    measured time spent waiting for a batch, the shards' cores, and a copy of the last batch."""
    sampler = learner.sampler
    feed = sampler.start(learner.beta)
    waited, marks, last = [0.0], [], []  # marks: (waited, wall, shards' CPU) after the warm-up and at the end

    def step() -> None:
        t0 = time.perf_counter()
        batch = feed.get(timeout=60)
        waited[0] += time.perf_counter() - t0
        if batch is None:
            raise TimeoutError("no batch from the sampler process within 60 s")
        learner.train_step(batch)
        last[:] = [batch]

    def mark() -> None:
        marks.append((waited[0], time.perf_counter(), sum(process_cpu_seconds(pid) for pid in shard_pids)))

    try:
        m = with_cpu(sampler.pid, measure_loop, step, timing.seconds, timing.warmup, finish=mark)
        batch = dataclasses.replace(
            last[0], columns={k: v.copy() for k, v in last[0].columns.items()}, weights=last[0].weights.copy()
        )  # the slot's views die with the sampler
    finally:
        sampler.close()
    (w1, t1, c1), (w2, t2, c2) = marks
    return m, (w2 - w1) / (t2 - t1), (c2 - c1) / (t2 - t1), batch


def print_env_report(results: Results, result: EnvRun, file=sys.stdout) -> None:
    print_rows(results, file)
    print(
        "value, ceiling: updates/s; ratio = fed / one batch reused (the same learner with sampling removed), "
        "same run.\nMB/s: decompressed rows trained on. cores cli+srv: the learner's process + its sampler "
        "process (CPU / wall, warm-up included); CPU us/call: per update.",
        file=file,
    )
    for key, row in results.by_key.items():
        if key.endswith("_fed"):
            print(f"{key}: {row.note}", file=file)
    for env_id, env in result.envs.items():
        print(
            f"{env_id}: {env['rows']:,} real transitions (random play) over {SHARDS} shards, zstd, "
            f"{env['stored_bytes_per_row']:,.0f} B per stored row",
            file=file,
        )
    print(load_line(result.load_before, result.load_after, show_autogroup=True), file=file)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}", file=file)


def main_envs(args: argparse.Namespace) -> int:
    import torch

    results = Results()
    result = run_envs(args, results)
    print_env_report(results, result)
    if args.json:
        write_json(
            args.json,
            {
                "meta": {
                    **metadata(args),
                    "torch": torch.__version__,
                    "autogroup": autogroup(),
                    "command": shlex.join([sys.executable, *sys.argv]),
                },
                "load_average_1min": [result.load_before, result.load_after],
                "envs": result.envs,
                "figures": {key: asdict(row) for key, row in results.by_key.items()},
            },
        )
    progress("done")
    return 0


# ----------------------------------------------------------------------------------------------------- output

NOTES = """\
wait / step: share of measured wall time the train loop spent waiting in Prefetcher.get / in train_step
  (forward, backward, optimiser, priority update hand-off); ms: the same per update.
learner cores: CPU of this process (train loop, prefetch thread, gRPC threads) and of its sampler process / wall; shard cores: each shard
  process (/proc/<pid>/stat). On 2 cores the gRPC mode runs 3 busy processes, the in-process mode 1."""


def phase_cells(p: Phase) -> list[str]:
    return [
        str(p.index),
        MODE_NAMES[p.mode],
        f"{p.updates_per_s:,.1f}",
        f"{p.updates:,}",
        f"{p.seconds:.1f}",
        f"{p.sample_wait_fraction:.1%}",
        f"{p.train_step_fraction:.1%}",
        f"{p.sample_wait_ms:.2f}",
        f"{p.train_step_ms:.2f}",
        f"{p.learner_cpu_s / p.seconds:.2f}",
        "+".join(f"{c / p.seconds:.2f}" for c in p.shard_cpu_s),
        f"{p.load_average_1min:.2f}",
    ]


def print_report(
    args: argparse.Namespace, result: Run, summary: dict, torch_version: str, file=sys.stdout
) -> None:
    headers = [
        "#",
        "mode",
        "updates/s",
        "updates",
        "s",
        "wait",
        "step",
        "wait ms",
        "step ms",
        "learner cores",
        "shard cores",
        "load",
    ]
    print(
        f"Learner updates/s, batch {args.batch_size}, CartPole rows, {args.rows:,} rows per shard/table "
        f"(capacity {args.capacity:,}, alpha {args.alpha}), torch {torch_version} CPU, 1 intra-op thread",
        file=file,
    )
    for line in render_table(headers, [phase_cells(p) for p in result.phases], left={1}):
        print(line, file=file)
    print(file=file)
    for mode, m in summary["per_mode"].items():
        print(
            f"{MODE_NAMES[mode]:<30} {m['updates_per_s']:8,.1f} updates/s over {m['seconds']:5.1f}s; "
            f"sample wait {m['sample_wait_fraction']:.1%}; CPU per update: learner "
            f"{m['learner_cpu_ms_per_update']:.2f} ms + shards {m['shard_cpu_ms_per_update']:.2f} ms; "
            f"{m['total_cores']:.2f} cores in all",
            file=file,
        )
    if "ratio" in summary:
        print(
            f"ratio gRPC / in-process = {summary['ratio']:.3f} (per round: "
            f"{', '.join(f'{r:.3f}' for r in summary['round_ratios'])}); target >= {TARGET_RATIO:.2f}: "
            f"{'met' if summary['met'] else 'NOT met'}",
            file=file,
        )
    if "share_of_reference" in summary:
        print(
            "share of the reference (sampling free): "
            + ", ".join(f"{MODE_NAMES[m]} {v:.1%}" for m, v in summary["share_of_reference"].items()),
            file=file,
        )
    print(NOTES, file=file)
    print(load_line(result.load_before, result.load_after, show_autogroup=True), file=file)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}", file=file)


# ------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--env",
        nargs="+",
        default=[CARTPOLE],
        help=f"{CARTPOLE} (default): gRPC against in-process; other ids (ALE/Pong-v5, "
        "MinAtar/Breakout-v1): the network the learner picks for each, fed by its sampler "
        "process against one batch reused",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="measured time per phase (default 10, 3 with --quick; with --env: 4, 1.5)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="unmeasured time per phase (default 2, 1 with --quick; with --env: 1, 0.5)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of (gRPC, in-process) phases (default 2; 1 with --quick)",
    )
    parser.add_argument(
        "--abba", action="store_true", help="reverse the order in odd rounds (A B B A) instead of A B A B"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        choices=MODES,
        help="modes to measure (default both; one mode is useful under a profiler)",
    )
    parser.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the reference phase (one batch reused, sampling free)",
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--pixel-batch-sizes",
        type=int,
        nargs="+",
        default=[256, 32],
        help="with --env: batch sizes measured for each environment (default 256 32)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows per shard (default 50,000, 20,000 with --quick; with --env: 1,024, 256 "
        "transitions played per shard)",
    )
    parser.add_argument(
        "--capacity", type=int, default=100_000, help="slots per shard/table (default 100,000)"
    )
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="short phases, one round (~20 s smoke run)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = parser.parse_args(argv)
    other_envs = args.env != [CARTPOLE]
    if other_envs and CARTPOLE in args.env:
        parser.error(f"--env: {CARTPOLE} is the default comparison; give the other environments without it")
    defaults = {
        "seconds": (10.0, 3.0, 4.0, 1.5),
        "warmup": (2.0, 1.0, 1.0, 0.5),
        "rounds": (2, 1, 1, 1),
        "rows": (50_000, 20_000, 1_024, 256),
    }
    for name, values in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, values[2 * other_envs + args.quick])
    if other_envs and args.rows < 64:
        parser.error("--rows must be at least 64 with --env")
    if not other_envs and not 1_000 <= args.rows <= args.capacity:
        parser.error(f"--rows must be in [1000, --capacity ({args.capacity})]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.env != [CARTPOLE]:
        return main_envs(args)
    import torch

    result = run(args)
    summary = summarize(result.phases)
    print_report(args, result, summary, torch.__version__)
    if args.json:
        write_json(
            args.json,
            {
                "meta": {
                    **metadata(args),
                    "torch": torch.__version__,
                    "autogroup": autogroup(),
                    "command": shlex.join([sys.executable, *sys.argv]),
                },
                "load_average_1min": [result.load_before, result.load_after],
                "fill_seconds": result.fill_seconds,
                "contents": result.contents,
                "phases": [asdict(p) for p in result.phases],
                "summary": summary,
            },
        )
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

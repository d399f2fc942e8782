"""Ape-X DPG's per-actor noise scales against one noise scale for every actor, on the same budget: the default
`apexrl launch --env ENV` (actor i of N explores with sigma_i = 0.5 * 0.1 ** (i / (N - 1)) half action ranges)
against the same launch with `--noise-scale` fixed for all actors (0.1: TD3's and the zoo's choice), several seeds,
alternating, each run stopped when solved or at --max-seconds.

    .venv/bin/python bench/noise_schedule.py --env Pendulum-v1 --seeds 3 --max-seconds 240 --json /tmp/noise.json
    .venv/bin/python bench/noise_schedule.py --env MountainCarContinuous-v0 --max-seconds 300 --noise-correlation 0.9
    python3 bench/noise_schedule.py --env MountainCarContinuous-v0 --seeds 4 --parallel-cores 2   # 16 cores: 8 at once

`--noise-correlation RHO` gives both variants' actors noise correlated over time (`apexrl actor
--noise-correlation`). `--parallel-cores K` runs as many launches at once as the machine has K cores for, each
pinned to its own K cores (taskset): a machine of 16 cores plays 8 copies of a 2-core one; without it the runs
go one after the other.

Printed per run: solved, wall seconds (the budget when not solved), env steps, and the last evaluation mean
return; then per variant the runs solved, the median wall time (unsolved runs count as the budget) and the median
of the final evaluation returns. The evaluator plays without noise in both variants.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.report import load_line, metadata, progress, render_table, write_json

VARIANTS = ("schedule", "single")


def run(
    env_id: str,
    seed: int,
    variant: str,
    args: argparse.Namespace,
    workdir: Path,
    cpus: list[int] | None = None,
) -> dict:
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    command = [
        *pin,
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--env",
        env_id,
        "--seed",
        str(seed),
        "--max-seconds",
        str(args.max_seconds),
        "--run-dir",
        str(workdir / f"{variant}-{seed}"),
        "--progress-seconds",
        "5",
    ]
    if variant == "single":  # every exploring actor the same scale; the evaluator (after it) none
        command += [f"--actor-arg=--noise-scale={args.single}", "--evaluator-arg=--noise-scale=0"]
    if args.noise_correlation:
        command += [f"--actor-arg=--noise-correlation={args.noise_correlation}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.max_seconds + 180)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{variant} seed {seed} printed nothing:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    return {
        "variant": variant,
        "seed": seed,
        "solved": result["solved"],
        "seconds": result["wall_seconds"] if result["solved"] else args.max_seconds,
        "env_steps": result["env_steps"],
        "final_return": result["mean_return_100"],
    }


def core_slots(cores_per_run: int) -> list[list[int]]:
    """This process's cores cut into disjoint groups of `cores_per_run` (a remainder is left idle)."""
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= cores_per_run <= len(cores):
        raise SystemExit(f"--parallel-cores {cores_per_run}: this machine has {len(cores)} cores")
    return [cores[i : i + cores_per_run] for i in range(0, len(cores) - cores_per_run + 1, cores_per_run)]


def run_all(jobs: list[tuple[int, str]], args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Every (seed, variant) launch, in order, or side by side on disjoint cores with --parallel-cores."""
    slots: queue.Queue[list[int] | None] = queue.Queue()
    for slot in core_slots(args.parallel_cores) if args.parallel_cores else [None]:
        slots.put(slot)
    counter = itertools.count(1)

    def one(job: tuple[int, str]) -> dict:
        seed, variant = job
        cpus = slots.get()
        try:
            started = time.perf_counter()
            where = f" on cores {cpus}" if cpus else ""
            progress(f"{variant} seed {seed}{where} ...")
            r = run(args.env, seed, variant, args, workdir, cpus)
            progress(
                f"[{next(counter)}/{len(jobs)}] {variant} seed {seed}: solved={r['solved']} "
                f"{r['seconds']:.1f} s, final return {r['final_return']}, {r['env_steps']:,} env steps "
                f"({time.perf_counter() - started:.0f} s)"
            )
            return r
        finally:
            slots.put(cpus)

    with ThreadPoolExecutor(max_workers=slots.qsize()) as pool:
        return list(pool.map(one, jobs))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (then +1, +2, ...)")
    parser.add_argument("--max-seconds", type=float, default=240.0, help="budget of every run")
    parser.add_argument(
        "--single", type=float, default=0.1, help="the one noise scale of the 'single' variant"
    )
    parser.add_argument(
        "--noise-correlation",
        type=float,
        default=0.0,
        help="correlation of every exploring actor's noise from one step to the next, both variants (0)",
    )
    parser.add_argument(
        "--parallel-cores",
        type=int,
        default=0,
        metavar="K",
        help="run launches side by side, each pinned to its own K cores (0: one after the other)",
    )
    parser.add_argument("--json", help="write every run and the summary here")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    jobs = [
        (seed, variant)
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for variant in VARIANTS
    ]
    with tempfile.TemporaryDirectory(prefix="noise-schedule-") as tmp:
        runs = run_all(jobs, args, Path(tmp))
    load_after = os.getloadavg()[0]
    summary = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        finals = [r["final_return"] for r in mine if r["final_return"] is not None]
        summary[variant] = {
            "runs": len(mine),
            "solved": sum(r["solved"] for r in mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "median_final_return": statistics.median(finals) if finals else None,
        }
    rows = [
        [
            r["variant"],
            str(r["seed"]),
            "yes" if r["solved"] else "NO",
            f"{r['seconds']:.1f}",
            f"{r['env_steps']:,}",
            "-" if r["final_return"] is None else f"{r['final_return']:.1f}",
        ]
        for r in runs
    ]
    rows += [
        [
            f"{v} median",
            "",
            f"{s['solved']}/{s['runs']}",
            f"{s['median_seconds']:.1f}",
            "",
            "-" if s["median_final_return"] is None else f"{s['median_final_return']:.1f}",
        ]
        for v, s in summary.items()
    ]
    print(
        f"{args.env}: per-actor noise scales (schedule) vs {args.single} for every actor (single), "
        f"budget {args.max_seconds:g} s, noise correlation {args.noise_correlation:g}"
        + (f", {args.parallel_cores} cores per run, side by side" if args.parallel_cores else "")
    )
    print(
        "\n".join(
            render_table(
                ["variant", "seed", "solved", "seconds", "env steps", "final eval return"], rows, left={0}
            )
        )
    )
    ratio = summary["schedule"]["median_seconds"] / summary["single"]["median_seconds"]
    print(f"schedule / single (median wall time, unsolved = budget): {ratio:.2f}x")
    print(load_line(load_before, load_after))
    if args.json:
        write_json(
            args.json,
            {
                "meta": metadata(args),
                "runs": runs,
                "summary": summary,
                "ratio": ratio,
                "load_average": [load_before, load_after],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

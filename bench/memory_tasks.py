"""Does the memory help? R2D2 against the feed-forward DQN on tasks where one observation does not tell the state,
each `apexrl launch` with its defaults and the same time budget, alternating by seed in one run.

    .venv/bin/python -m pip install popgym==1.0.7        # POPGym is a benchmark's dependency, not apexrl's
    .venv/bin/python bench/memory_tasks.py --seeds 0 1 2 --max-seconds 120 --json /tmp/memory_tasks.json
    .venv/bin/python bench/memory_tasks.py --tasks MinAtar/Breakout-v1 --max-seconds 600

Tasks (--tasks): POPGym's `popgym-RepeatPreviousEasy-v0` (say the card seen 4 steps ago: nothing but memory
solves it; an episode's return is in [-1, 1], chance about -0.5) and `popgym-PositionOnlyCartPoleEasy-v0`
(CartPole from its positions alone; return in [0, 1], 1 for a full episode), both through `--env-module popgym`;
CartPoleNoVel-v1 (apexrl's own); MinAtar/Breakout-v1 (single frames: MinAtar has no frame stacking, the DQN sees
the same observation, whose trail channel tells the ball's direction).

What is compared: the greedy mean return of the policy each run kept (100 evaluation episodes of the round the
evaluator kept: `kept_policy.mean_return` of the launcher's JSON line), and the mean of the last 100 evaluation
episodes, at the end of the same budget; env steps and updates beside them. The tasks have no solve bar here
(`--target-return` is set out of reach) so every run uses its whole budget.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.report import load_line, metadata, progress, render_table, write_json

POPGYM = ("popgym-RepeatPreviousEasy-v0", "popgym-PositionOnlyCartPoleEasy-v0")
ALGORITHMS = ("r2d2", "dqn")
OUT_OF_REACH = 1e9  # a target no task reaches: every run uses its budget


def launch_command(task: str, algorithm: str, seed: int, max_seconds: float, run_dir: Path) -> list[str]:
    modules = ["--env-module", "popgym"] if task.startswith("popgym-") else []
    return [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "launch",
        "--env",
        task,
        *modules,
        "--algorithm",
        algorithm,
        "--seed",
        str(seed),
        "--max-seconds",
        str(max_seconds),
        "--target-return",
        str(OUT_OF_REACH),
        "--run-dir",
        str(run_dir),
    ]


def run_one(task: str, algorithm: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict:
    run_dir = workdir / f"{task.replace('/', '_')}-{algorithm}-{seed}"
    done = subprocess.run(
        launch_command(task, algorithm, seed, args.max_seconds, run_dir),
        capture_output=True,
        text=True,
        timeout=args.max_seconds + 300,
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{task} {algorithm} seed {seed} printed nothing:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    kept = result.get("kept_policy") or {}
    return {
        "task": task,
        "algorithm": algorithm,
        "seed": seed,
        "reason": result["reason"],
        "kept_return": kept.get("mean_return"),
        "last_100": result["mean_return_100"],
        "env_steps": result["env_steps"],
        "updates": result["updates"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tasks", nargs="+", default=list(POPGYM), help="Gymnasium ids (popgym-*: --env-module popgym)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-seconds", type=float, default=120.0, help="every run's budget")
    parser.add_argument("--json", help="write every run and the medians here")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="memory-tasks-") as tmp:
        for task in args.tasks:
            for seed in args.seeds:
                for algorithm in ALGORITHMS:
                    progress(f"{task} {algorithm} seed {seed} ...")
                    run = run_one(task, algorithm, seed, args, Path(tmp))
                    runs.append(run)
                    progress(
                        f"{task} {algorithm} seed {seed}: kept {_value(run['kept_return'])}, last 100 "
                        f"{_value(run['last_100'])} ({run['reason']}, {run['env_steps']:,} env steps, "
                        f"{run['updates']} updates)"
                    )
    load_after = os.getloadavg()[0]
    medians = {
        f"{task} {algorithm}": statistics.median(
            r["kept_return"]
            for r in runs
            if (r["task"], r["algorithm"]) == (task, algorithm) and r["kept_return"] is not None
        )
        for task in args.tasks
        for algorithm in ALGORITHMS
        if any(r["kept_return"] is not None for r in runs if (r["task"], r["algorithm"]) == (task, algorithm))
    }
    rows = [
        [
            r["task"],
            r["algorithm"],
            str(r["seed"]),
            _value(r["kept_return"]),
            _value(r["last_100"]),
            f"{r['env_steps']:,}",
            str(r["updates"]),
        ]
        for r in runs
    ]
    rows += [
        [name.split(" ")[0], f"{name.split(' ')[1]} median", "", _value(value), "", "", ""]
        for name, value in medians.items()
    ]
    print(
        f"greedy mean returns after {args.max_seconds:g} s each (kept: the evaluator's kept round, 100 episodes)"
    )
    print(
        "\n".join(
            render_table(
                ["task", "algorithm", "seed", "kept", "last 100", "env steps", "updates"], rows, left={0, 1}
            )
        )
    )
    print(load_line(load_before, load_after))
    if args.json:
        write_json(
            args.json,
            {
                "meta": metadata(args),
                "runs": runs,
                "medians": medians,
                "load_average": [load_before, load_after],
            },
        )
    return 0


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())

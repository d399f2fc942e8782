"""Return against wall time under the same budget: the default `apexrl launch --env ENV` against Stable-Baselines3's
TD3 with rl-baselines3-zoo's hyperparameters, for tasks with no "solved" (HalfCheetah-v5), several seeds each.

    .venv/bin/python bench/budget_race.py --env HalfCheetah-v5 --budget-seconds 1800 --seeds 3 --json /tmp/hc.json
    .venv/bin/python bench/budget_race.py --env Pendulum-v1 --budget-seconds 60 --seeds 1     # a smoke run

Each side gets `--budget-seconds` and must not stop early:
- apexrl: `apexrl launch --max-seconds S --target-return inf` (an unreachable target: the launcher otherwise stops
  at the environment's reward_threshold, 4,800 for HalfCheetah-v5), every other setting its default; its clock is
  the launch's wall time, start-up and the evaluator's process included. Its curve is progress.csv's mean of the
  last 100 greedy evaluation episodes at each tick; its final return the launcher's `mean_return_100`.
- SB3: `bench/sb3_worker.py --max-train-seconds S` (one process, torch 1 thread); its clock is training time,
  its periodic 100-episode evaluations (every `--sb3-eval-every` env steps) left out; its final return is one
  more evaluation of the policy at the end of the budget.
Runs never overlap (SB3 seed 0, apexrl seed 0, SB3 seed 1, ...), so a slow spell of a shared machine hits both.

Printed: per run and as medians over seeds, the return at 25/50/75 % of the budget (the last evaluation finished by
then) and the final return (100 %); then apexrl / SB3 of the median final returns (meaningful for positive returns,
as HalfCheetah's; the difference is printed beside it). The solve-time race is bench/solve_race.py.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness.report import load_line, metadata, progress, render_table, write_json
from solve_race import HERE, ensure_sb3_venv, last_json_line, launch_command, sb3_command

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
SYSTEMS = ("sb3", "apexrl")
# A point of a learning curve: (seconds on the system's own clock, env steps, mean greedy return).
Point = tuple[float, int, float]


def return_at(curve: Sequence[Point], seconds: float) -> float | None:
    """The return of the last evaluation finished by `seconds` (None before the first)."""
    done = [point for point in curve if point[0] <= seconds]
    return max(done, key=lambda point: point[0])[2] if done else None


def fraction_returns(
    curve: Sequence[Point], budget: float, final: float | None, fractions: Sequence[float] = FRACTIONS
) -> dict[str, float | None]:
    """Return at each fraction of the budget, keyed "25%" ...; the whole budget's is the final return (both
    systems overrun the budget by their last step or tick, so a lookup at exactly 100 % would miss it)."""
    return {
        f"{fraction:.0%}": final if fraction >= 1.0 else return_at(curve, fraction * budget)
        for fraction in fractions
    }


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median of the values present (a run may have no evaluation yet at 25 % of a short budget)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def final_ratio(apexrl: float | None, sb3: float | None) -> float | None:
    """apexrl / SB3 of final returns; None when either is missing or SB3's is 0."""
    return None if apexrl is None or not sb3 else apexrl / sb3


def read_progress_curve(path: Path) -> list[Point]:
    """(wall_seconds, env_steps, mean_return_100) of every progress.csv tick that has an evaluation mean."""
    from apexrl.launcher.progress import ProgressRow  # the file's owner reads its rows

    curve = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                tick = ProgressRow.from_csv(row)
            except ValueError:
                continue  # a line cut short by a stopped launcher
            if tick.mean_return_100 is not None:
                curve.append((tick.wall_seconds, tick.env_steps, tick.mean_return_100))
    return curve


def check_sb3_env(python: Path, env: str) -> None:
    """Refuse in one line, before any run, when the SB3 venv cannot make `env` (MuJoCo and Box2D are not in it
    unless installed: a missing engine would otherwise surface after the first apexrl run)."""
    probe = f"import gymnasium as gym; gym.make({env!r}).close()"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(
            f"{python} cannot make {env} ({reason}); install its engine there, e.g. "
            f"`{python.parent / 'pip'} install mujoco` (MuJoCo) or `... install box2d pygame-ce` (Box2D)"
        )


def run_sb3(python: Path, seed: int, args: argparse.Namespace) -> dict:
    command = sb3_command(
        python,
        args.env,
        seed,
        "--max-train-seconds",
        str(args.budget_seconds),
        "--max-steps",
        str(args.sb3_max_steps),
        "--eval-every",
        str(args.sb3_eval_every),
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.budget_seconds * 3 + 600)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 seed {seed} failed:\n{done.stderr[-3000:]}")
    result = last_json_line(done, f"SB3 seed {seed}")
    curve = [(seconds, steps, mean) for steps, seconds, mean in result["evaluations"]]
    return {
        "system": "sb3",
        "seed": seed,
        "seconds": result["train_seconds"],
        "env_steps": result["env_steps"],
        "final_return": result["final_return"],
        "at": fraction_returns(curve, args.budget_seconds, result["final_return"]),
        "curve": curve,
        "wall_with_evaluation": result["wall_seconds"],
    }


def run_apexrl(seed: int, args: argparse.Namespace, workdir: Path) -> dict:
    run_dir = workdir / f"apexrl-{seed}"
    command = launch_command(
        sys.executable, args.env, seed, args.budget_seconds, run_dir, float("inf"), args.apexrl_arg
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.budget_seconds + 180)
    result = last_json_line(done, f"apexrl seed {seed}")
    if result["reason"] != "max_seconds":  # stopped early: its final return is not the budget's
        raise RuntimeError(f"apexrl seed {seed} stopped early ({result['reason']}):\n{done.stderr[-3000:]}")
    curve = read_progress_curve(run_dir / "progress.csv")
    return {
        "system": "apexrl",
        "seed": seed,
        "seconds": result["wall_seconds"],
        "env_steps": result["env_steps"],
        "updates": result["updates"],
        "final_return": result["mean_return_100"],
        "at": fraction_returns(curve, args.budget_seconds, result["mean_return_100"]),
        "curve": curve,
    }


def summary(runs: list[dict], system: str) -> dict:
    mine = [r for r in runs if r["system"] == system]
    return {
        "runs": len(mine),
        "median_final_return": median_or_none([r["final_return"] for r in mine]),
        "median_at": {key: median_or_none([r["at"][key] for r in mine]) for key in mine[0]["at"]},
        "median_env_steps": statistics.median(r["env_steps"] for r in mine),
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="HalfCheetah-v5", help="Gymnasium id with a Box action space")
    parser.add_argument("--budget-seconds", type=float, default=1800.0, help="each run's budget")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per system (0, 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument(
        "--sb3-eval-every",
        type=int,
        default=10_000,
        help="SB3's env steps between 100-episode evaluations (each ~20 s of HalfCheetah here)",
    )
    parser.add_argument(
        "--sb3-max-steps",
        type=int,
        default=100_000_000,
        help="SB3's env-step cap (far beyond the budget: time stops it)",
    )
    parser.add_argument(
        "--apexrl-arg",
        action="append",
        default=[],
        help="extra flags for `apexrl launch` (none: the defaults, as the issue asks)",
    )
    parser.add_argument(
        "--sb3-venv", default=str(HERE / "results" / "sb3-venv"), help="SB3's virtual environment"
    )
    parser.add_argument("--json", help="write every run (with its curve) and the summary here")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    python = ensure_sb3_venv(Path(args.sb3_venv)) if "sb3" in args.systems else None
    if python is not None:
        check_sb3_env(python, args.env)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="budget-race-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for system in args.systems:
                started = time.perf_counter()
                progress(f"{system} seed {seed} ({args.budget_seconds:g} s budget) ...")
                run = run_sb3(python, seed, args) if system == "sb3" else run_apexrl(seed, args, Path(tmp))
                runs.append(run)
                progress(
                    f"{system} seed {seed}: final return {_cell(run['final_return'])} after "
                    f"{run['seconds']:.1f} s, {run['env_steps']:,} env steps "
                    f"({time.perf_counter() - started:.0f} s with set-up and evaluation)"
                )
    load_after = os.getloadavg()[0]

    summaries = {system: summary(runs, system) for system in args.systems}
    keys = list(runs[0]["at"])
    rows = [
        [r["system"], str(r["seed"]), f"{r['env_steps']:,}", *(_cell(r["at"][k]) for k in keys)] for r in runs
    ]
    rows += [
        [f"{system} median", "", f"{s['median_env_steps']:,.0f}", *(_cell(s["median_at"][k]) for k in keys)]
        for system, s in summaries.items()
    ]
    print(
        f"{args.env}, budget {args.budget_seconds:g} s (apexrl: wall time; SB3: training time); "
        "greedy mean return at each fraction of the budget (100% = final)"
    )
    print("\n".join(render_table(["system", "seed", "env steps", *keys], rows, left={0})))
    ratio = None
    if len(summaries) == 2:
        apexrl, sb3 = summaries["apexrl"]["median_final_return"], summaries["sb3"]["median_final_return"]
        ratio = final_ratio(apexrl, sb3)
        difference = None if apexrl is None or sb3 is None else apexrl - sb3
        print(
            f"apexrl / sb3 (median final returns): {'-' if ratio is None else f'{ratio:.2f}x'}, "
            f"difference {'-' if difference is None else f'{difference:+.1f}'}"
        )
    print(load_line(load_before, load_after))
    if args.json:
        write_json(
            args.json,
            {
                "meta": metadata(args),
                "runs": runs,
                "summary": summaries,
                "final_return_ratio": ratio,
                "load_average": [load_before, load_after],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

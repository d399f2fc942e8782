"""Wall time and env steps to solve CartPole-v1: the default `apexrl launch` against Stable-Baselines3's DQN with
rl-baselines3-zoo's tuned hyperparameters, in the same run, several seeds each.

    .venv/bin/python bench/solve_race.py --json /tmp/solve_race.json      # 3 seeds each, ~10-15 minutes
    .venv/bin/python bench/solve_race.py --quick                          # 1 seed each, target 100, ~2 minutes

SB3 runs in its own virtual environment (`--sb3-venv`, default bench/results/sb3-venv), created on first use
with `stable-baselines3` and this venv's torch, numpy and Gymnasium versions (so both sides run the same
libraries); it is not an apexrl dependency. Runs alternate (SB3 seed 0, apexrl seed 0, SB3 seed 1, ...) so that
a slow spell of a shared machine hits both sides alike.

What is compared ("solved" = mean return of 100 greedy episodes >= --target):
- apexrl: `apexrl launch --seed S` with every default; wall time from the launcher's start to its stop
  (`wall_seconds` of its final JSON line: start-up of every role, and the evaluator's greedy episodes, which run
  in their own process, included); env steps summed over actors.
- SB3: `bench/sb3_worker.py` (one process, torch 1 thread as the zoo runs it); training time with its periodic
  100-episode evaluations left out (`train_seconds`), env steps at the first solving evaluation.
Printed: each run, the median of each side, and the ratios apexrl / SB3 of the medians (the issue's target is a
wall-time ratio <= 0.5). Run it on an idle machine: the footer shows the load average.
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

from harness.report import load_line, metadata, progress, render_table, write_json

HERE = Path(__file__).resolve().parent
SB3_VERSION = "2.9.2"


def ensure_sb3_venv(venv: Path) -> Path:
    """The SB3 venv's interpreter, creating the venv first if it has no stable_baselines3."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import stable_baselines3"], capture_output=True).returncode == 0:
        return python
    import gymnasium
    import numpy
    import torch

    torch_version = torch.__version__.split("+")[0]
    progress(f"creating {venv} (stable-baselines3 {SB3_VERSION}, torch {torch_version}, numpy {numpy.__version__}, "
             f"gymnasium {gymnasium.__version__})")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", f"stable-baselines3=={SB3_VERSION}",
                    f"torch=={torch_version}", f"numpy=={numpy.__version__}",
                    f"gymnasium=={gymnasium.__version__}"], check=True)
    return python


def run_sb3(python: Path, seed: int, args: argparse.Namespace) -> dict:
    command = [str(python), str(HERE / "sb3_worker.py"), "--seed", str(seed), "--target", str(args.target),
               "--max-steps", str(args.sb3_max_steps)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.max_seconds * 3)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 seed {seed} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"system": "sb3", "seed": seed, "solved": result["solved"], "seconds": result["train_seconds"],
            "env_steps": result["env_steps"], "wall_with_evaluation": result["wall_seconds"]}


def run_apexrl(seed: int, args: argparse.Namespace, workdir: Path) -> dict:
    command = [sys.executable, "-m", "apexrl.launcher", "launch", "--seed", str(seed), "--target-return",
               str(args.target), "--max-seconds", str(args.max_seconds), "--run-dir", str(workdir / f"apexrl-{seed}"),
               "--progress-seconds", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.max_seconds + 120)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"apexrl seed {seed} printed nothing:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    return {"system": "apexrl", "seed": seed, "solved": result["solved"], "seconds": result["wall_seconds"],
            "env_steps": result["env_steps"], "updates": result["updates"]}


def summary(runs: list[dict], system: str) -> dict:
    mine = [r for r in runs if r["system"] == system]
    return {"runs": len(mine), "solved": sum(r["solved"] for r in mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "median_env_steps": statistics.median(r["env_steps"] for r in mine)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per system (0, 1, ...)")
    parser.add_argument("--target", type=float, default=475.0, help="greedy mean return over 100 episodes")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="apexrl's budget per run")
    parser.add_argument("--sb3-max-steps", type=int, default=200_000, help="SB3's env-step budget per run")
    parser.add_argument("--systems", nargs="+", choices=("sb3", "apexrl"), default=["sb3", "apexrl"])
    parser.add_argument("--sb3-venv", default=str(HERE / "results" / "sb3-venv"), help="SB3's virtual environment")
    parser.add_argument("--quick", action="store_true", help="1 seed, target 100, 150 s budget (a smoke run)")
    parser.add_argument("--json", help="write every run and the summary here")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.target, args.max_seconds = 1, 100.0, 150.0

    load_before = os.getloadavg()[0]
    python = ensure_sb3_venv(Path(args.sb3_venv)) if "sb3" in args.systems else None
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="solve-race-") as tmp:
        for seed in range(args.seeds):
            for system in args.systems:
                started = time.perf_counter()
                progress(f"{system} seed {seed} ...")
                run = run_sb3(python, seed, args) if system == "sb3" else run_apexrl(seed, args, Path(tmp))
                runs.append(run)
                progress(f"{system} seed {seed}: solved={run['solved']} in {run['seconds']:.1f} s, "
                         f"{run['env_steps']:,} env steps ({time.perf_counter() - started:.0f} s with set-up)")
    load_after = os.getloadavg()[0]

    summaries = {system: summary(runs, system) for system in args.systems}
    lines = [[r["system"], str(r["seed"]), "yes" if r["solved"] else "NO", f"{r['seconds']:.1f}",
              f"{r['env_steps']:,}"] for r in runs]
    lines += [[f"{system} median", "", f"{s['solved']}/{s['runs']}", f"{s['median_seconds']:.1f}",
               f"{s['median_env_steps']:,.0f}"] for system, s in summaries.items()]
    print(f"CartPole-v1, solved = greedy mean return over 100 episodes >= {args.target:g}")
    print("\n".join(render_table(["system", "seed", "solved", "seconds", "env steps"], lines, left={0})))
    ratios = {}
    if set(summaries) == {"sb3", "apexrl"}:
        sb3, apexrl = summaries["sb3"], summaries["apexrl"]
        ratios = {"wall_time": apexrl["median_seconds"] / sb3["median_seconds"],
                  "env_steps": apexrl["median_env_steps"] / sb3["median_env_steps"]}
        print(f"apexrl / SB3 (medians): wall time {ratios['wall_time']:.2f}x (target <= 0.5), "
              f"env steps {ratios['env_steps']:.2f}x")
    print(load_line(load_before, load_after))
    if args.json:
        write_json(args.json, {"meta": metadata(args), "runs": runs, "summary": summaries, "ratios": ratios,
                               "load_average": [load_before, load_after]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""R2D2 on CartPoleNoVel-v1 (CartPole without its velocities: only memory tells the state), the default `apexrl
launch --algorithm r2d2` with the burn-in's gradient stopped (the paper's choice, the default) and not, alternating
by seed: wall time to the solve bar (475 over 100 greedy episodes, confirmed by the evaluator), or the time limit.

    .venv/bin/python bench/r2d2_burn_in.py --seeds 0 1 --max-seconds 180
    .venv/bin/python bench/r2d2_burn_in.py --quick     # one seed, 15 s each: a smoke test

Prints one line per run and the medians; `--json PATH` writes every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = {"stop": "--stop-burn-in-gradient", "no-stop": "--no-stop-burn-in-gradient"}


def launch(seed: int, variant: str, max_seconds: float, work: Path) -> dict:
    run_dir = work / f"{variant}-{seed}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "launch",
            "--algorithm",
            "r2d2",
            "--env",
            "CartPoleNoVel-v1",
        ]
        + ["--seed", str(seed), "--max-seconds", str(max_seconds), "--run-dir", str(run_dir)]
        + [f"--learner-arg={VARIANTS[variant]}"],
        capture_output=True,
        text=True,
        timeout=max_seconds + 120,
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"launch printed nothing:\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    kept = result.get("kept_policy") or {}
    return {
        "variant": variant,
        "seed": seed,
        "solved": result["solved"],
        "wall_seconds": result["wall_seconds"],
        "env_steps": result["env_steps"],
        "updates": result["updates"],
        "kept_mean_return": kept.get("mean_return"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--max-seconds", type=float, default=180.0)
    parser.add_argument("--quick", action="store_true", help="one seed, 15 s each (a smoke test)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    seeds, limit = ([0], 15.0) if args.quick else (args.seeds, args.max_seconds)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for seed in seeds:
            for variant in VARIANTS:  # alternating: both see the same machine state
                run = launch(seed, variant, limit, Path(work))
                runs.append(run)
                print(json.dumps(run), flush=True)
    for variant in VARIANTS:
        times = [r["wall_seconds"] for r in runs if r["variant"] == variant]
        solved = sum(r["solved"] for r in runs if r["variant"] == variant)
        print(f"{variant}: solved {solved}/{len(times)}, median wall {statistics.median(times):.1f} s")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()

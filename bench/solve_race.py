"""Wall time and env steps to solve a task: the default `apexrl launch --env ENV` against Stable-Baselines3 with
rl-baselines3-zoo's tuned hyperparameters (DQN for CartPole-v1, TD3 for the continuous-control tasks), in the same
run, several seeds each.

    .venv/bin/python bench/solve_race.py --json /tmp/solve_race.json      # CartPole-v1, 3 seeds each, ~10-15 min
    .venv/bin/python bench/solve_race.py --env Pendulum-v1                # Ape-X DPG against TD3, ~10 minutes
    .venv/bin/python bench/solve_race.py --quick                          # 1 seed each, target 100, ~2 minutes
    .venv/bin/python bench/solve_race.py --env CartPoleNoVel-v1 --systems sb3 apexrl feedforward
                                       # R2D2 against RecurrentPPO, and the feed-forward DQN in the same budget
    .venv/bin/python bench/solve_race.py --systems apexrl base --base-python /tmp/base/.venv/bin/python
                                       # this checkout against another one's apexrl (before/after a change)

SB3 runs in its own virtual environment (`--sb3-venv`, default bench/results/sb3-venv), created on first use
with `stable-baselines3` and this venv's torch, numpy and Gymnasium versions (so both sides run the same
libraries); it is not an apexrl dependency. Runs alternate (SB3 seed 0, apexrl seed 0, SB3 seed 1, ...) so that
a slow spell of a shared machine hits both sides alike.

On CartPoleNoVel-v1 (CartPole without its velocities: a task that needs memory) apexrl runs `--algorithm r2d2`
and SB3's side is sb3-contrib's RecurrentPPO with the zoo's `ppo_lstm` settings (installed into the SB3 venv with
it); the `feedforward` system is `apexrl launch --algorithm dqn` on the same task and budget, to show that the memory
is what solves it.

What is compared ("solved" = mean return of 100 greedy episodes >= --target):
- apexrl: `apexrl launch --seed S` with every default; wall time from the launcher's start to its stop
  (`wall_seconds` of its final JSON line: start-up of every role, and the evaluator's greedy episodes, which run
  in their own process, included); env steps summed over actors. A run that ends for another reason than its
  target or budget (start-up failed, a role kept crashing) is shown FAILED and left out of the medians.
- SB3: `bench/sb3_worker.py` (one process, torch 1 thread as the zoo runs it); training time with its periodic
  100-episode evaluations left out (`train_seconds`), env steps at the first solving evaluation; unsolved at
  `--sb3-max-steps` env steps or `--sb3-max-seconds` of training, whichever comes first.
Printed: each run, the median of each side, and the ratios apexrl / SB3 of the medians (the issue's target is a
wall-time ratio <= 0.5). Run it on an idle machine: the footer shows the load average.

Tasks with no "solved" (HalfCheetah-v5) are raced on a time budget instead: bench/budget_race.py, which reuses the
command builders here.
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
SB3_VERSION = "2.9.2"  # stable-baselines3 and sb3-contrib (RecurrentPPO) are released together
# apexrl's algorithm where the default (auto: DQN or DPG by the action space) is not the one raced.
ALGORITHMS = {"CartPoleNoVel-v1": "r2d2"}
# The solve bar of each task (greedy mean return over 100 episodes): Gymnasium's reward_threshold, or the usual bar.
TARGETS = {
    "CartPole-v1": 475.0,
    "CartPoleNoVel-v1": 475.0,
    "Acrobot-v1": -100.0,
    "Pendulum-v1": -150.0,
    "LunarLanderContinuous-v3": 200.0,
    "InvertedPendulum-v5": 950.0,
    "HalfCheetah-v5": 4800.0,
}


def ensure_sb3_venv(venv: Path) -> Path:
    """The SB3 venv's interpreter, creating the venv first if it has no stable_baselines3."""
    python = venv / "bin" / "python"
    if (
        python.exists()
        and subprocess.run(
            [python, "-c", "import stable_baselines3, sb3_contrib"], capture_output=True
        ).returncode
        == 0
    ):
        return python
    import gymnasium
    import numpy
    import torch

    torch_version = torch.__version__.split("+")[0]
    progress(
        f"creating {venv} (stable-baselines3 {SB3_VERSION}, torch {torch_version}, numpy {numpy.__version__}, "
        f"gymnasium {gymnasium.__version__})"
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            f"stable-baselines3=={SB3_VERSION}",
            f"sb3-contrib=={SB3_VERSION}",
            f"torch=={torch_version}",
            f"numpy=={numpy.__version__}",
            f"gymnasium=={gymnasium.__version__}",
        ],
        check=True,
    )
    return python


def sb3_command(python: Path, env: str, seed: int, *flags: str) -> list[str]:
    """bench/sb3_worker.py's command line in the SB3 venv (the race modes add their own flags)."""
    return [str(python), str(HERE / "sb3_worker.py"), "--env", env, "--seed", str(seed), *flags]


def launch_command(
    python: str, env: str, seed: int, max_seconds: float, run_dir: Path, target: float, extra: list[str]
) -> list[str]:
    """`apexrl launch` with its defaults, `extra` flags (each text split on spaces) appended."""
    return [
        python,
        "-m",
        "apexrl.launcher",
        "launch",
        "--env",
        env,
        "--seed",
        str(seed),
        "--target-return",
        str(target),
        "--max-seconds",
        str(max_seconds),
        "--run-dir",
        str(run_dir),
        "--progress-seconds",
        "5",
        *(a for text in extra for a in text.split()),
    ]


def last_json_line(done: subprocess.CompletedProcess, what: str) -> dict:
    """The JSON object a run printed last (the launcher's and the worker's result line)."""
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{what} printed nothing:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def run_sb3(python: Path, seed: int, args: argparse.Namespace) -> dict:
    budget = sb3_train_seconds(args)
    command = sb3_command(
        python,
        args.env,
        seed,
        "--target",
        str(args.target),
        "--max-steps",
        str(args.sb3_max_steps),
        "--max-train-seconds",
        str(budget),
    )
    # SB3 stops itself at its budget (an unsolved run); the timeout only catches a hung worker. Its evaluations
    # are outside the budget: 100 episodes every 2,000 steps took 0.2x its training time on LunarLander.
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget * 3 + 600)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 seed {seed} failed:\n{done.stderr[-3000:]}")
    result = last_json_line(done, f"SB3 seed {seed}")
    return {
        "system": "sb3",
        "seed": seed,
        "solved": result["solved"],
        "seconds": result["train_seconds"],
        "env_steps": result["env_steps"],
        "wall_with_evaluation": result["wall_seconds"],
    }


# Launcher end reasons that make a run a result; any other (a role that kept crashing, a start-up that failed)
# is a failed run, reported apart and left out of the medians.
FINISHED = ("target", "max_seconds")


def sb3_train_seconds(args: argparse.Namespace) -> float:
    """SB3's training-time budget per run: `--sb3-max-seconds`, or 5x apexrl's (SB3 runs one process; its step
    budget usually ends it first)."""
    return args.sb3_max_seconds if args.sb3_max_seconds is not None else args.max_seconds * 5


def run_apexrl(seed: int, args: argparse.Namespace, workdir: Path, system: str = "apexrl") -> dict:
    python = args.base_python if system == "base" else sys.executable
    algorithm = "dqn" if system == "feedforward" else ALGORITHMS.get(args.env)
    extra = [
        *([f"--algorithm {algorithm}"] if algorithm else []),
        *args.apexrl_arg,
        *(args.base_arg if system == "base" else []),
    ]
    command = launch_command(
        python, args.env, seed, args.max_seconds, workdir / f"{system}-{seed}", args.target, extra
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.max_seconds + 120)
    result = last_json_line(done, f"apexrl seed {seed}")
    failed = result["reason"] not in FINISHED
    if failed:
        progress(f"{system} seed {seed} did not run to an end ({result['reason']}):\n{done.stderr[-2000:]}")
    return {
        "system": system,
        "seed": seed,
        "failed": result["reason"] if failed else None,
        "solved": result["solved"],
        "seconds": result["wall_seconds"],
        "env_steps": result["env_steps"],
        "updates": result["updates"],
        "final_return": result["mean_return_100"],
    }


def summary(runs: list[dict], system: str) -> dict:
    """Medians over the runs that ran to an end (solved, or out of budget); runs that failed are counted apart."""
    mine = [r for r in runs if r["system"] == system and not r.get("failed")]
    return {
        "runs": len(mine),
        "failed": sum(1 for r in runs if r["system"] == system and r.get("failed")),
        "solved": sum(r["solved"] for r in mine),
        "median_seconds": statistics.median(r["seconds"] for r in mine) if mine else None,
        "median_env_steps": statistics.median(r["env_steps"] for r in mine) if mine else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--env", default="CartPole-v1", help="Gymnasium id raced (SB3: DQN on Discrete, TD3 on Box)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per system (0, 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="greedy mean return over 100 episodes (default: the task's bar, see TARGETS)",
    )
    parser.add_argument("--max-seconds", type=float, default=600.0, help="apexrl's budget per run")
    parser.add_argument("--sb3-max-steps", type=int, default=200_000, help="SB3's env-step budget per run")
    parser.add_argument(
        "--sb3-max-seconds",
        type=float,
        default=None,
        help="SB3's training-time budget per run, evaluations excluded (default: 5x --max-seconds)",
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=("sb3", "apexrl", "base", "feedforward"),
        default=["sb3", "apexrl"],
        help="base: apexrl from --base-python's environment (another checkout, before a change); feedforward: "
        "apexrl's DQN where apexrl races another algorithm (CartPoleNoVel-v1: r2d2), same budget",
    )
    parser.add_argument(
        "--base-python",
        default=sys.executable,
        help="interpreter whose apexrl is the 'base' system (default: this one, with --base-arg)",
    )
    parser.add_argument(
        "--base-arg",
        action="append",
        default=[],
        help="extra flags for the base system only, e.g. --base-arg='--learner-arg=--policy-delay=1'",
    )
    parser.add_argument(
        "--apexrl-arg",
        action="append",
        default=[],
        help="extra flags for both apexrl systems' `apexrl launch`, e.g. --apexrl-arg='--num-actors 2'",
    )
    parser.add_argument(
        "--sb3-venv", default=str(HERE / "results" / "sb3-venv"), help="SB3's virtual environment"
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, target 100, 150 s budget (a smoke run)")
    parser.add_argument("--json", help="write every run and the summary here")
    args = parser.parse_args()
    if args.target is None:
        args.target = TARGETS[args.env]
    if args.quick:
        args.seeds, args.target, args.max_seconds = 1, 100.0, 150.0

    load_before = os.getloadavg()[0]
    python = ensure_sb3_venv(Path(args.sb3_venv)) if "sb3" in args.systems else None
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="solve-race-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for system in args.systems:
                started = time.perf_counter()
                progress(f"{system} seed {seed} ...")
                run = (
                    run_sb3(python, seed, args)
                    if system == "sb3"
                    else run_apexrl(seed, args, Path(tmp), system)
                )
                runs.append(run)
                progress(
                    f"{system} seed {seed}: solved={run['solved']} in {run['seconds']:.1f} s, "
                    f"{run['env_steps']:,} env steps ({time.perf_counter() - started:.0f} s with set-up)"
                )
    load_after = os.getloadavg()[0]

    summaries = {system: summary(runs, system) for system in args.systems}
    lines = [
        [
            r["system"],
            str(r["seed"]),
            f"FAILED ({r['failed']})" if r.get("failed") else "yes" if r["solved"] else "NO",
            f"{r['seconds']:.1f}",
            f"{r['env_steps']:,}",
            _final(r.get("final_return")),
        ]
        for r in runs
    ]
    lines += [
        [
            f"{system} median",
            "",
            f"{s['solved']}/{s['runs']}" + (f" ({s['failed']} failed)" if s["failed"] else ""),
            "-" if s["median_seconds"] is None else f"{s['median_seconds']:.1f}",
            "-" if s["median_env_steps"] is None else f"{s['median_env_steps']:,.0f}",
            "",
        ]
        for system, s in summaries.items()
    ]
    print(f"{args.env}, solved = greedy mean return over 100 episodes >= {args.target:g}")
    print(
        "\n".join(
            render_table(
                ["system", "seed", "solved", "seconds", "env steps", "last eval return"], lines, left={0}
            )
        )
    )
    ratios = {}
    if "apexrl" in summaries:
        apexrl = summaries["apexrl"]
        for other in ("sb3", "base"):  # feedforward is shown by its solved count and last return
            if other in summaries and None not in (
                apexrl["median_seconds"],
                summaries[other]["median_seconds"],
            ):
                ratios[other] = {
                    "wall_time": apexrl["median_seconds"] / summaries[other]["median_seconds"],
                    "env_steps": apexrl["median_env_steps"] / summaries[other]["median_env_steps"],
                }
                print(
                    f"apexrl / {other} (medians): wall time {ratios[other]['wall_time']:.2f}x, "
                    f"env steps {ratios[other]['env_steps']:.2f}x"
                )
    print(load_line(load_before, load_after))
    if args.json:
        write_json(
            args.json,
            {
                "meta": metadata(args),
                "runs": runs,
                "summary": summaries,
                "ratios": ratios,
                "load_average": [load_before, load_after],
            },
        )
    return 0


def _final(value: float | None) -> str:
    """apexrl's last evaluation mean return (SB3 reports none)."""
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())

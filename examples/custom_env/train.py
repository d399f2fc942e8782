"""Train your own environment from Python: the corridor of corridor.py, with its constructor's arguments as a dict.

    python examples/custom_env/train.py                          # length 8, until solved (return 1.0) or 300 s
    python examples/custom_env/train.py --length 6 --max-seconds 60 --run-dir runs/corridor

The same run as the README's `apexrl launch --env-module corridor --env Corridor-v0 --env-kwargs '{"length": 8}'`.
`apexrl.local_fleet` takes every setting as a plain Python value, spelled as on the command line or in a fleet file:
`env_module` a module name (or a list of them), `env_kwargs` a dict; a value of the wrong type raises
apexrl.ConfigError naming the setting, before any process starts. Prints a progress line every 2 s, then the run's
result as JSON (the line `apexrl launch` ends with); `python play.py RUN_DIR` plays the policy it kept.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import apexrl

HERE = Path(__file__).resolve().parent


def show(row: apexrl.ProgressRow) -> None:
    mean = "-" if row.mean_return_100 is None else f"{row.mean_return_100:.2f}"
    print(f"{row.wall_seconds:5.0f}s  env steps {row.env_steps:>7,}  eval return {mean}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8, help="cells of the corridor (its argument)")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time budget of the run")
    parser.add_argument("--run-dir", default=None, help="run directory (default: runs/Corridor-v0-TIMESTAMP)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Every role imports `corridor`: they are child processes, and find it on PYTHONPATH wherever this is started.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH"))))

    fleet = apexrl.local_fleet(
        num_shards=1,
        num_actors=2,
        env_module="corridor",  # --env-module corridor
        env="Corridor-v0",
        env_kwargs={"length": args.length},  # --env-kwargs '{"length": 8}'
        max_seconds=args.max_seconds,
        run_dir=args.run_dir,
        seed=0,
        progress_seconds=2.0,
    )
    with apexrl.launch(fleet, on_progress=show) as run:
        print(f"training {fleet.env} {fleet.env_kwargs} in {run.run_dir}", flush=True)
        try:
            result = run.wait()  # until solved or max_seconds
        except KeyboardInterrupt:  # Ctrl-C: stop the fleet and report what it did
            print("stopping the fleet (Ctrl-C)", file=sys.stderr, flush=True)
            result = run.stop()
    print(result.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # a second Ctrl-C while the fleet stops: leaving the `with` block stopped it
        sys.exit(130)

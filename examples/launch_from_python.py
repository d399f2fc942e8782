"""Train CartPole-v1 with a local Ape-X fleet started from Python, print its progress, and play the result.

    .venv/bin/python examples/launch_from_python.py                      # until solved (475) or 300 s
    .venv/bin/python examples/launch_from_python.py --max-seconds 60 --run-dir runs/from-python

`apexrl.launch` starts the roles (replay shards, the learner, actors, the evaluator) as child processes and returns
at once; the fleet runs in a background thread of this process. Leaving the `with` block stops it; Ctrl-C stops it
and still reports the result. The policy played at the end is the one the evaluator kept (the weights of the round
that solved the run, else of its best round). The last line printed is the run's result as JSON, the same line
`apexrl launch` ends with.
"""

from __future__ import annotations

import argparse
import logging
import sys

import apexrl


def show(row: apexrl.ProgressRow) -> None:
    mean = "-" if row.mean_return_100 is None else f"{row.mean_return_100:.1f}"
    print(
        f"{row.wall_seconds:5.0f}s  env steps {row.env_steps:>7,}  updates {row.updates or 0:>6,}  "
        f"eval return {mean} ({row.eval_episodes} episodes)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time budget of the run")
    parser.add_argument("--run-dir", default=None, help="run directory (default: runs/CartPole-v1-TIMESTAMP)")
    parser.add_argument("--num-actors", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    # Every FleetSettings field is a keyword here (`apexrl launch --help` lists them); a bad value raises
    # apexrl.ConfigError now, before any process starts.
    fleet = apexrl.local_fleet(
        num_shards=2,
        num_actors=args.num_actors,
        env="CartPole-v1",
        max_seconds=args.max_seconds,
        run_dir=args.run_dir,
        seed=0,
        progress_seconds=2.0,
    )
    with apexrl.launch(
        fleet, on_progress=show
    ) as run:  # show() gets every progress row, in the fleet's thread
        print(f"training in {run.run_dir}", flush=True)
        try:
            result = run.wait()  # until solved or max_seconds; run.progress() is the latest row meanwhile
        except KeyboardInterrupt:  # Ctrl-C: stop the fleet and report what it did, as `apexrl launch` does
            print("stopping the fleet (Ctrl-C)", file=sys.stderr, flush=True)
            result = run.stop()

    if result.kept_policy or result.last_checkpoint:  # the evaluator's kept policy (else the learner's last)
        policy = apexrl.load_policy(result.run_dir)
        env = policy.make_env()
        obs, _ = env.reset(seed=0)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total += float(reward)
            done = terminated or truncated
        print(f"one greedy episode of {policy.describe()}: return {total:.0f}", flush=True)
    print(result.to_json(), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # a second Ctrl-C while the fleet stops: leaving the `with` block stopped it
        sys.exit(130)

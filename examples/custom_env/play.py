"""Play a trained policy outside the fleet with apexrl's Python API:

    python examples/custom_env/play.py RUN_DIR [--episodes 5]

`apexrl.load_policy` reads the policy the run kept (the evaluator's best round); `policy.make_env()` builds the environment as training built it
(its plugin module imported, its constructor arguments given); `policy.act(obs)` is the greedy action. Prints one
line per episode, then the mean return.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import apexrl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory of apexrl launch (or a checkpoint file)")
    parser.add_argument("--episodes", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # where the corridor module lives
    policy = apexrl.load_policy(args.run_dir)
    env = policy.make_env(trust_env_modules=True)  # our own run: the corridor module it names is ours
    returns = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        print(f"episode {episode}: return {total:.2f}")
    env.close()
    print(
        f"mean return {sum(returns) / len(returns):.2f} over {len(returns)} episode{'' if len(returns) == 1 else 's'} of {policy.env.describe()}"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback
        print("interrupted", file=sys.stderr)
        sys.exit(130)

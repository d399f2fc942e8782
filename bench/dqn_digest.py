"""A digest of Ape-X DQN's behaviour, to compare two checkouts bit for bit (a refactor must not change it): the
learner's published weights, priorities and losses after 50 updates on fixed batches with seed 0, and the actor
policy's epsilon-greedy actions and initial priorities on fixed weights and transitions; then the same learner and
the actor's torch policy on MinAtar-shaped pixels (the convolutional torso).

    .venv/bin/python bench/dqn_digest.py                                   # this checkout
    cd /tmp/base && /tmp/base/.venv/bin/python /work/main/bench/dqn_digest.py --checkout /tmp/base

(`git worktree add /tmp/base REV` and `bash scripts/setup.sh` there make the other checkout.) Equal lines mean the
same behaviour. It also runs on checkouts from before the algorithm seam (their Learner took obs_dim and
num_actions, their actor policy lived in apexrl.actor.policy).
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
from harness.digest import digest, run


def train(spaces, batches, **settings) -> tuple[dict, str]:
    """50 learner updates on `batches` from seed 0: the last published weights and the digest of the run."""
    from apexrl.learner.learner import Learner
    from tests.unit.learner.fakes import FakeSampler, Publisher, config

    cfg = config(batch_size=32, publish_every=10, target_update_period=7, **settings)
    sampler, publisher = FakeSampler(), Publisher()
    if list(inspect.signature(Learner.__init__).parameters)[2] == "obs_dim":  # before the seam
        learner = Learner(cfg, spaces.obs_dim, spaces.num_actions, sampler, publisher, spaces=spaces)
    else:
        learner = Learner(cfg, spaces, sampler, publisher)
    losses = [learner.train_step(batch) for batch in batches]
    version, weights = publisher.published[-1]
    return weights, (
        f"version {version}, weights {digest(weights[k] for k in sorted(weights))}, priorities "
        f"{digest(p for _, p in sampler.updates)}, losses {digest([np.array(losses)])}"
    )


def learner_line() -> str:
    from apexrl.common.environments import EnvSpaces
    from tests.unit.learner.fakes import make_batch

    batches = [make_batch(range(32 * i, 32 * i + 32), seed=i) for i in range(50)]
    return "learner: " + train(EnvSpaces.vector(4, 2), batches, hidden_sizes=(64, 64))[1]


def pixel_learner_line() -> str:
    """The learner on MinAtar-shaped batches (bool [10, 10, 4] observations, 3 actions: the convolutional torso),
    then the actor's torch policy rebuilt from its published weights: priorities and greedy actions."""
    from apexrl.common.environments import EnvSpaces
    from tests.unit.learner.fakes import make_batch

    batches = []
    for i in range(50):
        batch = make_batch(range(32 * i, 32 * i + 32), obs_dim=400, num_actions=3, seed=i)
        for name in ("obs", "next_obs"):
            batch.columns[name] = (batch.columns[name] > 0.5).reshape(-1, 10, 10, 4)
        batches.append(batch)
    spaces = EnvSpaces((10, 10, 4), "bool", 3)
    weights, learned = train(spaces, batches, network="auto", hidden_sizes=None)
    try:
        from apexrl.algorithms.dqn.acting import make_policy
    except ImportError:  # before the seam
        from apexrl.actor.policy import make_policy
    policy = make_policy(weights, spaces)
    columns = batches[-1].columns
    priorities = (
        policy.initial_priorities(columns)
        if hasattr(policy, "initial_priorities")
        else policy.td_error_abs(columns)
    )
    return (
        f"pixel learner: {learned}; actor priorities {digest([priorities])}, "
        f"greedy {digest([policy.greedy(columns['obs']).astype(np.int64)])}"
    )


def actor_line() -> str:
    from apexrl.common.environments import EnvSpaces

    rng = np.random.default_rng(0)
    shapes = {
        "torso.0.weight": (64, 4),
        "torso.0.bias": (64,),
        "value.weight": (1, 64),
        "value.bias": (1,),
        "advantage.weight": (2, 64),
        "advantage.bias": (2,),
    }
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    columns = {
        "obs": rng.normal(size=(256, 4)).astype(np.float32),
        "next_obs": rng.normal(size=(256, 4)).astype(np.float32),
        "action": rng.integers(2, size=256),
        "reward": rng.normal(size=256).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], 256).astype(np.float32),
    }
    act_rng = np.random.default_rng(1)
    batches = [columns["obs"][i : i + 4] for i in range(0, 256, 4)]
    try:
        from apexrl.algorithms.dqn.acting import EpsilonGreedy, make_policy
    except ImportError:  # before the seam
        from apexrl.actor.exploration import epsilon_greedy
        from apexrl.actor.policy import make_policy

        policy = make_policy(weights, EnvSpaces.vector(4, 2))
        priorities = policy.td_error_abs(columns)
        actions = [epsilon_greedy(policy.q_values(obs), 0.3, act_rng) for obs in batches]
    else:
        policy = make_policy(weights, EnvSpaces.vector(4, 2))
        priorities = policy.initial_priorities(columns)
        explorer = EpsilonGreedy(0.3, act_rng)
        actions = [explorer.actions(policy, obs) for obs in batches]
    return f"actor: priorities {digest([priorities])}, actions {digest(a.astype(np.int64) for a in actions)}"


def main() -> int:
    return run(__doc__, (learner_line, actor_line, pixel_learner_line))


if __name__ == "__main__":
    sys.exit(main())

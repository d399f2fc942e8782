"""A digest of Ape-X DPG's behaviour (TD3's options on: the registry's dpg defaults), to compare two checkouts bit
for bit (a refactor must not change it): the learner's published acting weights, priorities and losses after 50
updates on fixed batches with seed 0 (Pendulum-sized observations, a Box of 2 actions with unequal bounds), then
the actor's policy rebuilt from those weights (its initial priorities and greedy actions); and the actor policy's
noisy actions (uniformly random warm-up steps, white and correlated Gaussian noise, a fixed rng) and initial
priorities on fixed weights and transitions.

    .venv/bin/python bench/dpg_digest.py                                   # this checkout
    cd /tmp/base && /tmp/base/.venv/bin/python /work/main/bench/dpg_digest.py --checkout /tmp/base

(`git worktree add /tmp/base REV` and `bash scripts/setup.sh` there make the other checkout.) Equal lines mean the
same behaviour. It runs on checkouts since the algorithm seam (DPG came after it).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import torch
from harness.digest import digest, run

LOW, HIGH = (-2.0, -1.0), (2.0, 3.0)  # Pendulum's [-2, 2], and one off-centre dimension


def spaces():
    from apexrl.common.environments import EnvSpaces

    return EnvSpaces.box((3,), LOW, HIGH)


def learner_line() -> str:
    """50 learner updates from seed 0 with the registry's dpg defaults (learning rates, Polyak targets, twin
    critics, policy delay 2, target smoothing), then the actor's policy on the last published weights."""
    from apexrl.algorithms.dpg.acting import make_policy
    from apexrl.learner.learner import Learner
    from tests.unit.learner.fakes import FakeSampler, Publisher, config, make_batch

    # None: the registry's dpg default, where tests/unit/learner/fakes.py's config sets DQN-sized values
    cfg = config(
        batch_size=32,
        publish_every=10,
        hidden_sizes=(64, 64),
        learning_rate=None,
        target_update_period=None,
    )
    batches = [make_batch(range(32 * i, 32 * i + 32), obs_dim=3, seed=i, action_dim=2) for i in range(50)]
    sampler, publisher = FakeSampler(obs_dim=3, action_dim=2), Publisher()
    torch.manual_seed(0)
    learner = Learner(cfg, spaces(), sampler, publisher)
    c = learner.config
    assert c.twin_critics and c.policy_delay == 2 and c.target_noise > 0 and c.target_tau < 1, "TD3's options"
    losses = [learner.train_step(batch) for batch in batches]
    version, weights = publisher.published[-1]
    policy = make_policy(weights, spaces())
    columns = batches[-1].columns
    return (
        f"learner: version {version}, weights {digest(weights[k] for k in sorted(weights))}, priorities "
        f"{digest(p for _, p in sampler.updates)}, losses {digest([np.array(losses)])}; actor priorities "
        f"{digest([policy.initial_priorities(columns)])}, greedy {digest([policy.greedy(columns['obs'])])}"
    )


def actor_line() -> str:
    from apexrl.algorithms.dpg.acting import make_explorer, make_policy

    rng = np.random.default_rng(0)
    shapes = {
        "policy.torso.0.weight": (64, 3),
        "policy.torso.0.bias": (64,),
        "policy.out.weight": (2, 64),
        "policy.out.bias": (2,),
        "critic.torso.0.weight": (64, 5),
        "critic.torso.0.bias": (64,),
        "critic.out.weight": (1, 64),
        "critic.out.bias": (1,),
    }
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    for net in ("policy", "critic"):
        weights[f"{net}.action_low"] = np.array(LOW, np.float32)
        weights[f"{net}.action_high"] = np.array(HIGH, np.float32)
    columns = {
        "obs": rng.normal(size=(256, 3)).astype(np.float32),
        "next_obs": rng.normal(size=(256, 3)).astype(np.float32),
        "action": rng.uniform(LOW, HIGH, size=(256, 2)).astype(np.float32),
        "reward": rng.normal(size=256).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], 256).astype(np.float32),
    }
    policy = make_policy(weights, spaces())
    priorities = policy.initial_priorities(columns)
    batches = [columns["obs"][i : i + 4] for i in range(0, 256, 4)]
    actions = []
    # actor 1 of 4 (its Ape-X noise scale) after 16 uniformly random steps; actor 0 with correlated noise
    for seed, index, correlation, random_steps in ((1, 1, None, 16), (2, 0, 0.9, None)):
        settings = SimpleNamespace(
            actor_index=index,
            num_actors=4,
            evaluate=False,
            epsilon=None,
            noise_scale=None,
            noise_correlation=correlation,
            random_steps=random_steps,
        )
        explorer = make_explorer(settings, spaces(), np.random.default_rng(seed))
        actions += [explorer.actions(policy, obs) for obs in batches]
    return f"actor: priorities {digest([priorities])}, actions {digest(actions)}"


def main() -> int:
    return run(__doc__, (learner_line, actor_line))


if __name__ == "__main__":
    sys.exit(main())

"""Ape-X DQN (Horgan et al., 2018): discrete actions; dueling double DQN on n-step targets, epsilon-greedy actors
with fixed per-actor epsilons. Acting in `acting.py`, learning in `learning.py`."""

from __future__ import annotations

from apexrl.algorithms.registry import Algorithm
from apexrl.common.spaces import DISCRETE

ALGORITHM = Algorithm(
    name="dqn",
    action_kind=DISCRETE,
    summary="Ape-X DQN: dueling double DQN on n-step targets, epsilon-greedy actors",
    writing_module="apexrl.algorithms.nstep",
    acting_module="apexrl.algorithms.dqn.acting",
    learning_module="apexrl.algorithms.dqn.learning",
    defaults={
        # Measured on CartPole-v1, Acrobot-v1 and MinAtar (FleetSettings and LearnerConfig say how).
        "fleet": {"samples_per_insert": 16.0, "replay_capacity": 25_000},
        "learner": {"target_update_period": 100, "target_tau": 1.0},
    },
    settings_module="apexrl.algorithms.dqn.settings",
)

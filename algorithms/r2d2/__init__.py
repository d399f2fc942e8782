"""R2D2 (Kapturowski et al., 2019), recurrent Ape-X: an LSTM Q-network trained on overlapping sequences from the
distributed prioritized replay, with burn-in, value rescaling and eta-mixed priorities. Networks in `networks.py`,
the loss in `losses.py`, learning in `learning.py`, acting in `acting.py`, the sequences written in `writing.py`,
its own settings in `settings.py`. Picked by name (`--algorithm r2d2`); auto still picks dqn for Discrete actions.
"""

from __future__ import annotations

from apexrl.algorithms.r2d2.defaults import DEFAULT_TARGET_UPDATE_PERIOD
from apexrl.algorithms.registry import Algorithm
from apexrl.common.spaces import DISCRETE

ALGORITHM = Algorithm(
    name="r2d2",
    action_kind=DISCRETE,
    summary="R2D2: recurrent (LSTM) double-Q on overlapping sequences with burn-in, value rescaling, eta-mixed "
    "priorities; epsilon-greedy actors",
    writing_module="apexrl.algorithms.r2d2.writing",
    acting_module="apexrl.algorithms.r2d2.acting",
    learning_module="apexrl.algorithms.r2d2.learning",
    defaults={
        # Counted in steps (replay_capacity) and in sequences (min_replay_size, samples_per_insert, batch_size).
        # samples_per_insert 16: CartPoleNoVel-v1 solved in 0.89x the time of 4 (fewer env steps per update, so the
        # actors leave the learner more of the CPU: bench/README.md, "R2D2's defaults").
        "fleet": {"samples_per_insert": 16.0, "replay_capacity": 100_000},
        "learner": {"target_update_period": DEFAULT_TARGET_UPDATE_PERIOD},
    },
    settings_module="apexrl.algorithms.r2d2.settings",
)

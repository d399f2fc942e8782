"""A small algorithm registered from the test tree (APEXRL_ALGORITHMS=tests.support.toy_algorithm): linear
Q-learning on n-step transitions with epsilon-greedy actors. It exists to show that adding an algorithm is its
folder plus its registration: no role file names it, and the launcher trains it end to end
(tests/integration/launcher/test_algorithm_plugin.py)."""

from __future__ import annotations

from apexrl.algorithms.registry import Algorithm
from apexrl.common.spaces import DISCRETE

ALGORITHM = Algorithm(
    name="linear-q",
    action_kind=DISCRETE,
    summary="linear Q-learning on n-step targets, epsilon-greedy actors (a test's algorithm)",
    writing_module="apexrl.algorithms.nstep",
    acting_module="tests.support.toy_algorithm.acting",
    learning_module="tests.support.toy_algorithm.learning",
    defaults={
        "fleet": {"samples_per_insert": 8.0, "replay_capacity": 20_000},
        "actor": {"linear_epsilon": 0.1},
        "learner": {"linear_learning_rate": 0.01},
    },
    settings_module="tests.support.toy_algorithm.settings",
)

"""Ape-X DPG (Horgan et al., 2018): continuous actions (any Box); a deterministic policy and a critic trained on
n-step targets from the same distributed prioritized replay, with TD3's clipped double-Q, target-policy smoothing
and delayed policy updates as settings. Acting in `acting.py`, learning in `learning.py`."""

from __future__ import annotations

from apexrl.algorithms.registry import Algorithm
from apexrl.common.spaces import BOX

ALGORITHM = Algorithm(
    name="dpg",
    action_kind=BOX,
    summary="Ape-X DPG: deterministic policy and critic on n-step targets, Gaussian-noise actors (TD3 options)",
    writing_module="apexrl.algorithms.nstep",
    acting_module="apexrl.algorithms.dpg.acting",
    learning_module="apexrl.algorithms.dpg.learning",
    defaults={
        "fleet": {"samples_per_insert": 64.0, "replay_capacity": 100_000},
        "learner": {
            "learning_rate": 1e-3,
            "target_update_period": 1,
            "target_tau": 0.005,
            "twin_critics": True,
            "policy_delay": 2,
            "target_noise": 0.2,
            "target_noise_clip": 0.5,
        },
        "actor": {"random_steps": 1_000},
    },
    settings_module="apexrl.algorithms.dpg.settings",
    options_label="TD3 options",
)

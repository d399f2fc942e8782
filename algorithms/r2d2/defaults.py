"""R2D2's defaults by kind of observation, as plain data (no torch): the actor, the learner and the launcher read
the same ones. Images follow the paper (Kapturowski et al., 2019: burn-in 40, 80 steps trained, a new sequence every
40, an LSTM of 512); vectors a quarter of its length and a small core."""

from __future__ import annotations

# (burn_in, train_length, sequence_period) by whether observations are images.
DEFAULT_GEOMETRY: dict[bool, tuple[int, int, int]] = {True: (40, 80, 40), False: (10, 20, 10)}
# The LSTM's size and the fully connected layers before it, by torso.
DEFAULT_CORE_SIZE: dict[str, int] = {"mlp": 64, "nature": 512, "minatar": 128}
DEFAULT_HIDDEN: dict[str, tuple[int, ...]] = {"mlp": (64,), "nature": (512,), "minatar": (128,)}
DEFAULT_N_STEP = 5
# Adam's learning rate by whether observations are images. Vectors: 2e-3 solved CartPoleNoVel-v1 in 0.83x the time of
# 1e-3 (bench/README.md, "R2D2's defaults"); images keep 1e-3 (not measured against another rate here).
DEFAULT_LEARNING_RATE: dict[bool, float] = {True: 1e-3, False: 2e-3}
# Updates between copies of the online network to the target: 100 solved CartPoleNoVel-v1 in 0.74x the time of 400.
DEFAULT_TARGET_UPDATE_PERIOD = 100
# Sequences per update when the fleet file gives none (apexrl launch): 64 sequences of 30 steps are ~2,000 steps,
# a DQN batch's order of work on a CPU (256 sequences took 63 ms an update against 20 ms).
DEFAULT_BATCH_SIZE = 64

#!/usr/bin/env python
"""What one R2D2 learner update costs on the CPU (issue 30): `R2D2Learning.update` on a realistic random batch of
CartPoleNoVel-v1 sequence items (64 items of 10 burn-in + 20 trained steps, MLP torso 64, LSTM 64, one torch thread
as the learner runs by default: learner config `torch_threads`), with the LSTM core run by torch's fused kernel
(`fused_core`, the learner's) and by stepping the cell from Python (`stepwise_core`, the reference), alternating
round by round so both see the same machine; then a breakdown of one update into its phases.

    .venv/bin/python bench/r2d2_update.py                    # CartPoleNoVel, 5 rounds of 3 s per variant
    .venv/bin/python bench/r2d2_update.py --image --rounds 2 # also MinAtar-shaped pixels (burn-in 40 + 80 trained)

Figures are CPU milliseconds of the one thread that runs torch (`time.thread_time`), so other processes on the same
cores inflate them less than wall time. Prints one line per round and variant, the medians, and the breakdown (ms
per update, median of the measured calls):
online unroll forward (with autograd), target unroll (no gradient), the rest of the loss, backward, gradient
clipping with Adam's step.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from collections.abc import Callable

import numpy as np
import torch

from apexrl.algorithms.r2d2.learning import R2D2Learning, sequence_batch
from apexrl.algorithms.r2d2.losses import r2d2_loss
from apexrl.algorithms.r2d2.networks import fused_core, stepwise_core
from apexrl.common.spaces import EnvSpaces

VARIANTS = {"fused": fused_core, "stepwise": stepwise_core}
EPISODE_START = 0.1  # share of items whose first step starts an episode (no burn-in: trained from step 0)
FULL = 0.85  # share of items of full length (the rest end an episode inside the window, padded past it)


def random_batch(
    spaces: EnvSpaces, batch: int, steps: int, core: int, rng: np.random.Generator
) -> dict[str, torch.Tensor]:
    """Replay columns as the learner receives them for `batch` items of up to `steps` steps."""
    lengths = np.where(rng.random(batch) < FULL, steps, rng.integers(steps // 3, steps + 1, batch))
    discount = np.full((batch, steps), 0.99, np.float32)
    ends = lengths < steps
    discount[np.flatnonzero(ends), lengths[ends] - 1] = 0.0
    if spaces.layout == "vector":
        obs = torch.tensor(rng.normal(size=(batch, steps, spaces.obs_dim)), dtype=torch.float32)
    else:
        obs = torch.tensor(rng.random((batch, steps, *spaces.obs_shape)) < 0.1)  # MinAtar's bool channels
    return {
        "obs": obs,
        "action": torch.tensor(rng.integers(0, spaces.num_actions, (batch, steps))),
        "reward": torch.tensor(rng.random((batch, steps)) < 0.9, dtype=torch.float32),
        "discount": torch.tensor(discount),
        "lengths": torch.tensor(lengths),
        "state": torch.tensor(np.tanh(rng.normal(size=(batch, 2, core))), dtype=torch.float32),
        "prev_action": torch.tensor(rng.integers(0, spaces.num_actions, batch)),
        "prev_reward": torch.ones(batch),
        "episode_start": torch.tensor(rng.random(batch) < EPISODE_START),
    }


def learning_for(spaces: EnvSpaces, variant: str, burn_in: int) -> R2D2Learning:
    torch.manual_seed(0)
    learning = R2D2Learning(types.SimpleNamespace(sequence_burn_in=burn_in), spaces, torch.device("cpu"))
    for net in (learning.online, learning.target):
        net.core_unroll = VARIANTS[variant]
    return learning


def ms_per_call(step: Callable[[], object], seconds: float) -> float:
    """CPU milliseconds of this thread per call of step() over `seconds` of it, after a warm-up of a few calls (CPU
    time, not wall time: the bench shares its cores with whatever else runs; torch runs on this one thread)."""
    for _ in range(3):
        step()
    calls, t0 = 0, time.thread_time()
    while time.thread_time() - t0 < seconds:
        step()
        calls += 1
    return 1e3 * (time.thread_time() - t0) / calls


def breakdown(learning: R2D2Learning, columns: dict[str, torch.Tensor], calls: int) -> dict[str, float]:
    """Median ms per phase of an update, each phase timed on its own (the update's steps, in its order)."""
    o, weights = learning.options, torch.ones(columns["action"].shape[0])
    batch = sequence_batch(columns)
    prev_action, prev_reward = batch.core_inputs()
    state = (batch.state[:, 0], batch.state[:, 1])
    stop = ~batch.episode_start if o.stop_burn_in_gradient else None
    times: dict[str, list[float]] = {
        k: [] for k in ("online", "target", "loss rest", "backward", "clip+adam")
    }
    for _ in range(calls + 3):
        t0 = time.thread_time()
        learning.online.unroll(batch.obs, prev_action, prev_reward, state, o.burn_in, stop)
        t1 = time.thread_time()
        with torch.no_grad():
            learning.target.unroll(batch.obs, prev_action, prev_reward, state)
        t2 = time.thread_time()
        loss, _, _ = r2d2_loss(
            learning.online,
            learning.target,
            batch,
            weights,
            n_step=o.n_step,
            burn_in=o.burn_in,
            eta=o.priority_eta,
        )
        t3 = time.thread_time()
        learning.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t4 = time.thread_time()
        torch.nn.utils.clip_grad_norm_(learning.online.parameters(), o.max_grad_norm)
        learning.optimizer.step()
        t5 = time.thread_time()
        for name, seconds in zip(
            times, (t1 - t0, t2 - t1, (t3 - t2) - (t2 - t0), t4 - t3, t5 - t4), strict=True
        ):
            times[name].append(1e3 * seconds)
    return {name: statistics.median(values[3:]) for name, values in times.items()}


def run_config(name: str, spaces: EnvSpaces, geometry: tuple[int, int], batch: int, args) -> None:
    burn_in, trained = geometry
    core = learning_for(spaces, "fused", burn_in).online.core_size
    columns = random_batch(spaces, batch, burn_in + trained, core, np.random.default_rng(0))
    weights = torch.ones(batch)
    learners = {variant: learning_for(spaces, variant, burn_in) for variant in VARIANTS}
    steps = {variant: 0 for variant in VARIANTS}
    figures: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    print(
        f"{name}: {batch} items x {burn_in} + {trained} steps, LSTM {core}, {torch.get_num_threads()} thread(s)"
    )
    for round_ in range(args.rounds):
        for variant, learning in learners.items():

            def step(learning=learning, variant=variant) -> None:
                steps[variant] += 1
                learning.update(columns, weights, steps[variant])

            figures[variant].append(ms_per_call(step, args.seconds))
            print(f"  round {round_ + 1} {variant:8s} {figures[variant][-1]:6.1f} ms/update", flush=True)
    medians = {variant: statistics.median(values) for variant, values in figures.items()}
    print(
        f"  median: fused {medians['fused']:.1f} ms, stepwise {medians['stepwise']:.1f} ms "
        f"({medians['stepwise'] / medians['fused']:.2f}x)"
    )
    for variant, learning in learners.items():
        parts = breakdown(learning, columns, args.breakdown_calls)
        print(f"  {variant:8s} " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()) + " ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per round and variant")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the learner's default is 1)")
    parser.add_argument("--breakdown-calls", type=int, default=30)
    parser.add_argument("--image", action="store_true", help="also MinAtar-shaped pixels (10x10x4), 16 items")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run_config("CartPoleNoVel-v1", EnvSpaces.vector(2, 2), (10, 20), 64, args)
    if args.image:
        run_config("MinAtar pixels", EnvSpaces((10, 10, 4), "bool", 6), (40, 80), 16, args)


if __name__ == "__main__":
    main()

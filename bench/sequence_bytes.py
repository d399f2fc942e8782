#!/usr/bin/env python
"""Bytes per stored step of a sequence table (R2D2 windows, period = half the window) against bytes per stored
transition of a transition table holding the same observations, measured in one run.

Each table is filled to its capacity in-process and measured with tracemalloc (every allocation the table holds:
its columns, frames, sum tree, key ring, the sequence index and the items' fields), so the figure is memory, not
a formula. Two workloads:

- pixels: real Pong frames played now with ale-py (uint8 [4, 84, 84] stacks, zstd), an LSTM state of 2 x 512
  floats per item, windows of 120 steps every 60;
- vector: CartPoleNoVel-v1's observations (float32 [4], the velocities zeroed), a state of 2 x 64 floats per item,
  windows of 40 every 20.

Copies of each window (what a store without references would hold) would cost about window / period times the
steps. Target (issue 30): a step <= 1.2x a transition.

    .venv/bin/python bench/sequence_bytes.py            # ~30 s
    .venv/bin/python bench/sequence_bytes.py --quick    # small tables, a smoke test
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Callable

import numpy as np
from workloads import pong_transitions

from apexrl.common.compression import compress, take_rows
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable, TableConfig


def held_bytes(fill: Callable[[], ReplayTable]) -> tuple[int, ReplayTable]:
    """Bytes still allocated once `fill` returns its table (the table alive)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = fill()
    gc.collect()  # what the filling left for the collector is not the table's
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, table


def fill_transitions(columns: dict, rows: int, chunk: int = 64) -> ReplayTable:
    table = ReplayTable(TableConfig(capacity=rows, seed=0))
    for start in range(0, rows, chunk):
        idx = np.arange(start, min(rows, start + chunk))
        table.insert({name: take_rows(column, idx) for name, column in columns.items()})
    return table


def fill_sequences(
    steps: dict, rows: int, window: int, period: int, state_shape: tuple[int, ...]
) -> ReplayTable:
    """`rows` steps of one writer, `period` per insert, each insert with the window that ends in it."""
    table = ReplayTable(TableConfig(capacity=rows, max_sequence_length=window, seed=0))
    state = np.zeros((1, *state_shape), dtype=np.float32)
    for sequence, start in enumerate(range(0, rows, period)):
        idx = np.arange(start, min(rows, start + period))
        end = start + len(idx)
        items = None
        if end >= window:  # the window [end - window, end) is complete
            items = ItemBatch(np.array([len(idx)]), np.array([window]), {"state": state})
        batch = {name: take_rows(column, idx) for name, column in steps.items()}
        table.insert(batch, writer_id="actor", sequence=sequence, items=items)
    return table


def pixel_workload(rows: int) -> tuple[dict, dict]:
    raw = pong_transitions(rows)
    transitions = {
        "obs": compress(raw["obs"], "zstd"),
        "action": raw["action"],
        "reward": raw["reward"],
        "discount": raw["discount"],
        "next_obs": compress(raw["next_obs"], "zstd"),
        "weight_version": raw["weight_version"],
    }
    steps = {name: transitions[name] for name in ("obs", "action", "reward", "discount")}
    return transitions, steps


def vector_workload(rows: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(rows + 1, 4)).astype(np.float32)
    obs[:, [1, 3]] = 0.0  # CartPoleNoVel-v1 zeroes the velocities
    steps = {
        "obs": obs[:rows],
        "action": rng.integers(0, 2, rows).astype(np.int64),
        "reward": np.ones(rows, np.float32),
        "discount": np.full(rows, 0.99, np.float32),
    }
    transitions = {**steps, "next_obs": obs[1:], "weight_version": np.zeros(rows, np.int64)}
    return transitions, steps


def measure(name: str, rows: int, workload, window: int, period: int, state_shape: tuple[int, ...]) -> None:
    transitions, steps = workload(rows)
    fill_transitions(transitions, 2 * period)  # modules imported on first use are not the tables' bytes
    fill_sequences(steps, 2 * window, window, period, state_shape)
    transition_bytes, _ = held_bytes(lambda: fill_transitions(transitions, rows))
    step_bytes, table = held_bytes(lambda: fill_sequences(steps, rows, window, period, state_shape))
    info = table.info()
    per_transition, per_step = transition_bytes / rows, step_bytes / info.steps
    copies = per_step * window / period  # each step held once per window that covers it
    print(
        f"{name:7s} {rows:>7,} rows  transition {per_transition:9.1f} B  step {per_step:9.1f} B  "
        f"step/transition {per_step / per_transition:5.2f}x  (window {window}, period {period}, {info.size} items; "
        f"copies would hold ~{copies / per_transition:4.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small tables (a smoke test)")
    args = parser.parse_args()
    pixels, vectors = (600, 4_000) if args.quick else (6_000, 200_000)
    measure("pixels", pixels, pixel_workload, 120, 60, (2, 512))
    measure("vector", vectors, vector_workload, 40, 20, (2, 64))


if __name__ == "__main__":
    main()

"""Replay figures, part 3: the same operations in-process, without gRPC or codec, at the same capacity.

`SumTree.update(256)` (random leaves) and `SumTree.sample(256)` (stratified, indices only);
`ReplayTable.insert` (CartPole and Atari rows, 64 and 256 per batch, with priorities and writer de-duplication
as the server calls it); on a full table `ReplayTable.sample(256)` (tree sample + gather of every column +
keys + stored priorities), `ReplayTable.update_priorities(256)`, and the cycle sample(256) + importance
weights + update_priorities(256), which `replay_cpprb` compares with cpprb's cycle.
"""

from __future__ import annotations

import numpy as np
from harness.report import progress
from harness.results import Results
from harness.timing import Timing, measure_loop, with_cpu
from workloads import (
    FILL_BATCH,
    SAMPLE_BATCH,
    UPDATE_BATCH,
    WORKLOADS,
    cartpole_batch,
    priorities,
    row_nbytes,
)

BETA = 0.4  # importance-sampling exponent of the cycle


def measure_in_process(
    results: Results, timing: Timing, capacity: int, atari_capacity: int, rng: np.random.Generator
) -> None:
    from apexrl.replay_server.core.table import ReplayTable, TableConfig

    section = f"in-process ({capacity:,} slots, CartPole rows)"
    measure_sum_tree(results, section, timing, capacity, rng)
    table = ReplayTable(TableConfig(capacity=capacity, seed=0))
    measure_table_inserts(results, section, table, "cartpole", timing, rng)
    fill_table(table, capacity, rng)
    measure_full_table(results, section, table, timing, rng)
    del table
    atari = ReplayTable(TableConfig(capacity=atari_capacity, seed=0))
    atari_section = f"in-process ({atari_capacity:,} slots, Atari rows)"
    measure_table_inserts(results, atari_section, atari, "atari", timing, rng)


def _pools(rng: np.random.Generator, high: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """64 index arrays (when `high` is given) and 64 priority arrays of 256 entries, cycled through."""
    idx = [rng.integers(0, high, UPDATE_BATCH) for _ in range(64)] if high else []
    return idx, [rng.random(UPDATE_BATCH) * 3 + 0.01 for _ in range(64)]


def measure_sum_tree(
    results: Results, section: str, timing: Timing, capacity: int, rng: np.random.Generator
) -> None:
    from apexrl.replay_server.core.sum_tree import SumTree

    progress(f"in-process: SumTree({capacity:,}) filled with random priorities")
    tree = SumTree(capacity, 0.6)
    tree.update(np.arange(capacity), rng.random(capacity) + 0.01)
    idx_pool, pri_pool = _pools(rng, capacity)
    counter = [0]

    def update() -> None:
        i = counter[0] = (counter[0] + 1) % 64
        tree.update(idx_pool[i], pri_pool[i])

    t = timing
    m = with_cpu(None, measure_loop, update, t.seconds, t.warmup)
    results.figure("tree_update", section, "SumTree.update(256)", m, "calls/s")
    m = with_cpu(None, measure_loop, lambda: tree.sample(SAMPLE_BATCH, rng), t.seconds, t.warmup)
    results.figure("tree_sample", section, "SumTree.sample(256) (indices only)", m, "calls/s")


def measure_table_inserts(
    results: Results, section: str, table, workload: str, timing: Timing, rng: np.random.Generator
) -> None:
    for rows in (64, 256):
        batch = WORKLOADS[workload](rows, rng)
        pri = priorities(rows, rng)
        sequence = [0]

        def insert(batch=batch, pri=pri, sequence=sequence) -> None:
            sequence[0] += 1
            table.insert(batch, pri, writer_id="bench", sequence=sequence[0])

        progress(f"in-process: ReplayTable.insert {workload} x{rows}")
        m = with_cpu(None, measure_loop, insert, timing.seconds, timing.warmup)
        grpc_row = results.by_key.get(f"grpc_insert_{workload}_{rows}")
        note = "" if grpc_row is None else f"gRPC SDK reaches {grpc_row.value / (m.rate * rows):.2f} of this"
        results.figure(
            f"table_insert_{workload}_{rows}",
            section,
            f"ReplayTable.insert {workload} x{rows}",
            m,
            "transitions/s",
            per_call=rows,
            row_bytes=row_nbytes(batch),
            note=note,
        )


def fill_table(table, capacity: int, rng: np.random.Generator) -> None:
    progress(f"in-process: filling the table to {capacity:,} rows")
    big = cartpole_batch(FILL_BATCH, rng)
    while table.info().size < capacity:
        table.insert(big, priorities(FILL_BATCH, rng))


def measure_full_table(
    results: Results, section: str, table, timing: Timing, rng: np.random.Generator
) -> None:
    """sample(256), update_priorities(256) of live keys, and the cycle with importance weights."""
    key_pool = [table.sample(SAMPLE_BATCH).keys for _ in range(64)]
    _, pri_pool = _pools(rng)
    counter = [0]
    t = timing
    m = with_cpu(None, measure_loop, lambda: table.sample(SAMPLE_BATCH), t.seconds, t.warmup)
    results.figure("table_sample", section, "ReplayTable.sample(256) (+ gather, keys)", m, "calls/s")

    def update() -> None:
        i = counter[0] = (counter[0] + 1) % 64
        table.update_priorities(key_pool[i], pri_pool[i])

    m = with_cpu(None, measure_loop, update, t.seconds, t.warmup)
    results.figure("table_update", section, "ReplayTable.update_priorities(256)", m, "calls/s")

    def cycle() -> np.ndarray:
        r = table.sample(SAMPLE_BATCH)
        p_min = r.min_priority / r.total_priority
        weights = (r.size * r.probabilities) ** -BETA / (r.size * p_min) ** -BETA
        i = counter[0] = (counter[0] + 1) % 64
        table.update_priorities(r.keys, pri_pool[i])
        return weights

    progress("in-process: cycle ReplayTable.sample(256) + IS weights + update_priorities(256)")
    m = with_cpu(None, measure_loop, cycle, t.seconds, t.warmup)
    results.figure("table_cycle", section, "cycle: sample(256) + IS weights + update(256)", m, "cycles/s")

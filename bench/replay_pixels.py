"""Replay figures, part 5: pixel rows on real Pong frames, compressed against raw in the same run.

Transitions are played with ale-py at the start (`workloads.pong_transitions`: uint8 [4, 84, 84] stacks, 3-step
returns, random actions; random bytes would not compress). Three shard processes hold the same rows: raw
(56,464 B of pixels per row), zstd and LZ4 (one frame per row and image column, as the built-in actor sends them).

- `compress obs+next_obs`: the actor's cost, in-process: `compress_image_columns` of a batch of 256.
- `insert pong x64/x256`: `ReplayClient.insert` of real rows, raw and zstd, into one shard (`--insert-window`
  batches unacknowledged), as in part 1. Target: >= 15,000 transitions/s compressed.
- `bytes per stored transition`: the shard's own count (Info: stored_bytes / size) for raw, zstd and LZ4.
  Target: <= 2,000 (raw: 56,464 + scalars). ratio = compressed / raw.
- `learner data path`: the learner's default feed, a `SamplerProcess` (a child process sampling with a
  Prefetcher, decompressing straight into shared-memory slots) over the zstd shard, batches of 256 per second as
  the train loop takes them (priorities sent back, no train step); the same over the raw shard is its ceiling
  (ratio = zstd / raw). `decompress 256 rows` is the decompression alone, in-process. Target: >= 100/s.
"""

from __future__ import annotations

import time

import numpy as np
from harness.processes import Children, wait_healthy
from harness.report import progress
from harness.results import Results, Row
from harness.timing import Measurement, Timing, measure_loop, with_cpu
from workloads import pong_transitions, priorities

SECTION = "pixels: real Pong frames (raw, zstd, lz4)"
RAW_ROW_BYTES = 2 * 4 * 84 * 84 + 8 + 4 + 4 + 8  # obs, next_obs, action, reward, discount, weight_version
BATCH = 256


def measure_pixels(
    results: Results, timing: Timing, capacity: int, rows: int, window: int, workdir: str
) -> None:
    """Every pixel figure (shards started and stopped here)."""
    from apexrl.common.compression import compress_image_columns

    progress(f"playing {rows:,} Pong transitions with ale-py (real frames)")
    raw = pong_transitions(rows)
    columns = {
        "raw": raw,
        "zstd": compress_image_columns(raw, "zstd"),
        "lz4": compress_image_columns(raw, "lz4"),
    }
    measure_compression(results, timing, raw)
    with Children(workdir) as children:
        shards = {
            kind: children.start_shard(f"shard-pong-{kind}", capacity if kind != "lz4" else rows)
            for kind in columns
        }
        wait_healthy(list(shards.values()))
        for batch_rows in (64, BATCH):
            for kind in ("raw", "zstd"):
                measure_insert(results, shards[kind], kind, columns[kind], batch_rows, timing, window)
        fill(shards["lz4"].address, columns["lz4"])
        measure_bytes(results, shards)
        measure_data_path(results, timing, shards, columns["zstd"])


def _take(columns: dict, idx) -> dict:
    from apexrl.common.compression import take_rows

    return {name: take_rows(column, idx) for name, column in columns.items()}


def measure_compression(results: Results, timing: Timing, raw: dict[str, np.ndarray]) -> None:
    from apexrl.common.compression import compress_image_columns

    batch = _take(raw, slice(0, BATCH))
    for codec in ("zstd", "lz4"):
        progress(f"actor side: compress_image_columns({codec}) of {BATCH} rows")
        m = with_cpu(
            None,
            measure_loop,
            lambda c=codec: compress_image_columns(batch, c),
            timing.seconds,
            timing.warmup,
        )
        results.figure(
            f"pixels_compress_{codec}",
            SECTION,
            f"actor: compress obs+next_obs, {codec}",
            m,
            "transitions/s",
            per_call=BATCH,
            row_bytes=RAW_ROW_BYTES,
            note="in-process; MB/s of raw pixels compressed",
        )


def measure_insert(
    results: Results, shard, kind: str, columns: dict, batch_rows: int, timing: Timing, window: int
) -> None:
    from apexrl.common.compression import column_nbytes
    from apexrl.replay_server.client.replay_client import ReplayClient

    rows = len(columns["action"])
    batches = [
        _take(columns, slice(start, start + batch_rows))
        for start in range(0, rows - batch_rows + 1, batch_rows)
    ]
    pri = priorities(batch_rows, np.random.default_rng(0))
    sent = sum(column_nbytes(c) for c in batches[0].values()) // batch_rows
    turn = [0]
    progress(f"apexrl: ReplayClient.insert pong {kind} x{batch_rows} (max_in_flight {window})")
    with ReplayClient(shard.address, timeout=300, max_in_flight=window) as client:

        def insert() -> None:
            client.insert(batches[turn[0] % len(batches)], pri)
            turn[0] += 1

        m = with_cpu(
            shard.pid, measure_loop, insert, timing.seconds, timing.warmup, finish=lambda: client.flush(300)
        )
    results.figure(
        f"pixels_insert_{kind}_{batch_rows}",
        SECTION,
        f"insert pong {kind} x{batch_rows} ({sent:,} B/row sent)",
        m,
        "transitions/s",
        per_call=batch_rows,
        row_bytes=sent,
        target=15_000 if kind != "raw" else None,
        note="MB/s as sent; raw pixels: " + f"{m.rate * batch_rows * RAW_ROW_BYTES / 1e6:,.0f} MB/s",
    )


def fill(address: str, columns: dict) -> None:
    from apexrl.replay_server.client.replay_client import ReplayClient

    with ReplayClient(address, timeout=300) as client:
        rows = len(columns["action"])
        for start in range(0, rows, BATCH):
            client.insert(_take(columns, slice(start, start + BATCH)))
        client.flush(300)


def measure_bytes(results: Results, shards: dict) -> None:
    from apexrl.replay_server.client.replay_client import ReplayClient

    per_row = {}
    for kind, shard in shards.items():
        with ReplayClient(shard.address) as client:
            info = client.info()
        per_row[kind] = info.stored_bytes / info.size
    for kind, value in per_row.items():
        row = Row(
            SECTION,
            f"bytes per stored transition, {kind}",
            value,
            "B/transition",
            note=f"{per_row['raw'] / value:,.0f}x smaller than raw"
            if kind != "raw"
            else "obs + next_obs uint8[4,84,84] + scalars",
        )
        row.compare(per_row["raw"], "raw")
        if kind != "raw":
            row.target, row.target_text, row.met = 2_000, "<= 2,000", value <= 2_000
        results.add(f"pixels_bytes_{kind}", row)


def measure_data_path(results: Results, timing: Timing, shards: dict, zstd: dict) -> None:
    from apexrl.common.compression import decompress_into

    sample = _take(zstd, np.random.default_rng(0).integers(0, len(zstd["action"]), BATCH))
    out = {name: np.empty((BATCH, 4, 84, 84), np.uint8) for name in ("obs", "next_obs")}
    progress("in-process: decompress obs+next_obs of 256 rows")
    m = with_cpu(
        None,
        measure_loop,
        lambda: [decompress_into(sample[n], out[n]) for n in out],
        timing.seconds,
        timing.warmup,
    )
    results.figure(
        "pixels_decompress_256",
        SECTION,
        "decompress 256 rows (obs+next_obs, zstd)",
        m,
        "batches/s",
        row_bytes=BATCH * RAW_ROW_BYTES,
        note="in-process, one thread; MB/s of pixels out",
    )
    rates = {}
    for kind in ("raw", "zstd"):
        progress(f"learner data path: SamplerProcess over the {kind} shard, batches of {BATCH}")
        rates[kind] = data_path(shards[kind].address, timing)
    for kind in ("raw", "zstd"):
        results.figure(
            f"pixels_data_path_{kind}",
            SECTION,
            f"learner data path, {kind} rows (batches of 256)",
            rates[kind],
            "batches/s",
            row_bytes=BATCH * RAW_ROW_BYTES,
            ceiling=rates["raw"].rate if kind == "zstd" else None,
            ceiling_name="raw rows",
            target=100 if kind == "zstd" else None,
            note="SamplerProcess.get + priorities back; sampling, decompression, slot copy in the child",
        )


def data_path(address: str, timing: Timing) -> Measurement:
    """Batches of 256 per second out of a SamplerProcess with the learner's default settings."""
    from apexrl.learner.config import LearnerConfig
    from apexrl.learner.sampler_process import SamplerProcess

    config = LearnerConfig(replay=(address,), batch_size=BATCH, seed=0, min_replay_size=1)
    sampler = SamplerProcess(
        config, slots=config.prefetch_depth + 1, batches_per_call=config.sample_batches_per_call
    ).start(lambda: 0.4)
    try:

        def step() -> None:
            batch = sampler.get(timeout=60)
            if batch is None:
                raise TimeoutError("no batch from the sampler process within 60 s")
            sampler.update_priorities(batch, np.ones(BATCH))

        child = sampler.pid
        started = time.perf_counter()
        m = with_cpu(child, measure_loop, step, timing.seconds, max(timing.warmup, 1.0))
        progress(f"  ({time.perf_counter() - started:.1f}s, {sampler.rows_rejected} rows rejected)")
        return m
    finally:
        sampler.close()

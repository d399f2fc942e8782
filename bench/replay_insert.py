"""Replay figures, part 1: SDK insert throughput over loopback gRPC, next to the raw gRPC ceiling.

`ReplayClient.insert` (the bidirectional Insert stream, `--insert-window` batches unacknowledged; small batches
that queue up behind an unanswered request travel merged, one request and usually one ack for several) loops on
one batch for the measured time, then `flush()` (its time counts); the note gives batches per request and per
ack. CartPole rows go
into the `--capacity` shard, Atari rows into the `--atari-capacity` one; batches of 64 and 256 rows, with
priorities.
Ceilings: a raw client stream of messages of exactly the InsertRequest's size, and a raw bidirectional stream
with a 16-byte answer per message and the same window (the shape of the Insert RPC).
"""

from __future__ import annotations

import numpy as np
from harness.ceiling import CeilingClient
from harness.processes import Child
from harness.report import progress
from harness.results import Results
from harness.timing import Measurement, Timing, measure_loop, with_cpu
from workloads import WORKLOADS, priorities, row_nbytes

SECTION = "gRPC insert (SDK, loopback)"
TARGETS = {  # transitions/s (the targets)
    ("cartpole", 256): 500_000,
    ("atari", 64): 5_000,
    ("atari", 256): 5_000,
}


def measure_inserts(
    results: Results,
    ceiling: CeilingClient,
    shards: dict[str, Child],
    timing: Timing,
    window: int,
    rng: np.random.Generator,
) -> None:
    """Every insert figure; the Atari shard is stopped afterwards to give its memory back."""
    for workload in ("cartpole", "atari"):
        for rows in (64, 256):
            measure_insert(results, ceiling, shards[workload], (workload, rows), timing, window, rng)
    shards["atari"].stop()


def insert_message_bytes(batch: dict[str, np.ndarray], pri: np.ndarray) -> int:
    """Size of the InsertRequest the SDK sends for this batch (writer id: a UUID's 32 hex digits)."""
    from apexrl.replay_server import wire

    request = wire.encode_insert(batch, pri, writer_id="0" * 32)
    request.sequence = 1 << 40
    return request.ByteSize()


def measure_insert(
    results: Results,
    ceiling: CeilingClient,
    shard: Child,
    shape: tuple[str, int],
    timing: Timing,
    window: int,
    rng: np.random.Generator,
) -> None:
    """The two ceilings of one batch shape, then the SDK's insert of it."""
    workload, rows = shape
    batch = WORKLOADS[workload](rows, rng)
    pri = priorities(rows, rng)
    msg_bytes = insert_message_bytes(batch, pri)
    label = f"{workload} x{rows}"
    progress(f"ceiling: client stream of {msg_bytes:,} B messages ({label} insert size)")
    stream = results.ceiling(
        f"ceiling_stream_{workload}_{rows}",
        f"client stream, {label} insert size",
        ceiling.client_stream(msg_bytes),
        "msgs/s",
        msg_bytes,
    )
    progress(f"ceiling: bidi stream with 16 B acks, window {window} ({label})")
    acked = results.ceiling(
        f"ceiling_acked_{workload}_{rows}",
        f"bidi stream + acks (window {window}), {label} insert size",
        ceiling.bidi(msg_bytes, 16, window),
        "msgs/s",
        msg_bytes,
    )
    progress(f"apexrl: ReplayClient.insert {label} (max_in_flight {window})")
    row_bytes = row_nbytes(batch)
    measurement, batches, requests, acks = sdk_insert(shard, batch, pri, timing, window)
    results.figure(
        f"grpc_insert_{workload}_{rows}",
        SECTION,
        f"insert {label} ({row_bytes:,} B/row)",
        measurement,
        "transitions/s",
        per_call=rows,
        row_bytes=row_bytes,
        ceiling=stream * rows,
        ceiling_name=f"client stream of {msg_bytes:,} B messages",
        target=TARGETS.get(shape),
        note=f"{msg_bytes:,} B per one-batch message; acked-window ceiling {acked * rows:,.0f} transitions/s; "
        f"{batches / max(1, requests):.1f} batches per request, {batches / max(1, acks):.1f} per ack",
    )


def sdk_insert(
    shard: Child, batch: dict[str, np.ndarray], pri: np.ndarray, timing: Timing, window: int
) -> tuple[Measurement, int, int, int]:
    """The measurement, and the batches, requests and acks of the whole run (warm-up included)."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    last = [0]  # the last batch's sequence number: batches are numbered 1, 2, ...

    with ReplayClient(shard.address, timeout=300, max_in_flight=window) as client:

        def insert() -> None:
            last[0] = client.insert(batch, pri)

        measurement = with_cpu(
            shard.pid, measure_loop, insert, timing.seconds, timing.warmup, finish=lambda: client.flush(300)
        )
        return measurement, last[0], client.requests_sent, client.acks_received

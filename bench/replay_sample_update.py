"""Replay figures, part 2: sampling and priority updates over gRPC on a FULL shard, next to the raw gRPC
ceiling.

The CartPole shard is first filled to capacity through the SDK (batches of 16,384 rows; the fill rate is
printed under the table); every key updated below is a live key from a real sample. Figures: `sample(256)`
blocking and with `--sample-window` futures in flight; `update_priorities(256)` blocking, with `--window`
futures in flight and over the StreamUpdatePriorities RPC (raw stub, `--window` unanswered); and a learner
thread's cycle (blocking sample, then an asynchronous update of the sampled keys). Ceilings: unary calls,
futures and a bidirectional stream of the same message sizes, taken from the real messages
(`apexrl.replay_server.wire`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from harness.ceiling import CeilingClient
from harness.processes import Child
from harness.report import progress
from harness.results import Results
from harness.timing import Timing, measure_bidi, measure_loop, measure_window, with_cpu
from workloads import FILL_BATCH, SAMPLE_BATCH, UPDATE_BATCH, cartpole_batch, priorities, row_nbytes

TARGET_UPDATE = 1_000  # update_priorities(256)/s on a full shard
# Issue 17: shares of the raw gRPC ceiling of the same call shape and message sizes, measured in the same run.
RATIO_SAMPLE = 0.85  # Sample, blocking
RATIO_SAMPLE_WINDOW = 0.6  # Sample, --sample-window in flight
RATIO_STREAM_UPDATE = 0.8  # StreamUpdatePriorities
# Issue 32, item 4: shares of the grpc.aio ceiling (the same bytes-only handlers on the shard's own runtime).
AIO_RATIOS = {
    "grpc_sample": ("aio_ceiling_unary_sample", 0.85),  # Sample, blocking
    "grpc_sample_window": ("aio_ceiling_unary_sample_window", 0.8),  # Sample, --sample-window in flight
    "grpc_update_stream": ("aio_ceiling_bidi_update", 0.8),  # StreamUpdatePriorities
}


def fill_shard(address: str, capacity: int, rng: np.random.Generator) -> float | None:
    """Insert CartPole rows through the SDK until the shard holds `capacity`; the rows/s, or None if it was
    already full."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    progress(f"filling the shard to {capacity:,} rows with batches of {FILL_BATCH:,}")
    batch = cartpole_batch(FILL_BATCH, rng)
    t0 = time.perf_counter()
    with ReplayClient(address, timeout=300) as client:
        inserted = 0
        size = client.info().size
        while size + inserted < capacity:
            client.insert(batch, priorities(FILL_BATCH, rng))
            inserted += FILL_BATCH
        client.flush(300)
        info = client.info()
    elapsed = time.perf_counter() - t0
    if info.size != capacity:
        raise RuntimeError(f"shard holds {info.size} rows after filling, expected {capacity}")
    if not inserted:
        progress(f"  already full: {info.size:,} rows")
        return None
    progress(f"  full: {info.size:,} rows ({inserted / elapsed:,.0f} rows/s while filling)")
    return inserted / elapsed


@dataclass
class FullShard:
    """A full shard's client and what its figures share: live keys from real samples and the sizes of the real
    messages (for the ceilings)."""

    client: object  # ReplayClient
    child: Child
    section: str
    incarnation: int
    row_bytes: int
    sample_bytes: int  # a SampleResponse of 256 CartPole rows
    request_bytes: int  # a SampleRequest (at least the 8 bytes the ceiling server reads)
    update_bytes: int  # an UpdatePrioritiesRequest of 256 keys
    batches: int  # 256-row batches per answer for the multi-batch figures
    multi_sample_bytes: int  # a SampleResponse of `batches` batches of 256 rows
    multi_request_bytes: int  # its SampleRequest
    key_pool: list[np.ndarray]
    pri_pool: list[np.ndarray]
    counter: int = 0

    def next_update(self) -> tuple[np.ndarray, np.ndarray]:
        self.counter += 1
        i = self.counter % len(self.key_pool)
        return self.key_pool[i], self.pri_pool[i]


def open_full_shard(shard: Child, rng: np.random.Generator, batches: int) -> FullShard:
    from apexrl.proto import replay_pb2
    from apexrl.replay_server import wire
    from apexrl.replay_server.client.replay_client import ReplayClient

    client = ReplayClient(shard.address, timeout=60)
    info = client.info()
    if info.size != info.capacity:
        client.close()
        raise RuntimeError(f"shard is not full: {info.size} of {info.capacity}")
    first = client.sample(SAMPLE_BATCH)
    multi = client.sample(SAMPLE_BATCH * batches, batch_rows=[SAMPLE_BATCH] * batches)
    if batches > 1 and multi.batch_rows != (SAMPLE_BATCH,) * batches:
        raise RuntimeError(f"the shard answered batch_rows {multi.batch_rows} to a request for {batches}")
    key_pool = [client.sample(SAMPLE_BATCH).keys for _ in range(16)]
    pri_pool = [priorities(UPDATE_BATCH, rng, np.float64) * 3 for _ in range(16)]
    return FullShard(
        client,
        shard,
        f"gRPC on a full {info.size:,}-row shard (CartPole rows)",
        first.incarnation,
        row_bytes=row_nbytes(first.columns),
        sample_bytes=wire.encode_sample(first).ByteSize(),
        request_bytes=max(8, replay_pb2.SampleRequest(batch_size=SAMPLE_BATCH).ByteSize()),
        update_bytes=wire.encode_update(key_pool[0], pri_pool[0], first.incarnation).ByteSize(),
        batches=batches,
        multi_sample_bytes=wire.encode_sample(multi).ByteSize(),
        multi_request_bytes=max(
            8,
            wire.encode_sample_request(
                SAMPLE_BATCH * batches, batch_rows=[SAMPLE_BATCH] * batches
            ).ByteSize(),
        ),
        key_pool=key_pool,
        pri_pool=pri_pool,
    )


def measure_full_shard(
    results: Results,
    ceiling: CeilingClient,
    shard: Child,
    timing: Timing,
    window: int,
    sample_window: int,
    rng: np.random.Generator,
    sample_batches: int = 4,
    aio_ceiling: CeilingClient | None = None,
) -> None:
    full = open_full_shard(shard, rng, sample_batches)
    try:
        measure_samples(results, ceiling, full, timing, sample_window)
        measure_multi_samples(results, ceiling, full, timing, sample_window)
        measure_updates(results, ceiling, full, timing, window)
        measure_update_stream(results, ceiling, full, timing, window)
        measure_cycle(results, full, timing, window)
        if aio_ceiling is not None:
            measure_aio_ceilings(results, aio_ceiling, full, sample_window, window)
        info = full.client.info()
        if info.size != info.capacity:
            raise RuntimeError("the shard stopped being full during the measurements")
    finally:
        full.client.close()


def measure_aio_ceilings(
    results: Results, aio_ceiling: CeilingClient, full: FullShard, sample_window: int, window: int
) -> None:
    """The targets' call shapes against the same bytes-only handlers on grpc.aio, the shard's runtime: how much of
    a gap to the (thread-pool) ceiling is the runtime's, not apexrl's. Each of the three figures is then compared
    with its grpc.aio ceiling too (issue 32, item 4: `aio_ratio` against `aio_target` in its row)."""
    size = full.sample_bytes
    progress("ceiling on grpc.aio: the sample and stream shapes again")
    results.ceiling(
        "aio_ceiling_unary_sample",
        f"grpc.aio server: unary, {size:,} B answer",
        aio_ceiling.unary(full.request_bytes, size),
        "calls/s",
        size,
    )
    results.ceiling(
        "aio_ceiling_unary_sample_window",
        f"grpc.aio server: unary futures (window {sample_window}), {size:,} B answer",
        aio_ceiling.unary_window(full.request_bytes, size, sample_window),
        "calls/s",
        size,
    )
    results.ceiling(
        "aio_ceiling_bidi_update",
        f"grpc.aio server: bidi stream (window {window}), {full.update_bytes:,} B messages",
        aio_ceiling.bidi(full.update_bytes, 8, window),
        "msgs/s",
        full.update_bytes,
    )
    for key, (ceiling_key, target) in AIO_RATIOS.items():
        if key in results.by_key:
            results.by_key[key].compare_aio(ceiling_key, results.by_key[ceiling_key], target)


def measure_samples(
    results: Results, ceiling: CeilingClient, full: FullShard, timing: Timing, sample_window: int
) -> None:
    client, t, size = full.client, timing, full.sample_bytes
    mb = SAMPLE_BATCH * full.row_bytes
    progress(f"ceiling: blocking unary, {full.request_bytes} B request -> {size:,} B answer")
    c = results.ceiling(
        "ceiling_unary_sample",
        f"unary, {size:,} B answer (sample size)",
        ceiling.unary(full.request_bytes, size),
        "calls/s",
        size,
    )
    progress("apexrl: ReplayClient.sample(256), blocking")
    m = with_cpu(full.child.pid, measure_loop, lambda: client.sample(SAMPLE_BATCH), t.seconds, t.warmup)
    results.figure(
        "grpc_sample",
        full.section,
        "sample(256), blocking",
        m,
        "calls/s",
        row_bytes=mb,
        ceiling=c,
        ceiling_name="blocking unary, same answer size",
        ratio_target=RATIO_SAMPLE,
        note=f"answer {size:,} B, decoded to numpy",
    )

    progress(f"ceiling: unary futures, window {sample_window}, {size:,} B answer")
    c = results.ceiling(
        "ceiling_unary_sample_window",
        f"unary futures (window {sample_window}), {size:,} B answer",
        ceiling.unary_window(full.request_bytes, size, sample_window),
        "calls/s",
        size,
    )
    progress(f"apexrl: ReplayClient.sample_future(256), window {sample_window}")
    m = with_cpu(
        full.child.pid,
        measure_window,
        lambda: client.sample_future(SAMPLE_BATCH),
        lambda f: f.result(),
        sample_window,
        t.seconds,
        t.warmup,
    )
    results.figure(
        "grpc_sample_window",
        full.section,
        f"sample(256), {sample_window} in flight",
        m,
        "calls/s",
        row_bytes=mb,
        ceiling=c,
        ceiling_name="unary futures, same window and answer size",
        ratio_target=RATIO_SAMPLE_WINDOW,
    )


def measure_multi_samples(
    results: Results, ceiling: CeilingClient, full: FullShard, timing: Timing, sample_window: int
) -> None:
    """`batches` 256-row batches per Sample answer (SampleRequest.batch_rows), in batches/s. The ceiling is the
    raw unary call with an answer of exactly that answer's size, in the same pattern, times `batches`: the ratio
    compares messages of the same size, so batching earns nothing against it by itself."""
    client, t, n = full.client, timing, full.batches
    size, request = full.multi_sample_bytes, full.multi_request_bytes
    rows, batch_rows = SAMPLE_BATCH * n, [SAMPLE_BATCH] * n
    one_batch = (
        results.by_key["ceiling_unary_sample"].value,
        results.by_key["ceiling_unary_sample_window"].value,
    )
    for window, key, name, target in (
        (1, "grpc_sample_multi", "blocking", RATIO_SAMPLE),
        (sample_window, "grpc_sample_multi_window", f"{sample_window} in flight", RATIO_SAMPLE_WINDOW),
    ):
        shape = "blocking unary" if window == 1 else f"unary futures (window {window})"
        progress(f"ceiling: {shape}, {request} B request -> {size:,} B answer")
        measured = (
            ceiling.unary(request, size) if window == 1 else ceiling.unary_window(request, size, window)
        )
        c = results.ceiling(
            f"ceiling_{key}", f"{shape}, {size:,} B answer ({n} x 256 rows)", measured, "calls/s", size
        )
        progress(f"apexrl: ReplayClient.sample({n} x 256 per answer), {name}")
        if window == 1:
            m = with_cpu(
                full.child.pid,
                measure_loop,
                lambda: client.sample(rows, batch_rows=batch_rows),
                t.seconds,
                t.warmup,
            )
        else:
            m = with_cpu(
                full.child.pid,
                measure_window,
                lambda: client.sample_future(rows, batch_rows=batch_rows),
                lambda f: f.result(),
                window,
                t.seconds,
                t.warmup,
            )
        value = m.rate * n
        versus = value / one_batch[0 if window == 1 else 1]
        results.figure(
            key,
            full.section,
            f"sample({n} x 256 per answer), {name}",
            m,
            "batches/s",
            per_call=n,
            row_bytes=SAMPLE_BATCH * full.row_bytes,
            ceiling=c * n,
            ceiling_name=f"{shape}, same answer size, x {n} batches per call",
            ratio_target=target,
            note=f"answer {size:,} B; {versus:.2f}x the one-batch ceiling's batches/s",
        )


def measure_updates(
    results: Results, ceiling: CeilingClient, full: FullShard, timing: Timing, window: int
) -> None:
    client, t, size = full.client, timing, full.update_bytes
    progress(f"ceiling: blocking unary, {size:,} B request -> 8 B answer")
    c = results.ceiling(
        "ceiling_unary_update",
        f"unary, {size:,} B request (update size)",
        ceiling.unary(size, 8),
        "calls/s",
        size,
    )
    progress("apexrl: ReplayClient.update_priorities(256), blocking")

    def update_blocking() -> None:
        keys, pri = full.next_update()
        client.update_priorities(keys, pri, incarnation=full.incarnation)

    m = with_cpu(full.child.pid, measure_loop, update_blocking, t.seconds, t.warmup)
    results.figure(
        "grpc_update",
        full.section,
        "update_priorities(256), blocking",
        m,
        "calls/s",
        ceiling=c,
        ceiling_name="blocking unary, same request size",
        target=TARGET_UPDATE,
        note=f"request {size:,} B",
    )

    progress(f"ceiling: unary futures, window {window}, {size:,} B request")
    c = results.ceiling(
        "ceiling_unary_update_window",
        f"unary futures (window {window}), {size:,} B request",
        ceiling.unary_window(size, 8, window),
        "calls/s",
        size,
    )
    progress(f"apexrl: ReplayClient.update_priorities_future(256), window {window}")

    def update_start():
        keys, pri = full.next_update()
        return client.update_priorities_future(keys, pri, incarnation=full.incarnation)

    m = with_cpu(
        full.child.pid, measure_window, update_start, lambda f: f.result(), window, t.seconds, t.warmup
    )
    results.figure(
        "grpc_update_window",
        full.section,
        f"update_priorities_future(256), {window} in flight",
        m,
        "calls/s",
        ceiling=c,
        ceiling_name="unary futures, same window and request size",
        target=TARGET_UPDATE,
    )


def measure_update_stream(
    results: Results, ceiling: CeilingClient, full: FullShard, timing: Timing, window: int
) -> None:
    """StreamUpdatePriorities through the raw stub, one answer per message, at most `window` unanswered."""
    from apexrl.common import grpc_util
    from apexrl.proto import replay_pb2_grpc
    from apexrl.replay_server import wire

    size = full.update_bytes
    progress(f"ceiling: bidi stream, window {window}, {size:,} B messages, 8 B answers")
    c = results.ceiling(
        "ceiling_stream_update",
        f"bidi stream (window {window}), {size:,} B messages",
        ceiling.bidi(size, 8, window),
        "msgs/s",
        size,
    )
    progress(f"apexrl: StreamUpdatePriorities (raw stub), window {window}")
    channel = grpc_util.make_channel(full.child.address)  # the SDK's channel options
    stub = replay_pb2_grpc.ReplayServiceStub(channel)

    def message():
        keys, pri = full.next_update()
        return wire.encode_update(keys, pri, full.incarnation)

    try:
        m = with_cpu(
            full.child.pid,
            measure_bidi,
            lambda it: stub.StreamUpdatePriorities(it, timeout=600),
            message,
            window,
            timing.seconds,
            timing.warmup,
        )
    finally:
        channel.close()
    results.figure(
        "grpc_update_stream",
        full.section,
        f"StreamUpdatePriorities(256), {window} in flight",
        m,
        "msgs/s",
        ceiling=c,
        ceiling_name="bidi stream, same window and message size",
        ratio_target=RATIO_STREAM_UPDATE,
    )


def measure_cycle(results: Results, full: FullShard, timing: Timing, window: int) -> None:
    """One learner thread's work per step: blocking sample(256), then an asynchronous update of its keys."""
    progress(f"apexrl: cycle sample(256) + update_priorities_future(256), {window} updates in flight")
    client = full.client
    in_flight: deque = deque()

    def cycle() -> None:
        batch = client.sample(SAMPLE_BATCH)
        if len(in_flight) >= window:
            in_flight.popleft().result()
        _, pri = full.next_update()
        in_flight.append(client.update_priorities_future(batch.keys, pri, incarnation=batch.incarnation))

    def drain() -> None:
        while in_flight:
            in_flight.popleft().result()

    m = with_cpu(full.child.pid, measure_loop, cycle, timing.seconds, timing.warmup, drain)
    results.figure(
        "grpc_cycle",
        full.section,
        "cycle: sample(256) + async update(256)",
        m,
        "cycles/s",
        note="what one learner thread does per train step",
    )

#!/usr/bin/env python
"""Replay shard benchmark: apexrl over loopback gRPC, in-process, next to the raw gRPC ceiling (and cpprb).

One run measures, each figure for `--seconds` after a short warm-up:

  1. SDK insert throughput (ReplayClient.insert, streamed with acks) into a shard running in another process:
     CartPole-size rows (obs float32[4], action int64, reward float32, discount float32, next_obs float32[4])
     and Atari-size rows (obs and next_obs uint8[84,84,4]), batches of 64 and 256 rows with priorities.
  2. On a FULL shard (`--capacity` rows, 1,000,000 by default, CartPole-size): sample(256)/s blocking and
     pipelined (sample_future), update_priorities(256)/s blocking, pipelined (update_priorities_future with
     `--window` calls in flight) and over the StreamUpdatePriorities RPC (raw stub, `--window` in flight),
     and a learner-like cycle (blocking sample + asynchronous update).
  3. The same operations in-process on SumTree and ReplayTable (no gRPC, no codec).
  4. The raw gRPC ceiling, measured in the same run against a trivial bytes-in/bytes-out server defined below
     (generic handlers, no protobuf, run in its own process): client streams of messages of exactly the byte size
     of each insert request, unary calls whose answer is the size of a sample(256) answer, unary and streamed
     calls the size of an update(256) request. Every apexrl figure is printed next to its ceiling as a ratio.
  5. With `--cpprb`: cpprb's PrioritizedReplayBuffer sample(256)+update(256) cycle at the same capacity, run
     by `--cpprb-python` (an interpreter where `import cpprb` works; cpprb is never required).

Servers (the replay shard through `python -m apexrl.launcher replay`, and the ceiling server) run in separate
processes, so the client and the server do not share a GIL. Progress goes to stderr, the table to stdout, and
`--json PATH` writes every figure as JSON. `--quick` runs small sizes for a smoke test (~20 s).

    /work/venv/bin/python bench/replay_bench.py --json /tmp/replay_bench.json
    /work/venv/bin/python bench/replay_bench.py --quick
    /work/venv/bin/python bench/replay_bench.py --cpprb --cpprb-python /tmp/benchvenv/bin/python

Only numpy is imported at module level, so the cpprb worker (`_cpprb` mode) runs in any venv with numpy+cpprb.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

_T0 = time.perf_counter()
ECHO_SERVICE = "apexrl.bench.Echo"
CEILING_SECTION = "raw gRPC ceilings (bytes-only server, same message sizes)"
FOOTER = """\
ceiling: the raw gRPC figure for the same call shape and message size, measured in this run against a bytes-only
  server in its own process, in the unit of the figure; ratio = value / ceiling (in-process cycle: value / cpprb).
MB/s: row payload (1 MB = 1e6 B); message bytes for the ceilings.
cores: CPU used by the client process + the server process during the figure (1.00 = one core busy).
CPU us/call: those CPU seconds per call (per batch or message for streams) in each process. Other processes'
  load lowers the rates much more than these (a VM's stolen time still inflates them); 1e6 / the larger of the
  two roughly bounds the rate on an idle machine."""
SAMPLE_BATCH = 256
UPDATE_BATCH = 256
FILL_BATCH = 16384

# Targets of the issue (value, unit they apply to).
TARGET_CARTPOLE_INSERT = 500_000  # transitions/s, batches of 256
TARGET_ATARI_INSERT = 5_000  # transitions/s
TARGET_SAMPLE = 500  # sample(256)/s on a full shard
TARGET_UPDATE = 1_000  # update_priorities(256)/s on a full shard


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------------- workloads


def cartpole_batch(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((rows, 4), dtype=np.float32),
        "action": rng.integers(0, 2, rows).astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.99**3, dtype=np.float32),
        "next_obs": rng.standard_normal((rows, 4), dtype=np.float32),
    }


def atari_batch(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.integers(0, 256, (rows, 84, 84, 4), dtype=np.uint8),
        "action": rng.integers(0, 18, rows).astype(np.int64),
        "reward": np.ones(rows, dtype=np.float32),
        "discount": np.full(rows, 0.99**3, dtype=np.float32),
        "next_obs": rng.integers(0, 256, (rows, 84, 84, 4), dtype=np.uint8),
    }


WORKLOADS = {"cartpole": cartpole_batch, "atari": atari_batch}


def row_nbytes(batch: dict[str, np.ndarray]) -> int:
    rows = len(next(iter(batch.values())))
    return sum(a.nbytes for a in batch.values()) // rows


def priorities(rows: int, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
    return (rng.random(rows) + 0.01).astype(dtype)


# ------------------------------------------------------------------------------------------ measurement loops


def measure_loop(
    step: Callable[[], object], seconds: float, warmup: float, finish: Callable[[], object] | None = None
) -> tuple[int, float]:
    """Call step() for `warmup` seconds (at least once), then count calls for `seconds`; `finish` (e.g. waiting
    for acks or in-flight calls) runs after each phase and its time counts. Returns (calls, elapsed seconds)."""
    deadline = time.perf_counter() + warmup
    step()
    while time.perf_counter() < deadline:
        step()
    if finish is not None:
        finish()
    calls = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        step()
        calls += 1
        if time.perf_counter() >= deadline:
            break
    if finish is not None:
        finish()
    return calls, time.perf_counter() - t0


def measure_window(
    start: Callable[[], object], wait: Callable[[object], object], window: int, seconds: float, warmup: float
) -> tuple[int, float]:
    """Keep up to `window` asynchronous calls in flight; a call counts once started, and all are awaited."""
    in_flight: deque = deque()

    def step() -> None:
        if len(in_flight) >= window:
            wait(in_flight.popleft())
        in_flight.append(start())

    def finish() -> None:
        while in_flight:
            wait(in_flight.popleft())

    return measure_loop(step, seconds, warmup, finish)


def measure_bidi(
    call: Callable, make_message: Callable[[], object], window: int, seconds: float, warmup: float
) -> tuple[int, float]:
    """One bidirectional stream, one response per request, at most `window` requests unanswered.
    Returns (responses in the timed phase, its duration)."""
    credits = threading.Semaphore(window)
    stop = threading.Event()

    def requests():
        while True:
            credits.acquire()
            if stop.is_set():
                return
            yield make_message()

    responses = call(requests())
    try:
        deadline = time.perf_counter() + warmup
        for _ in responses:
            credits.release()
            if time.perf_counter() >= deadline:
                break
        count = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        for _ in responses:
            credits.release()
            count += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        credits.release()
    for _ in responses:  # drain: the request generator sees `stop` and half-closes the stream
        credits.release()
    return count, elapsed


def measure_client_stream(call: Callable, message: bytes, seconds: float, warmup: float) -> tuple[int, float]:
    """Client streaming with no per-message answer: the echo server counts messages and bytes."""

    def stream(duration: float) -> tuple[int, float]:
        sent = 0

        def requests():
            nonlocal sent
            deadline = time.perf_counter() + duration
            while True:
                yield message
                sent += 1
                if time.perf_counter() >= deadline:
                    return

        t0 = time.perf_counter()
        reply = call(requests())
        elapsed = time.perf_counter() - t0
        received, nbytes = struct.unpack("<QQ", reply)
        if received != sent or nbytes != sent * len(message):
            raise RuntimeError(
                f"echo server counted {received} messages / {nbytes} bytes, client sent {sent}"
            )
        return received, elapsed

    stream(warmup)
    return stream(seconds)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------ result rows


@dataclass
class Row:
    section: str
    name: str
    value: float  # the figure, in `unit`
    unit: str
    mb_per_s: float | None = None  # payload (row data) MB/s, 1 MB = 1e6 bytes
    ceiling: float | None = None  # the raw gRPC figure of the same shape and message size, in `unit`
    ceiling_name: str | None = None
    ratio: float | None = None  # value / ceiling
    target: float | None = None
    target_text: str | None = None
    met: bool | None = None
    calls: int = 0
    seconds: float = 0.0
    client_cpu: float | None = None  # cores used by this (client) process during the figure, warm-up included
    server_cpu: float | None = None  # cores used by the server process during the figure
    note: str = ""


class Results:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.by_key: dict[str, Row] = {}

    def add(self, key: str, row: Row) -> Row:
        if row.ceiling:
            row.ratio = row.value / row.ceiling
        if row.target is not None:
            row.met = row.value >= row.target
        self.rows.append(row)
        self.by_key[key] = row
        extra = f", {row.mb_per_s:,.1f} MB/s" if row.mb_per_s is not None else ""
        ratio = f", {row.ratio:.2f} of ceiling" if row.ratio is not None else ""
        progress(f"  {row.name}: {row.value:,.0f} {row.unit}{extra}{ratio}")
        return row


# -------------------------------------------------------------------------------------------- child processes


class Child:
    """A server process we started: waits for its port file; stopped with SIGTERM (then SIGKILL) by its pid."""

    def __init__(self, name: str, argv: list[str], workdir: str) -> None:
        self.name = name
        self.port_file = os.path.join(workdir, f"{name}.port")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the child runs)
        self.proc = subprocess.Popen(
            [*argv, "--port-file", self.port_file], stdout=self._log, stderr=subprocess.STDOUT
        )
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.wait_ready()}"

    def wait_ready(self, timeout: float = 60.0) -> int:
        if self.port is not None:
            return self.port
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    return self.port
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not write its port within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_shard(name: str, capacity: int, workdir: str) -> Child:
    return Child(
        name,
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "--log-level",
            "WARNING",
            "replay",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--capacity",
            str(capacity),
            "--seed",
            "0",
        ],
        workdir,
    )


def start_echo(workdir: str) -> Child:
    return Child("echo", [sys.executable, os.path.abspath(__file__), "_echo-server"], workdir)


# --------------------------------------------------------------------------------------------- ceiling server


def echo_server_main(argv: list[str]) -> int:
    """The raw gRPC ceiling: bytes in, bytes out, no protobuf, same server options as a replay shard."""
    import grpc

    from apexrl.common import grpc_util

    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args(argv)

    replies: dict[int, bytes] = {}

    def sized_reply(request: bytes) -> bytes:
        size = struct.unpack_from("<Q", request)[0]
        reply = replies.get(size)
        if reply is None:
            reply = replies[size] = bytes(size)
        return reply

    def count(request_iterator, context) -> bytes:  # client stream: count messages and bytes
        n = nbytes = 0
        for request in request_iterator:
            n += 1
            nbytes += len(request)
        return struct.pack("<QQ", n, nbytes)

    def acked(request_iterator, context):  # bidi stream: one answer per message, its size set by the message
        for request in request_iterator:
            yield sized_reply(request)

    def unary(request: bytes, context) -> bytes:
        return sized_reply(request)

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "Count": grpc.stream_unary_rpc_method_handler(count),
            "Acked": grpc.stream_stream_rpc_method_handler(acked),
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
        },
    )
    from apexrl.common.files import atomic_write

    server = grpc_util.create_server()
    server.add_generic_rpc_handlers((handler,))
    port = grpc_util.bind(server, "127.0.0.1:0")
    server.start()
    atomic_write(args.port_file, f"{port}\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop(1).wait()
    return 0


def sized_request(request_bytes: int, reply_bytes: int) -> bytes:
    """A ceiling request of `request_bytes` (>= 8) whose first 8 bytes ask for a reply of `reply_bytes`."""
    return struct.pack("<Q", reply_bytes) + bytes(max(0, request_bytes - 8))


class Echo:
    def __init__(self, address: str) -> None:
        from apexrl.common import grpc_util

        self.channel = grpc_util.make_channel(address)
        self.count = self.channel.stream_unary(f"/{ECHO_SERVICE}/Count")
        self.acked = self.channel.stream_stream(f"/{ECHO_SERVICE}/Acked")
        self.unary = self.channel.unary_unary(f"/{ECHO_SERVICE}/Unary")

    def close(self) -> None:
        self.channel.close()


# ---------------------------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results = Results()
        self.echo_pid: int | None = None
        self.shard_pid: int | None = None
        self.cpu: tuple[float | None, float | None] = (None, None)
        self.ceilings: dict[str, tuple[float, str]] = {}  # key -> (messages or calls per second, description)
        self.rng = np.random.default_rng(0)

    # -- helpers
    def m(self, server_pid: int | None, measure: Callable, *args, **kwargs):
        """Run one measurement and note the CPU (in cores) this process and the server used meanwhile."""
        t0, c0 = time.perf_counter(), time.process_time()
        s0 = process_cpu_seconds(server_pid) if server_pid else 0.0
        out = measure(*args, **kwargs)
        wall = time.perf_counter() - t0
        server = (process_cpu_seconds(server_pid) - s0) / wall if server_pid else None
        self.cpu = ((time.process_time() - c0) / wall, server)
        return out

    def add(self, key: str, row: Row) -> Row:
        row.client_cpu, row.server_cpu = self.cpu
        self.cpu = (None, None)
        return self.results.add(key, row)

    def ceiling_row(
        self, key: str, name: str, calls: int, elapsed: float, unit: str, msg_bytes: int
    ) -> float:
        rate = calls / elapsed
        self.ceilings[key] = (rate, name)
        self.add(
            key,
            Row(
                CEILING_SECTION,
                name,
                rate,
                unit,
                mb_per_s=rate * msg_bytes / 1e6,
                calls=calls,
                seconds=elapsed,
                note=f"message {msg_bytes:,} B",
            ),
        )
        return rate

    def s(self) -> tuple[float, float]:
        return self.args.seconds, self.args.warmup

    # -- 1: inserts over gRPC
    def grpc_inserts(self, echo: Echo, shards: dict[str, Child]) -> None:
        from apexrl.actor import ReplayClient
        from apexrl.common import codec
        from apexrl.proto import replay_pb2

        seconds, warmup = self.s()
        for workload in ("cartpole", "atari"):
            address = shards[workload].address
            self.shard_pid = shards[workload].proc.pid
            for rows in (64, 256):
                batch = WORKLOADS[workload](rows, self.rng)
                pri = priorities(rows, self.rng)
                request = replay_pb2.InsertRequest(writer_id="0" * 32, sequence=1 << 40)
                codec.encode_batch(batch, request.batch)
                codec.encode_tensor(pri, request.priorities)
                msg_bytes = request.ByteSize()
                row_bytes = row_nbytes(batch)
                label = f"{workload} x{rows}"

                progress(f"ceiling: client stream of {msg_bytes:,} B messages ({label} insert size)")
                message = sized_request(msg_bytes, 0)
                calls, elapsed = self.m(
                    self.echo_pid, measure_client_stream, echo.count, message, seconds, warmup
                )
                ceiling = self.ceiling_row(
                    f"ceiling_stream_{workload}_{rows}",
                    f"client stream, {label} insert size",
                    calls,
                    elapsed,
                    "msgs/s",
                    msg_bytes,
                )
                progress(f"ceiling: bidi stream with 16 B acks, window {self.args.insert_window} ({label})")
                ack_message = sized_request(msg_bytes, 16)
                calls, elapsed = self.m(
                    self.echo_pid,
                    measure_bidi,
                    echo.acked,
                    lambda m=ack_message: m,
                    self.args.insert_window,
                    seconds,
                    warmup,
                )
                self.ceiling_row(
                    f"ceiling_acked_{workload}_{rows}",
                    f"bidi stream + acks (window {self.args.insert_window}), {label} insert size",
                    calls,
                    elapsed,
                    "msgs/s",
                    msg_bytes,
                )

                progress(f"apexrl: ReplayClient.insert {label} (max_in_flight {self.args.insert_window})")
                with ReplayClient(address, timeout=300, max_in_flight=self.args.insert_window) as client:
                    calls, elapsed = self.m(
                        self.shard_pid,
                        measure_loop,
                        lambda c=client, b=batch, p=pri: c.insert(b, p),
                        seconds,
                        warmup,
                        finish=lambda c=client: c.flush(300),
                    )
                rate = calls * rows / elapsed
                if workload == "cartpole":
                    target = TARGET_CARTPOLE_INSERT if rows == 256 else None
                else:
                    target = TARGET_ATARI_INSERT
                self.add(
                    f"grpc_insert_{workload}_{rows}",
                    Row(
                        "gRPC insert (SDK, loopback)",
                        f"insert {label} ({row_bytes:,} B/row)",
                        rate,
                        "transitions/s",
                        mb_per_s=rate * row_bytes / 1e6,
                        ceiling=ceiling * rows,
                        ceiling_name=f"client stream of {msg_bytes:,} B messages",
                        target=target,
                        target_text=None if target is None else f">= {target:,}",
                        calls=calls,
                        seconds=elapsed,
                        note=f"{msg_bytes:,} B per message; acked-window ceiling "
                        f"{self.ceilings[f'ceiling_acked_{workload}_{rows}'][0] * rows:,.0f} transitions/s",
                    ),
                )
            if workload == "atari":
                shards["atari"].stop()  # give its memory back before the full-shard figures

    # -- 2: the full shard over gRPC
    def fill(self, address: str, capacity: int) -> None:
        from apexrl.actor import ReplayClient

        progress(f"filling the shard to {capacity:,} rows with batches of {FILL_BATCH:,}")
        batch = cartpole_batch(FILL_BATCH, self.rng)
        t0 = time.perf_counter()
        with ReplayClient(address, timeout=300) as client:
            info = client.info()
            inserted = 0
            while info.size + inserted < capacity:
                client.insert(batch, priorities(FILL_BATCH, self.rng))
                inserted += FILL_BATCH
            client.flush(300)
            info = client.info()
        elapsed = time.perf_counter() - t0
        if info.size != capacity:
            raise RuntimeError(f"shard holds {info.size} rows after filling, expected {capacity}")
        if inserted:
            self.fill_rate = inserted / elapsed
            progress(f"  full: {info.size:,} rows ({self.fill_rate:,.0f} rows/s while filling)")
        else:
            progress(f"  already full: {info.size:,} rows")

    def grpc_full_shard(self, echo: Echo, shard: Child) -> None:
        from apexrl.actor import ReplayClient
        from apexrl.common import codec
        from apexrl.proto import replay_pb2, replay_pb2_grpc
        from apexrl.replay_server.wire import encode_update

        seconds, warmup = self.s()
        window = self.args.window
        sample_window = self.args.sample_window
        address = shard.address
        self.shard_pid = shard.proc.pid
        client = ReplayClient(address, timeout=60)
        try:
            info = client.info()
            section = f"gRPC on a full {info.size:,}-row shard (CartPole rows)"
            if info.size != info.capacity:
                raise RuntimeError(f"shard is not full: {info.size} of {info.capacity}")

            # Message sizes of the real calls, for the ceilings.
            first = client.sample(SAMPLE_BATCH)
            sample_response = replay_pb2.SampleResponse(
                total_priority=first.total_priority,
                size=first.size,
                min_priority=first.min_priority,
                incarnation=first.incarnation,
            )
            codec.encode_tensor(first.keys, sample_response.keys)
            codec.encode_tensor(first.priorities, sample_response.priorities)
            codec.encode_batch(first.columns, sample_response.batch)
            sample_bytes = sample_response.ByteSize()
            request_bytes = max(8, replay_pb2.SampleRequest(batch_size=SAMPLE_BATCH).ByteSize())
            key_pool = [client.sample(SAMPLE_BATCH).keys for _ in range(16)]
            pri_pool = [priorities(UPDATE_BATCH, self.rng, np.float64) * 3 for _ in range(16)]
            update_bytes = encode_update(key_pool[0], pri_pool[0], first.incarnation).ByteSize()
            row_bytes = row_nbytes(first.columns)
            counter = [0]

            def next_update() -> tuple[np.ndarray, np.ndarray]:
                counter[0] += 1
                i = counter[0] % len(key_pool)
                return key_pool[i], pri_pool[i]

            # sample, blocking
            progress(f"ceiling: blocking unary, {request_bytes} B request -> {sample_bytes:,} B answer")
            message = sized_request(request_bytes, sample_bytes)
            calls, elapsed = self.m(self.echo_pid, measure_loop, lambda: echo.unary(message), seconds, warmup)
            c_sample = self.ceiling_row(
                "ceiling_unary_sample",
                f"unary, {sample_bytes:,} B answer (sample size)",
                calls,
                elapsed,
                "calls/s",
                sample_bytes,
            )
            progress("apexrl: ReplayClient.sample(256), blocking")
            calls, elapsed = self.m(
                self.shard_pid, measure_loop, lambda: client.sample(SAMPLE_BATCH), seconds, warmup
            )
            rate = calls / elapsed
            self.add(
                "grpc_sample",
                Row(
                    section,
                    "sample(256), blocking",
                    rate,
                    "calls/s",
                    mb_per_s=rate * SAMPLE_BATCH * row_bytes / 1e6,
                    ceiling=c_sample,
                    ceiling_name="blocking unary, same answer size",
                    target=TARGET_SAMPLE,
                    target_text=f">= {TARGET_SAMPLE:,}",
                    calls=calls,
                    seconds=elapsed,
                    note=f"answer {sample_bytes:,} B, decoded to numpy",
                ),
            )

            # sample, pipelined
            progress(f"ceiling: unary futures, window {sample_window}, {sample_bytes:,} B answer")
            calls, elapsed = self.m(
                self.echo_pid,
                measure_window,
                lambda: echo.unary.future(message),
                lambda f: f.result(),
                sample_window,
                seconds,
                warmup,
            )
            c_sample_w = self.ceiling_row(
                "ceiling_unary_sample_window",
                f"unary futures (window {sample_window}), {sample_bytes:,} B answer",
                calls,
                elapsed,
                "calls/s",
                sample_bytes,
            )
            progress(f"apexrl: ReplayClient.sample_future(256), window {sample_window}")
            calls, elapsed = self.m(
                self.shard_pid,
                measure_window,
                lambda: client.sample_future(SAMPLE_BATCH),
                lambda f: f.result(),
                sample_window,
                seconds,
                warmup,
            )
            rate = calls / elapsed
            self.add(
                "grpc_sample_window",
                Row(
                    section,
                    f"sample(256), {sample_window} in flight",
                    rate,
                    "calls/s",
                    mb_per_s=rate * SAMPLE_BATCH * row_bytes / 1e6,
                    ceiling=c_sample_w,
                    ceiling_name="unary futures, same window and answer size",
                    target=TARGET_SAMPLE,
                    target_text=f">= {TARGET_SAMPLE:,}",
                    calls=calls,
                    seconds=elapsed,
                ),
            )

            # update, blocking
            progress(f"ceiling: blocking unary, {update_bytes:,} B request -> 8 B answer")
            umessage = sized_request(update_bytes, 8)
            calls, elapsed = self.m(
                self.echo_pid, measure_loop, lambda: echo.unary(umessage), seconds, warmup
            )
            c_update = self.ceiling_row(
                "ceiling_unary_update",
                f"unary, {update_bytes:,} B request (update size)",
                calls,
                elapsed,
                "calls/s",
                update_bytes,
            )
            progress("apexrl: ReplayClient.update_priorities(256), blocking")

            def update_blocking() -> None:
                keys, pri = next_update()
                client.update_priorities(keys, pri, incarnation=first.incarnation)

            calls, elapsed = self.m(self.shard_pid, measure_loop, update_blocking, seconds, warmup)
            self.add(
                "grpc_update",
                Row(
                    section,
                    "update_priorities(256), blocking",
                    calls / elapsed,
                    "calls/s",
                    ceiling=c_update,
                    ceiling_name="blocking unary, same request size",
                    target=TARGET_UPDATE,
                    target_text=f">= {TARGET_UPDATE:,}",
                    calls=calls,
                    seconds=elapsed,
                    note=f"request {update_bytes:,} B",
                ),
            )

            # update, pipelined futures
            progress(f"ceiling: unary futures, window {window}, {update_bytes:,} B request")
            calls, elapsed = self.m(
                self.echo_pid,
                measure_window,
                lambda: echo.unary.future(umessage),
                lambda f: f.result(),
                window,
                seconds,
                warmup,
            )
            c_update_w = self.ceiling_row(
                "ceiling_unary_update_window",
                f"unary futures (window {window}), {update_bytes:,} B request",
                calls,
                elapsed,
                "calls/s",
                update_bytes,
            )
            progress(f"apexrl: ReplayClient.update_priorities_future(256), window {window}")

            def update_start():
                keys, pri = next_update()
                return client.update_priorities_future(keys, pri, incarnation=first.incarnation)

            calls, elapsed = self.m(
                self.shard_pid, measure_window, update_start, lambda f: f.result(), window, seconds, warmup
            )
            self.add(
                "grpc_update_window",
                Row(
                    section,
                    f"update_priorities_future(256), {window} in flight",
                    calls / elapsed,
                    "calls/s",
                    ceiling=c_update_w,
                    ceiling_name="unary futures, same window and request size",
                    target=TARGET_UPDATE,
                    target_text=f">= {TARGET_UPDATE:,}",
                    calls=calls,
                    seconds=elapsed,
                ),
            )

            # update, StreamUpdatePriorities
            progress(f"ceiling: bidi stream, window {window}, {update_bytes:,} B messages, 8 B answers")
            calls, elapsed = self.m(
                self.echo_pid, measure_bidi, echo.acked, lambda: umessage, window, seconds, warmup
            )
            c_update_s = self.ceiling_row(
                "ceiling_stream_update",
                f"bidi stream (window {window}), {update_bytes:,} B messages",
                calls,
                elapsed,
                "msgs/s",
                update_bytes,
            )
            progress(f"apexrl: StreamUpdatePriorities (raw stub), window {window}")
            stub = replay_pb2_grpc.ReplayServiceStub(client._channel)

            def stream_message():
                keys, pri = next_update()
                return encode_update(keys, pri, first.incarnation)

            calls, elapsed = self.m(
                self.shard_pid,
                measure_bidi,
                lambda it: stub.StreamUpdatePriorities(it, timeout=600),
                stream_message,
                window,
                seconds,
                warmup,
            )
            self.add(
                "grpc_update_stream",
                Row(
                    section,
                    f"StreamUpdatePriorities(256), {window} in flight",
                    calls / elapsed,
                    "msgs/s",
                    ceiling=c_update_s,
                    ceiling_name="bidi stream, same window and message size",
                    target=TARGET_UPDATE,
                    target_text=f">= {TARGET_UPDATE:,}",
                    calls=calls,
                    seconds=elapsed,
                ),
            )

            # learner-like cycle: blocking sample, asynchronous update of the sampled keys
            progress(f"apexrl: cycle sample(256) + update_priorities_future(256), {window} updates in flight")
            in_flight: deque = deque()

            def cycle() -> None:
                batch = client.sample(SAMPLE_BATCH)
                if len(in_flight) >= window:
                    in_flight.popleft().result()
                in_flight.append(
                    client.update_priorities_future(
                        batch.keys, pri_pool[counter[0] % 16], incarnation=batch.incarnation
                    )
                )
                counter[0] += 1

            def drain() -> None:
                while in_flight:
                    in_flight.popleft().result()

            calls, elapsed = self.m(self.shard_pid, measure_loop, cycle, seconds, warmup, drain)
            self.add(
                "grpc_cycle",
                Row(
                    section,
                    "cycle: sample(256) + async update(256)",
                    calls / elapsed,
                    "cycles/s",
                    calls=calls,
                    seconds=elapsed,
                    note="what one learner thread does per train step",
                ),
            )
            info = client.info()
            if info.size != info.capacity:
                raise RuntimeError("the shard stopped being full during the measurements")
        finally:
            client.close()

    # -- 3: in-process
    def in_process(self) -> None:
        from apexrl.replay_server.sum_tree import SumTree
        from apexrl.replay_server.table import ReplayTable, TableConfig

        seconds, warmup = self.s()
        capacity = self.args.capacity
        rng = self.rng
        section = f"in-process ({capacity:,} slots, CartPole rows)"
        beta = 0.4

        progress(f"in-process: SumTree({capacity:,}) filled with random priorities")
        tree = SumTree(capacity, 0.6)
        tree.update(np.arange(capacity), rng.random(capacity) + 0.01)
        idx_pool = [rng.integers(0, capacity, UPDATE_BATCH) for _ in range(64)]
        pri_pool = [rng.random(UPDATE_BATCH) * 3 + 0.01 for _ in range(64)]
        counter = [0]

        def tree_update(tree=tree) -> None:
            i = counter[0] = (counter[0] + 1) % 64
            tree.update(idx_pool[i], pri_pool[i])

        calls, elapsed = self.m(None, measure_loop, tree_update, seconds, warmup)
        self.add(
            "tree_update",
            Row(section, "SumTree.update(256)", calls / elapsed, "calls/s", calls=calls, seconds=elapsed),
        )
        calls, elapsed = self.m(
            None, measure_loop, lambda t=tree: t.sample(SAMPLE_BATCH, rng), seconds, warmup
        )
        self.add(
            "tree_sample",
            Row(
                section,
                "SumTree.sample(256) (indices only)",
                calls / elapsed,
                "calls/s",
                calls=calls,
                seconds=elapsed,
            ),
        )
        del tree

        for workload, cap in (("cartpole", capacity), ("atari", self.args.atari_capacity)):
            table = ReplayTable(TableConfig(capacity=cap, seed=0))
            for rows in (64, 256):
                batch = WORKLOADS[workload](rows, rng)
                pri = priorities(rows, rng)
                seq = [0]

                def insert(b=batch, p=pri, t=table, seq=seq) -> None:
                    seq[0] += 1
                    t.insert(b, p, writer_id="bench", sequence=seq[0])

                progress(f"in-process: ReplayTable.insert {workload} x{rows}")
                calls, elapsed = self.m(None, measure_loop, insert, seconds, warmup)
                rate = calls * rows / elapsed
                grpc_row = self.results.by_key.get(f"grpc_insert_{workload}_{rows}")
                self.add(
                    f"table_insert_{workload}_{rows}",
                    Row(
                        section if workload == "cartpole" else f"in-process ({cap:,} slots, Atari rows)",
                        f"ReplayTable.insert {workload} x{rows}",
                        rate,
                        "transitions/s",
                        mb_per_s=rate * row_nbytes(batch) / 1e6,
                        calls=calls,
                        seconds=elapsed,
                        note=""
                        if grpc_row is None
                        else f"gRPC SDK reaches {grpc_row.value / rate:.2f} of this",
                    ),
                )
            if workload == "atari":
                del table
                continue

            progress(f"in-process: filling the table to {capacity:,} rows")
            big = cartpole_batch(FILL_BATCH, rng)
            while table.info().size < capacity:
                table.insert(big, priorities(FILL_BATCH, rng))
            key_pool = [table.sample(SAMPLE_BATCH).keys for _ in range(64)]

            calls, elapsed = self.m(
                None, measure_loop, lambda t=table: t.sample(SAMPLE_BATCH), seconds, warmup
            )
            self.add(
                "table_sample",
                Row(
                    section,
                    "ReplayTable.sample(256) (+ gather, keys)",
                    calls / elapsed,
                    "calls/s",
                    calls=calls,
                    seconds=elapsed,
                ),
            )

            def table_update(t=table, key_pool=key_pool) -> None:
                i = counter[0] = (counter[0] + 1) % 64
                t.update_priorities(key_pool[i], pri_pool[i])

            calls, elapsed = self.m(None, measure_loop, table_update, seconds, warmup)
            self.add(
                "table_update",
                Row(
                    section,
                    "ReplayTable.update_priorities(256)",
                    calls / elapsed,
                    "calls/s",
                    calls=calls,
                    seconds=elapsed,
                ),
            )

            def table_cycle(t=table) -> None:
                r = t.sample(SAMPLE_BATCH)
                probs = r.priorities / r.total_priority
                weights = (r.size * probs) ** -beta / (r.size * r.min_priority / r.total_priority) ** -beta
                i = counter[0] = (counter[0] + 1) % 64
                t.update_priorities(r.keys, pri_pool[i])
                return weights

            progress("in-process: cycle ReplayTable.sample(256) + IS weights + update_priorities(256)")
            calls, elapsed = self.m(None, measure_loop, table_cycle, seconds, warmup)
            self.add(
                "table_cycle",
                Row(
                    section,
                    "cycle: sample(256) + IS weights + update(256)",
                    calls / elapsed,
                    "cycles/s",
                    calls=calls,
                    seconds=elapsed,
                ),
            )
            del table

    # -- 5: cpprb
    def cpprb(self) -> None:
        python = self.args.cpprb_python or sys.executable
        progress(f"cpprb: PrioritizedReplayBuffer({self.args.capacity:,}) with {python}")
        cmd = [
            python,
            os.path.abspath(__file__),
            "_cpprb",
            "--capacity",
            str(self.args.capacity),
            "--seconds",
            str(self.args.seconds),
            "--warmup",
            str(self.args.warmup),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode
            progress(f"  cpprb skipped: {reason}")
            self.cpprb_skipped = proc.stderr.strip()[-500:]
            return
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        section = f"cpprb {figures['version']} ({self.args.capacity:,} slots, in-process)"
        for key, name, unit in (
            ("add", "PrioritizedReplayBuffer.add x256", "transitions/s"),
            ("sample", "sample(256) (+ gather, IS weights)", "calls/s"),
            ("update", "update_priorities(256)", "calls/s"),
            ("cycle", "cycle: sample(256) + update(256)", "cycles/s"),
        ):
            calls, elapsed = figures[key]
            rate = calls / elapsed * (256 if key == "add" else 1)
            self.results.add(f"cpprb_{key}", Row(section, name, rate, unit, calls=calls, seconds=elapsed))
        ours = self.results.by_key.get("table_cycle")
        if ours is not None:
            theirs = self.results.by_key["cpprb_cycle"].value
            ours.ceiling, ours.ceiling_name = theirs, "cpprb cycle"
            ours.ratio = ours.value / theirs
            ours.target, ours.target_text = theirs, ">= cpprb"
            ours.met = ours.value >= theirs

    # -- the whole run
    def run(self) -> None:
        args = self.args
        workdir = tempfile.mkdtemp(prefix="replay_bench_")
        children: list[Child] = []
        self.fill_rate = None
        self.cpprb_skipped = None
        self.load_before = os.getloadavg()[0]
        try:
            sections = set(args.sections)
            if sections & {"insert", "shard"}:
                progress("starting the ceiling server and the replay shards (separate processes)")
                echo_child = start_echo(workdir)
                children.append(echo_child)
                shards = {"cartpole": start_shard("shard-cartpole", args.capacity, workdir)}
                children.append(shards["cartpole"])
                if "insert" in sections:
                    shards["atari"] = start_shard("shard-atari", args.atari_capacity, workdir)
                    children.append(shards["atari"])
                from apexrl.common.grpc_util import wait_for_health

                echo_child.wait_ready()
                self.echo_pid = echo_child.proc.pid
                for shard in shards.values():
                    wait_for_health(shard.address, timeout=60)
                echo = Echo(echo_child.address)
                try:
                    if "insert" in sections:
                        self.grpc_inserts(echo, shards)
                    if "shard" in sections:
                        self.fill(shards["cartpole"].address, args.capacity)
                        self.grpc_full_shard(echo, shards["cartpole"])
                finally:
                    echo.close()
                for child in children:
                    child.stop()
            if "inprocess" in sections:
                self.in_process()
            if args.cpprb:
                self.cpprb()
        finally:
            for child in children:
                child.stop()
            shutil.rmtree(workdir, ignore_errors=True)
            self.load_after = os.getloadavg()[0]


# ----------------------------------------------------------------------------------------------------- output


def format_rate(value: float | None) -> str:
    if value is None:
        return ""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def print_table(bench: Bench, file=sys.stdout) -> None:
    headers = [
        "figure",
        "value",
        "unit",
        "MB/s",
        "ceiling",
        "ratio",
        "target",
        "met",
        "cores cli+srv",
        "CPU us/call cli/srv",
    ]
    lines: list[list[str] | str] = []
    section = None
    # apexrl (and cpprb) figures first, grouped by section; the raw ceilings they refer to at the end.
    ordered = [r for r in bench.results.rows if r.section != CEILING_SECTION]
    ordered += [r for r in bench.results.rows if r.section == CEILING_SECTION]
    for row in ordered:
        if row.section != section:
            section = row.section
            lines.append(f"-- {section}")
        cpu = per_call = ""
        if row.client_cpu is not None and row.calls:
            cpu = f"{row.client_cpu:.2f}" + ("" if row.server_cpu is None else f"+{row.server_cpu:.2f}")
            per_call = f"{row.client_cpu * row.seconds / row.calls * 1e6:,.0f}"
            if row.server_cpu is not None:
                per_call += f"/{row.server_cpu * row.seconds / row.calls * 1e6:,.0f}"
        lines.append(
            [
                row.name,
                format_rate(row.value),
                row.unit,
                "" if row.mb_per_s is None else f"{row.mb_per_s:,.1f}",
                format_rate(row.ceiling),
                "" if row.ratio is None else f"{row.ratio:.2f}",
                row.target_text or "",
                "" if row.met is None else ("yes" if row.met else "NO"),
                cpu,
                per_call,
            ]
        )
    widths = [
        max(len(h), *(len(line[i]) for line in lines if isinstance(line, list)))
        for i, h in enumerate(headers)
    ]
    right = {1, 3, 4, 5, 8, 9}

    def fmt(cells: list[str]) -> str:
        text = "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return text.rstrip()

    print(fmt(headers), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for line in lines:
        print(line if isinstance(line, str) else fmt(line), file=file)
    print(FOOTER, file=file)
    if bench.fill_rate:
        print(
            f"Shard filled at {bench.fill_rate:,.0f} rows/s in batches of {FILL_BATCH:,} through the SDK.",
            file=file,
        )
    load = bench.load_before, bench.load_after
    print(
        f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} CPUs"
        + ("  ** other processes were busy: figures are disturbed **" if max(load) > 1.5 else "")
        + (f"; this run's niceness {os.nice(0)}" if os.nice(0) else ""),
        file=file,
    )


def metadata(args: argparse.Namespace) -> dict:
    import grpc

    meta = {
        "argv": sys.argv,
        "args": vars(args),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "nice": os.nice(0),
    }
    try:
        import google.protobuf

        meta["protobuf"] = google.protobuf.__version__
    except ImportError:
        pass
    with contextlib.suppress(OSError):
        meta["git"] = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    return meta


# ----------------------------------------------------------------------------------------------- cpprb worker


def cpprb_worker_main(argv: list[str]) -> int:
    """Runs under an interpreter with cpprb; prints one JSON line of (calls, seconds) per figure."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    args = parser.parse_args(argv)
    import importlib.metadata

    import cpprb

    rng = np.random.default_rng(0)
    env_dict = {
        "obs": {"shape": 4, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "discount": {"dtype": np.float32},
        "next_obs": {"shape": 4, "dtype": np.float32},
    }
    rb = cpprb.PrioritizedReplayBuffer(args.capacity, env_dict, alpha=0.6)
    batch = cartpole_batch(256, rng)
    pri = priorities(256, rng)
    out: dict = {"version": importlib.metadata.version("cpprb")}
    out["add"] = measure_loop(lambda: rb.add(**batch, priorities=pri), args.seconds, args.warmup)
    big = cartpole_batch(FILL_BATCH, rng)
    while rb.get_stored_size() < args.capacity:
        rb.add(**big, priorities=priorities(FILL_BATCH, rng))
    pri_pool = [rng.random(256) * 3 + 0.01 for _ in range(64)]
    idx_pool = [rb.sample(256, beta=0.4)["indexes"] for _ in range(64)]
    counter = [0]

    def update() -> None:
        i = counter[0] = (counter[0] + 1) % 64
        rb.update_priorities(idx_pool[i], pri_pool[i])

    def cycle() -> None:
        s = rb.sample(256, beta=0.4)
        i = counter[0] = (counter[0] + 1) % 64
        rb.update_priorities(s["indexes"], pri_pool[i])

    out["sample"] = measure_loop(lambda: rb.sample(256, beta=0.4), args.seconds, args.warmup)
    out["update"] = measure_loop(update, args.seconds, args.warmup)
    out["cycle"] = measure_loop(cycle, args.seconds, args.warmup)
    print(json.dumps(out))
    return 0


# ------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="measured time per figure (default 3; 0.3 with --quick)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="unmeasured warm-up before each figure (default 0.5; 0.1 with --quick)",
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="slots of the full CartPole shard and the in-process table (default 1,000,000; "
        "50,000 with --quick)",
    )
    parser.add_argument(
        "--atari-capacity",
        type=int,
        default=None,
        help="slots of the Atari shard/table; rows are 56 KiB (default 20,000; 1,000 with --quick)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=16,
        help="priority updates in flight for the pipelined and streamed figures (default 16)",
    )
    parser.add_argument(
        "--sample-window",
        type=int,
        default=4,
        help="samples in flight for the pipelined sample figure (default 4)",
    )
    parser.add_argument(
        "--insert-window",
        type=int,
        default=32,
        help="ReplayClient max_in_flight for the insert figures (default 32, the SDK default)",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["insert", "shard", "inprocess"],
        choices=["insert", "shard", "inprocess"],
        help="what to measure (default: all)",
    )
    parser.add_argument(
        "--cpprb",
        action="store_true",
        help="also measure cpprb's PrioritizedReplayBuffer (needs `import cpprb` in --cpprb-python)",
    )
    parser.add_argument(
        "--cpprb-python",
        default=None,
        help="interpreter with numpy and cpprb for --cpprb (default: this one)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and short figures (~20 s smoke run)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "seconds": (3.0, 0.3),
        "warmup": (0.5, 0.1),
        "capacity": (1_000_000, 50_000),
        "atari_capacity": (20_000, 1_000),
    }
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.capacity < FILL_BATCH or args.atari_capacity < 256:
        parser.error(f"--capacity must be >= {FILL_BATCH} and --atari-capacity >= 256")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_echo-server"]:
        return echo_server_main(argv[1:])
    if argv[:1] == ["_cpprb"]:
        return cpprb_worker_main(argv[1:])
    args = parse_args(argv)
    bench = Bench(args)
    bench.run()
    print_table(bench)
    if args.json:
        data = {
            "meta": metadata(args),
            "load_average_1min": [bench.load_before, bench.load_after],
            "fill_rows_per_s": bench.fill_rate,
            "cpprb_skipped": bench.cpprb_skipped,
            "figures": {key: asdict(row) for key, row in bench.results.by_key.items()},
        }
        with open(args.json, "w") as f:
            json.dump(
                data, f, indent=2, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o
            )
        progress(f"wrote {args.json}")
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

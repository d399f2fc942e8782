"""Shard checkpoints under load: what a checkpoint of a full shard costs the calls it runs beside (ARCHITECTURE
§7; issue 9's targets: while a full 1,000,000-row CartPole shard writes a checkpoint, no insert, sample or update
call pauses more than 50 ms, and insert throughput stays above 70% of its rate without a checkpoint; with the
write-ahead log on, insert throughput >= 50% of its rate without it).

    .venv/bin/python bench/checkpoint_bench.py --json /tmp/checkpoint_bench.json   # full run (~1.5 minutes)
    .venv/bin/python bench/checkpoint_bench.py --quick                              # smoke run (~20 s)

The shard runs in its own process exactly as operators start it (`apexrl replay --checkpoint-dir DIR`), filled
to capacity first. The load is one Insert stream (`--rows` CartPole rows per batch, `--window` unacknowledged,
pre-encoded requests), one Sample(256) loop and one UpdatePriorities(256) loop (keys from the samples), all on
one asyncio loop in this process, every call timed. The same load runs twice in the same run: `--seconds`
without a checkpoint (the baseline), then with Checkpoint RPCs back to back for at least as long (every call
then overlaps a checkpoint). Figures: the longest pause of each call (unary calls: their latency; the insert
stream: the longest gap between two acks, and the longest batch latency), insert rows/s with vs without, the
checkpoint's size and write time, the restore time of a restarted shard, and insert rows/s (SDK client, batches
of `--rows`) with `--wal` vs without, each against its baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.processes import Child  # noqa: E402
from harness.report import load_line, metadata, progress, render_table, write_json  # noqa: E402
from workloads import FILL_BATCH, cartpole_batch, priorities  # noqa: E402

INSERT = "/apexrl.v1.ReplayService/Insert"


def shard(workdir: str, name: str, capacity: int, *extra: str) -> Child:
    return Child(
        name,
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
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
            *extra,
        ],
        workdir,
    )


def fill(address: str, capacity: int) -> float:
    """Insert `capacity` rows through the SDK; return rows/s."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    rng = np.random.default_rng(0)
    batch, pri = cartpole_batch(FILL_BATCH, rng), priorities(FILL_BATCH, rng)
    start = time.perf_counter()
    with ReplayClient(address, timeout=120) as client:
        for first in range(0, capacity, FILL_BATCH):
            rows = min(FILL_BATCH, capacity - first)
            client.insert({k: v[:rows] for k, v in batch.items()}, pri[:rows])
        client.flush()
    return capacity / (time.perf_counter() - start)


class Calls:
    """Latencies and ack times of one phase."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {"insert": [], "sample": [], "update": []}
        self.acks: list[float] = []
        self.checkpoints: list = []


async def insert_stream(channel, message: bytes, window: int, stop: asyncio.Event, calls: Calls) -> None:
    call = channel.stream_stream(INSERT)()
    credit = asyncio.Semaphore(window)
    sent: list[float] = []

    async def send() -> None:
        while not stop.is_set():
            await credit.acquire()
            sent.append(time.perf_counter())
            await call.write(message)
        await call.done_writing()

    sender = asyncio.ensure_future(send())
    i = 0
    async for _ in call:
        now = time.perf_counter()
        calls.acks.append(now)
        calls.latency["insert"].append(now - sent[i])
        i += 1
        credit.release()
    await sender


async def sample_and_update(stub, stop: asyncio.Event, calls: Calls) -> None:
    from apexrl.proto import replay_pb2
    from apexrl.replay_server import wire

    keys = None
    sample_request = replay_pb2.SampleRequest(batch_size=256)
    rng = np.random.default_rng(1)

    async def timed(name: str, coroutine):
        start = time.perf_counter()
        result = await coroutine
        calls.latency[name].append(time.perf_counter() - start)
        return result

    async def sampler() -> None:
        nonlocal keys
        while not stop.is_set():
            response = await timed("sample", stub.Sample(sample_request, timeout=30))
            keys = np.frombuffer(response.keys.data, np.uint64).copy()

    async def updater() -> None:
        while not stop.is_set():
            if keys is None:
                await asyncio.sleep(0.01)
                continue
            request = wire.encode_update(keys, rng.random(len(keys)) + 0.01, 0)
            await timed("update", stub.UpdatePriorities(request, timeout=30))

    await asyncio.gather(sampler(), updater())


async def phase(
    address: str, seconds: float, window: int, message: bytes, checkpoint: bool
) -> tuple[Calls, float]:
    """The load for `seconds` (with checkpoints: until the last checkpoint started within them ends); returns
    the calls and the measured time."""
    import grpc

    from apexrl.proto import replay_pb2, replay_pb2_grpc

    calls, stop = Calls(), asyncio.Event()
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with (
        grpc.aio.insecure_channel(address, options=options) as channel,
        grpc.aio.insecure_channel(address, options=options) as control,
    ):
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        tasks = [
            asyncio.ensure_future(insert_stream(channel, message, window, stop, calls)),
            asyncio.ensure_future(sample_and_update(stub, stop, calls)),
        ]
        await asyncio.sleep(0.5)  # flowing before anything is counted
        for name in calls.latency:
            calls.latency[name].clear()
        calls.acks.clear()
        start = time.perf_counter()
        if checkpoint:
            control_stub = replay_pb2_grpc.ReplayServiceStub(control)
            while time.perf_counter() - start < seconds or not calls.checkpoints:
                calls.checkpoints.append(
                    await control_stub.Checkpoint(replay_pb2.CheckpointRequest(), timeout=300)
                )
        else:
            await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - start
        acks_in_phase = [t for t in calls.acks if t <= start + elapsed]
        calls.acks = acks_in_phase
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    return calls, elapsed


def summarise(calls: Calls, seconds: float, rows: int) -> dict:
    acks = np.asarray(calls.acks)
    gaps = np.diff(acks) if len(acks) > 1 else np.zeros(1)
    out = {
        "seconds": seconds,
        "insert_rows_per_s": len(acks) * rows / seconds,
        "insert_max_ack_gap_ms": float(gaps.max()) * 1e3,
        "insert_ack_gaps_over_50ms": int((gaps > 0.05).sum()),
    }
    for name, values in calls.latency.items():
        v = np.asarray(values) * 1e3
        out[f"{name}_calls"] = len(v)
        out[f"{name}_max_ms"] = float(v.max()) if len(v) else None
        out[f"{name}_p99_ms"] = float(np.percentile(v, 99)) if len(v) else None
        out[f"{name}_over_50ms"] = int((v > 50).sum())
    return out


def restore_time(workdir: str, directory: str, capacity: int) -> dict:
    """Restart a shard on `directory`: seconds until SERVING, and the restore's own time from its log."""
    from apexrl.common.grpc_util import wait_for_health

    start = time.perf_counter()
    child = shard(workdir, "restored", capacity, "--checkpoint-dir", directory, "--checkpoint-every", "0")
    try:
        wait_for_health(child.address, timeout=300)
        serving = time.perf_counter() - start
    finally:
        child.stop()
    match = re.search(r"restored (\d+) rows .* in ([\d.]+)s", Path(child.log_path).read_text())
    return {
        "rows": int(match.group(1)) if match else None,
        "restore_s": float(match.group(2)) if match else None,
        "start_to_serving_s": serving,
    }


def wal_throughput(workdir: str, capacity: int, seconds: float, rows: int, wal: bool) -> float:
    """Insert rows/s through the SDK (the acknowledged stream, 32 batches in flight) into a fresh shard."""
    from apexrl.replay_server.client.replay_client import ReplayClient

    directory = os.path.join(workdir, f"wal-{wal}")
    extra = ["--checkpoint-dir", os.path.join(directory, "ck"), "--checkpoint-every", "0"]
    if wal:
        extra += ["--wal", os.path.join(directory, "wal")]
    child = shard(workdir, f"wal-{wal}", capacity, *extra)
    rng = np.random.default_rng(0)
    batch, pri = cartpole_batch(rows, rng), priorities(rows, rng)
    try:
        from apexrl.common.grpc_util import wait_for_health

        wait_for_health(child.address, timeout=60)
        with ReplayClient(child.address, timeout=60) as client:
            for _ in range(64):  # warm-up
                client.insert(batch, pri)
            client.flush()
            sent, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                client.insert(batch, pri)
                sent += 1
            client.flush()
            return sent * rows / (time.perf_counter() - start)
    finally:
        child.stop()
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--capacity", type=int, default=1_000_000, help="rows of the full shard")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time of each phase")
    parser.add_argument("--rows", type=int, default=256, help="rows per insert batch")
    parser.add_argument("--window", type=int, default=8, help="unacknowledged insert batches")
    parser.add_argument(
        "--paces",
        type=float,
        nargs="+",
        default=[200.0, 0.0],
        help="checkpoint paces to measure (--checkpoint-max-mb-per-s; 200 is the default, 0 unpaced)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 50,000-row shard and 1.5 s phases (smoke test)"
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.capacity, args.seconds = 50_000, 1.5
    from apexrl.replay_server import wire

    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    message = wire.encode_insert(
        cartpole_batch(args.rows, rng), priorities(args.rows, rng), ""
    ).SerializeToString()
    result: dict = {"capacity": args.capacity, "rows_per_batch": args.rows, "window": args.window}
    result["paces"] = []
    with tempfile.TemporaryDirectory() as workdir:
        directory = os.path.join(workdir, "checkpoints")
        for pace in args.paces:
            shutil.rmtree(directory, ignore_errors=True)
            child = shard(
                workdir,
                f"shard-{pace:g}",
                args.capacity,
                "--checkpoint-dir",
                directory,
                "--checkpoint-every",
                "0",
                "--checkpoint-max-mb-per-s",
                str(pace),
            )
            try:
                progress(f"pace {pace:g} MB/s: filling {args.capacity:,} rows")
                part = {"pace_mb_per_s": pace, "fill_rows_per_s": fill(child.address, args.capacity)}
                progress(f"baseline load for {args.seconds:.0f}s")
                calls, seconds = asyncio.run(phase(child.address, args.seconds, args.window, message, False))
                part["baseline"] = summarise(calls, seconds, args.rows)
                progress(f"load with checkpoints back to back for {args.seconds:.0f}s")
                calls, seconds = asyncio.run(phase(child.address, args.seconds, args.window, message, True))
                part["checkpointing"] = summarise(calls, seconds, args.rows)
                ck = [wire.decode_checkpoint(c) for c in calls.checkpoints]
                part["checkpoints"] = [{"bytes": c.bytes, "seconds": c.seconds, "rows": c.rows} for c in ck]
            finally:
                child.stop()
            result["paces"].append(part)
        progress("restore")
        result["restore"] = restore_time(workdir, directory, args.capacity)
        shutil.rmtree(directory, ignore_errors=True)
        progress("insert throughput with and without the write-ahead log")
        result["wal"] = {
            "without_rows_per_s": wal_throughput(workdir, args.capacity, args.seconds, args.rows, False),
            "with_rows_per_s": wal_throughput(workdir, args.capacity, args.seconds, args.rows, True),
        }
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]
    report(result)
    if args.json:
        write_json(args.json, {"meta": metadata(args), **result})
    return 0


def report(r: dict) -> None:
    print(
        f"Full shard of {r['capacity']:,} CartPole rows; insert batches of {r['rows_per_batch']}, "
        f"{r['window']} in flight; sample and update 256 at a time"
    )
    for part in r["paces"]:
        report_pace(part)
    rs = r["restore"]
    print(
        f"restore: {rs['rows']:,} rows in {rs['restore_s']:.2f} s; process start to SERVING "
        f"{rs['start_to_serving_s']:.2f} s"
    )
    w = r["wal"]
    print(
        f"insert rows/s (SDK): without WAL {w['without_rows_per_s']:,.0f}, with WAL {w['with_rows_per_s']:,.0f} "
        f"(ratio {w['with_rows_per_s'] / w['without_rows_per_s']:.2f})"
    )
    print(load_line(*r["load_average_1min"]))


def report_pace(r: dict) -> None:
    base, ck = r["baseline"], r["checkpointing"]
    pace = f"paced at {r['pace_mb_per_s']:g} MB/s" if r["pace_mb_per_s"] else "unpaced"
    print(f"\nCheckpoints {pace}")
    lines = []
    for label, key in (
        ("insert: longest gap between acks, ms", "insert_max_ack_gap_ms"),
        ("insert: longest batch latency, ms", "insert_max_ms"),
        ("sample(256): longest call, ms", "sample_max_ms"),
        ("update(256): longest call, ms", "update_max_ms"),
        ("sample(256): p99, ms", "sample_p99_ms"),
        ("update(256): p99, ms", "update_p99_ms"),
        ("insert ack gaps over 50 ms", "insert_ack_gaps_over_50ms"),
        ("sample / update calls over 50 ms", ("sample_over_50ms", "update_over_50ms")),
        ("insert rows/s", "insert_rows_per_s"),
    ):
        if isinstance(key, tuple):
            lines.append(
                [label, " / ".join(str(base[k]) for k in key), " / ".join(str(ck[k]) for k in key), ""]
            )
            continue
        a, b = base[key], ck[key]
        lines.append(
            [
                label,
                f"{a:,.1f}" if isinstance(a, float) else str(a),
                f"{b:,.1f}" if isinstance(b, float) else str(b),
                f"{b / a:.2f}" if a else "",
            ]
        )
    for line in render_table(["figure", "no checkpoint", "checkpointing", "ratio"], lines, left={0}):
        print(line)
    sizes = [c["bytes"] for c in r["checkpoints"]]
    times = [c["seconds"] for c in r["checkpoints"]]
    print(
        f"checkpoints written: {len(sizes)}, {np.median(sizes) / 1e6:.1f} MB, write time median "
        f"{np.median(times):.2f} s (max {max(times):.2f} s); calls during them: insert "
        f"{ck['insert_calls']}, sample {ck['sample_calls']}, update {ck['update_calls']}"
    )


if __name__ == "__main__":
    sys.exit(main())

"""Many connected writers: insert throughput of one replay shard with 1, 16 and 256 writers streaming at once,
and the latency of Sample and Info answered meanwhile (ARCHITECTURE §2; the resilience issue's target: with 256
writers, >= 80% of the single-writer insert rate and Sample/Info p99 <= 100 ms).

    .venv/bin/python bench/writers_bench.py                    # 1, 16, 256 writers, 5 s each (~40 s)
    .venv/bin/python bench/writers_bench.py --writers 1 64 --seconds 3 --json out.json

The shard runs in its own process exactly as operators start it. The writers are Insert streams driven from one
asyncio loop in this process with pre-encoded requests (no per-batch Python work on the client side, which would
otherwise be what is measured): each writer keeps `--window` batches of `--rows` CartPole rows unacknowledged, the
shape of the SDK's stream. A sampler in a process of its own (a learner) calls Sample(256) and Info back to back
and records each answer's latency. Figures are reported next to the single-writer rate measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.processes import Child  # noqa: E402
from harness.report import load_line, metadata, progress, render_table, write_json  # noqa: E402
from workloads import cartpole_batch, priorities  # noqa: E402

INSERT = "/apexrl.v1.ReplayService/Insert"


def insert_request(rows: int) -> bytes:
    """One serialized InsertRequest without writer id (de-duplication off), so it can be sent again and again."""
    from apexrl.replay_server import wire

    rng = np.random.default_rng(0)
    return wire.encode_insert(cartpole_batch(rows, rng), priorities(rows, rng), "").SerializeToString()


async def writer(channel, message: bytes, window: int, stop: asyncio.Event, acked: list[int]) -> None:
    """One Insert stream keeping `window` batches unacknowledged until `stop`."""
    call = channel.stream_stream(INSERT)()  # bytes in, bytes out
    credit = asyncio.Semaphore(window)

    async def send() -> None:
        while not stop.is_set():
            await credit.acquire()
            await call.write(message)
        await call.done_writing()

    sender = asyncio.ensure_future(send())
    async for _ in call:
        acked[0] += 1
        credit.release()
    await sender


def sampler_process(address: str, seconds: float, out) -> None:
    """Sample(256) and Info back to back for `seconds`, in a process of its own (so the writers' client loop
    does not delay it); sends the latencies back through `out`."""
    latencies: dict[str, list[float]] = {"sample": [], "info": []}

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await sampler(address, stop, latencies)

    asyncio.run(run())
    out.send(latencies)


async def sampler(address: str, stop: asyncio.Event, latencies: dict[str, list[float]]) -> None:
    import grpc

    from apexrl.proto import replay_pb2, replay_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        while not stop.is_set():
            for name, call, request in (
                ("sample", stub.Sample, replay_pb2.SampleRequest(batch_size=256)),
                ("info", stub.Info, replay_pb2.InfoRequest()),
            ):
                start = time.perf_counter()
                await call(request, timeout=10)
                latencies[name].append(time.perf_counter() - start)


async def measure(address: str, writers: int, seconds: float, window: int, message: bytes, rows: int) -> dict:
    import grpc

    stop = asyncio.Event()
    acked = [0]
    latencies: dict[str, list[float]] = {"sample": [], "info": []}
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(writers, 16))]  # streams share channels
    tasks = [
        asyncio.ensure_future(writer(channels[i % len(channels)], message, window, stop, acked))
        for i in range(writers)
    ]
    await asyncio.sleep(1.0)  # every stream open and flowing
    spawn = multiprocessing.get_context("spawn")  # a fork would copy this process's gRPC threads
    receive, send = spawn.Pipe(duplex=False)
    probe = spawn.Process(target=sampler_process, args=(address, seconds, send), daemon=True)
    probe.start()
    start_acked, start = acked[0], time.perf_counter()
    await asyncio.sleep(seconds)
    done, elapsed = acked[0] - start_acked, time.perf_counter() - start
    latencies.update(await asyncio.get_running_loop().run_in_executor(None, receive.recv))
    probe.join(10)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    for channel in channels:
        await channel.close()
    p99 = {
        name: float(np.percentile(values, 99)) * 1e3 if values else None for name, values in latencies.items()
    }
    return {
        "writers": writers,
        "rows_per_s": done * rows / elapsed,
        "batches": done,
        "seconds": elapsed,
        "sample_calls": len(latencies["sample"]),
        "sample_p99_ms": p99["sample"],
        "info_p99_ms": p99["info"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--writers", type=int, nargs="+", default=[1, 16, 256], help="writer counts to measure"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per writer count")
    parser.add_argument("--rows", type=int, default=64, help="rows per insert batch")
    parser.add_argument("--window", type=int, default=4, help="unacknowledged batches per writer")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    import os

    load_before = os.getloadavg()[0]
    message = insert_request(args.rows)
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        shard = Child(
            "shard",
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "replay",
                "--port",
                "0",
                "--metrics-port",
                "-1",
                "--capacity",
                "1000000",
            ],
            workdir,
        )
        try:
            address = shard.address
            for count in args.writers:
                progress(f"{count} writers for {args.seconds:.0f}s")
                results.append(
                    asyncio.run(measure(address, count, args.seconds, args.window, message, args.rows))
                )
        finally:
            shard.stop()
    base = results[0]["rows_per_s"]
    lines = [
        [
            str(r["writers"]),
            f"{r['rows_per_s']:,.0f}",
            f"{r['rows_per_s'] / base:.2f}",
            f"{r['sample_p99_ms']:.1f}",
            f"{r['info_p99_ms']:.1f}",
            str(r["sample_calls"]),
        ]
        for r in results
    ]
    for line in render_table(
        [
            "writers",
            "insert rows/s",
            f"vs {results[0]['writers']}",
            "Sample p99 ms",
            "Info p99 ms",
            "samples",
        ],
        lines,
        left=set(),
    ):
        print(line)
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"meta": metadata(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

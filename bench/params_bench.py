"""Parameter service throughput on the asyncio runtime (this checkout) against a baseline commit's server (the
thread-pool one before issue 16), in one run, as ratios: Publish rate, Fetch rate (full weights), not-newer polls,
and GetVersion while 16 Publish streams are held open.

    .venv/bin/python bench/params_bench.py --baseline 0318ce6 --json /tmp/params_bench.json   # ~3.5 minutes
    .venv/bin/python bench/params_bench.py --baseline 0318ce6 --quick                          # smoke run, ~30 s

Both servers are `python -m apexrl.launcher params` processes, exactly what operators run; the baseline's is the
code of `--baseline` (git archive, imported through harness/baseline.py), the other this checkout's. The clients
are this checkout's ParameterClient for both: the learner's Publish from this process (one publisher, as in a
fleet), Fetch from `--clients` processes of their own (actors), each with its own channel. Each figure is measured
for `--seconds` after `--warmup`, in `--rounds` rounds that alternate which server goes first; the table gives the
median of the rounds and the ratio new / baseline.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.baseline import ROOT, baseline_pythonpath, describe, imported_from  # noqa: E402
from harness.processes import Child  # noqa: E402
from harness.report import load_line, metadata, progress, render_table, write_json  # noqa: E402
from harness.timing import process_cpu_seconds  # noqa: E402

# The acting weights of the default CartPole network (dueling MLP 256x256) and of Nature DQN on Atari (6 actions).
MODELS = {
    "mlp": {
        "torso.0.weight": (256, 4),
        "torso.0.bias": (256,),
        "torso.2.weight": (256, 256),
        "torso.2.bias": (256,),
        "value.weight": (1, 256),
        "value.bias": (1,),
        "advantage.weight": (2, 256),
        "advantage.bias": (2,),
    },
    "nature": {
        "conv.0.weight": (32, 4, 8, 8),
        "conv.0.bias": (32,),
        "conv.2.weight": (64, 32, 4, 4),
        "conv.2.bias": (64,),
        "conv.4.weight": (64, 64, 3, 3),
        "conv.4.bias": (64,),
        "fc.weight": (512, 3136),
        "fc.bias": (512,),
        "value.weight": (1, 512),
        "value.bias": (1,),
        "advantage.weight": (6, 512),
        "advantage.bias": (6,),
    },
}
HELD_STREAMS = 16


def model_weights(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(shape).astype(np.float32) for k, shape in MODELS[name].items()}


def client_loop(address: str, have: int, seconds: float, warmup: float, barrier, results) -> None:
    """An actor: Fetch(have) back to back (have 0: the full weights every time; the newest: not-newer polls) for
    `warmup` seconds, then, once every client is warm, for `seconds`; sends (fetches, bytes, seconds, calls warm-up
    included) back, or the error that stopped it."""
    try:
        results.put(_client_loop(address, have, seconds, warmup, barrier))
    except Exception as err:  # noqa: BLE001 (reported by the parent, which stops the run)
        barrier.abort()
        results.put(f"{type(err).__name__}: {err}")


def _client_loop(
    address: str, have: int, seconds: float, warmup: float, barrier
) -> tuple[int, int, float, int]:
    from apexrl.common.errors import UnavailableError
    from apexrl.parameter_server.client import ParameterClient

    with ParameterClient(address, timeout=30) as client:
        connect_by = time.monotonic() + 60
        while True:  # connected before the clock starts, however busy the machine is
            try:
                client.version()
                break
            except UnavailableError:
                if time.monotonic() > connect_by:
                    raise
                time.sleep(0.1)

        def fetch() -> int:
            fetched = client.fetch(have)
            return 0 if fetched is None else sum(a.nbytes for a in fetched[1].values())

        warm, end = 0, time.perf_counter() + warmup
        while time.perf_counter() < end:
            fetch()
            warm += 1
        barrier.wait(120)
        count = nbytes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            nbytes += fetch()
            count += 1
        return count, nbytes, time.perf_counter() - start, warm + count


def fetch_rate(
    address: str, have: int, clients: int, seconds: float, warmup: float
) -> tuple[float, float, int]:
    """(fetches/s, MB/s, calls warm-up included) of `clients` processes fetching at once."""
    spawn = multiprocessing.get_context("spawn")  # a fork would copy this process's gRPC threads
    barrier, results = spawn.Barrier(clients), spawn.Queue()
    workers = [
        spawn.Process(
            target=client_loop, args=(address, have, seconds, warmup, barrier, results), daemon=True
        )
        for _ in range(clients)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(30)
    errors = [outcome for outcome in outcomes if isinstance(outcome, str)]
    if errors:
        raise RuntimeError(f"a fetching client failed: {errors[0]}")
    return (
        sum(c / s for c, _, s, _ in outcomes),
        sum(b / s for _, b, s, _ in outcomes) / 1e6,
        sum(calls for *_, calls in outcomes),
    )


def publish_rate(
    client, weights: dict[str, np.ndarray], seconds: float, warmup: float
) -> tuple[float, float, int]:
    """(publishes/s, MB/s, calls warm-up included) of one publisher (the learner) publishing back to back."""
    size = sum(a.nbytes for a in weights.values())
    warm, end = 0, time.perf_counter() + warmup
    while time.perf_counter() < end:
        client.publish(weights)
        warm += 1
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.publish(weights)
        count += 1
    rate = count / (time.perf_counter() - start)
    return rate, rate * size / 1e6, warm + count


def version_latency_while_publishes_are_held(address: str, calls: int = 20) -> float | None:
    """Median GetVersion latency in ms while HELD_STREAMS Publish streams from one client stay open, each having sent
    a header and 8 of its 16 bytes; None when GetVersion times out (2 s)."""
    import grpc

    from apexrl.common.errors import DeadlineExceededError
    from apexrl.parameter_server.client import ParameterClient
    from apexrl.proto import parameters_pb2, parameters_pb2_grpc

    release = threading.Event()
    first = parameters_pb2.PublishRequest(
        header=parameters_pb2.WeightsHeader(total_bytes=16), chunk=b"\0" * 8
    )
    first.header.tensors.add(name="w", dtype=1, shape=[4], offset=0, nbytes=16)

    def requests():
        yield first
        release.wait(60)

    channel = grpc.insecure_channel(address)
    stub = parameters_pb2_grpc.ParameterServiceStub(channel)
    held = [stub.Publish.future(requests(), timeout=60) for _ in range(HELD_STREAMS)]
    try:
        time.sleep(1.0)  # every stream open and its first message received (or refused)
        latencies = []
        with ParameterClient(address, timeout=2) as client:
            for _ in range(calls):
                start = time.perf_counter()
                try:
                    client.version()
                except DeadlineExceededError:
                    return None
                latencies.append((time.perf_counter() - start) * 1e3)
        return statistics.median(latencies)
    finally:
        release.set()
        for call in held:
            call.exception(60)  # each ends refused (too many, or 8 bytes short): nothing is stored
        channel.close()


def measure_model(name: str, server_pid: int, client, model: str, args) -> dict[str, float]:
    """Publish, fetch and poll figures of one model against one server, each with the server's CPU per call."""
    weights = model_weights(model)
    address = client.address
    figures: dict[str, float] = {}
    for figure in ("publish", "fetch", "poll"):
        progress(f"{name}: {model} {figure}")
        cpu = process_cpu_seconds(server_pid)
        if figure == "publish":
            rate, megabytes, calls = publish_rate(client, weights, args.seconds, args.warmup)
        else:
            have = 0 if figure == "fetch" else client.version()  # 0: the full weights; the newest: not newer
            rate, megabytes, calls = fetch_rate(address, have, args.clients, args.seconds, args.warmup)
        figures[f"{figure}/s {model}"] = rate
        if figure != "poll":
            figures[f"{figure} MB/s {model}"] = megabytes
        figures[f"{figure} server CPU us/call {model}"] = (
            (process_cpu_seconds(server_pid) - cpu) / calls * 1e6
        )
    return figures


def measure_server(
    name: str, round_: int, env: dict[str, str], args, workdir: str
) -> dict[str, float | None]:
    """Every figure against one server process."""
    from apexrl.parameter_server.client import ParameterClient

    # Started outside the checkout, whose root would otherwise come first on the child's sys.path.
    argv = [
        sys.executable,
        "-m",
        "apexrl.launcher",
        "--log-level",
        "WARNING",
        "params",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--metrics-port",
        "-1",
    ]
    child = Child(f"{name}-{round_}", argv, workdir, env=env, cwd=workdir)
    figures: dict[str, float | None] = {}
    try:
        with ParameterClient(child.address, timeout=30) as client:
            for model in args.models:
                figures.update(measure_model(name, child.pid, client, model, args))
        progress(f"{name}: GetVersion with {HELD_STREAMS} Publish streams held open")
        figures["GetVersion ms, held publishes"] = version_latency_while_publishes_are_held(child.address)
    except Exception:
        progress(f"{name} server's log (exit status {child.proc.poll()}):\n{child.log_tail()}")
        raise
    finally:
        child.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline",
        default="HEAD",
        help="git ref of the server to compare with (default HEAD: "
        "the last commit, against the working tree)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per figure")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured time before each figure")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds per server (alternating which goes first)"
    )
    parser.add_argument("--clients", type=int, default=4, help="fetching processes (actors)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 0.5 s figures, one round, mlp only"
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.rounds, args.models, args.clients = 0.5, 0.2, 1, ["mlp"], 2
    baseline = describe(args.baseline)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"baseline": [], "new": []}
    with tempfile.TemporaryDirectory() as workdir:
        path = baseline_pythonpath(args.baseline, Path(workdir) / "baseline")
        envs = {
            "baseline": {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])),
            },
            "new": dict(os.environ),
        }
        for name, home in (("baseline", Path(workdir)), ("new", ROOT)):
            served = imported_from("apexrl.parameter_server.service", envs[name], workdir)
            if not served.is_relative_to(home):
                raise RuntimeError(f"the {name} server would import {served}, not code under {home}")
        for round_ in range(args.rounds):
            for name in ["baseline", "new"] if round_ % 2 == 0 else ["new", "baseline"]:
                runs[name].append(measure_server(name, round_, envs[name], args, workdir))
    lines, results = [], {}
    for key in runs["new"][0]:
        values = {name: [r[key] for r in rs] for name, rs in runs.items()}
        medians = {name: statistics.median(v) if None not in v else None for name, v in values.items()}
        ratio = (
            medians["new"] / medians["baseline"]
            if None not in medians.values() and medians["baseline"]
            else None
        )
        results[key] = {"baseline": values["baseline"], "new": values["new"], "ratio": ratio}
        cell = {name: "timed out" if m is None else f"{m:,.1f}" for name, m in medians.items()}
        lines.append([key, cell["baseline"], cell["new"], "" if ratio is None else f"{ratio:.2f}"])
    for line in render_table(
        ["figure", f"baseline {baseline}", "this checkout", "new / baseline"], lines, left={0}
    ):
        print(line)
    print(
        f"{args.clients} fetching processes, {args.seconds:g} s per figure, median of {args.rounds} round(s)"
    )
    print(load_line(load_before, os.getloadavg()[0]))
    if args.json:
        write_json(args.json, {"meta": {**metadata(args), "baseline": baseline}, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Floods of large requests against a real server process on loopback, its RSS read from /proc/PID/status while
a caller of the server's own roles keeps calling (issue 31, item 1). Shared by
tests/integration/test_memory_flood.py (bounds asserted) and bench/flood_bench.py (figures printed).

A flood is `rounds` rounds of `concurrent` unary calls at once, each with a body of `body_bytes` random bytes sent
as the request (no serializer: they reach the server as they are), from one connection, with no credential or
with a role's token; every call's status code is counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from apexrl.common.grpc_util import wait_for_health

TOKENS = {
    "actor": "actor-token-for-the-flood-0123456789",
    "learner": "learner-token-for-the-flood-0123456789",
}
REPLAY = "/apexrl.v1.ReplayService"
PARAMS = "/apexrl.v1.ParameterService"
MIB = 1024 * 1024


def write_role_tokens(directory: Path) -> Path:
    """A role-tokens directory (an actor and a learner), modes as a careful operator sets them."""
    directory.mkdir(mode=0o700, exist_ok=True)
    for role, token in TOKENS.items():
        path = directory / role
        path.write_text(token + "\n")
        path.chmod(0o600)
    return directory


@dataclass
class ServerProcess:
    address: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(15)


def start_server(kind: str, directory: Path, *extra: str) -> ServerProcess:
    """`apexrl replay` or `apexrl params` as a child process on 127.0.0.1 and a free port, with role tokens
    (TOKENS); returned once it reports SERVING."""
    tokens = write_role_tokens(directory / "role-tokens")
    port_file, log = directory / f"{kind}.port", directory / f"{kind}.log"
    argv = [sys.executable, "-m", "apexrl.launcher", kind, "--host", "127.0.0.1", "--port", "0"]
    argv += ["--metrics-port", "-1", "--port-file", str(port_file), "--role-tokens", str(tokens), *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{kind} did not start: {log.read_text()}")
        time.sleep(0.05)
    server = ServerProcess(f"127.0.0.1:{int(port_file.read_text())}", process, log)
    wait_for_health(server.address, timeout=20)
    return server


def rss_mb(pid: int) -> float:
    """The process's resident set (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def wait_rss_below(pid: int, mb: float, timeout: float) -> float:
    """The process's RSS once it is below `mb` (polled), or its last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (now := rss_mb(pid)) >= mb and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


@dataclass
class FloodResult:
    start_mb: float
    peak_mb: float = 0.0
    codes: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    honest_latencies: list[float] = field(default_factory=list)
    honest_errors: list[str] = field(default_factory=list)

    @property
    def growth_mb(self) -> float:
        return self.peak_mb - self.start_mb

    @property
    def refused_per_second(self) -> float:
        return sum(n for code, n in self.codes.items() if code != "OK") / max(self.seconds, 1e-9)

    def honest_ms(self, quantile: float) -> float:
        ordered = sorted(self.honest_latencies)
        return (
            1000 * ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] if ordered else float("nan")
        )


def flood(
    server: ServerProcess,
    method: str,
    *,
    body_bytes: int,
    concurrent: int,
    rounds: int,
    token: str | None = None,
    honest: Callable[[], object] | None = None,
) -> FloodResult:
    """The flood (module docstring) while `honest()` is called in a loop from another thread (its latencies and
    errors recorded) and the server's RSS is sampled every 10 ms."""
    result, stop = FloodResult(start_mb=rss_mb(server.pid)), threading.Event()

    def watch() -> None:
        while not stop.is_set():
            result.peak_mb = max(result.peak_mb, rss_mb(server.pid))
            stop.wait(0.01)

    def call_honestly() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                honest()
                result.honest_latencies.append(time.perf_counter() - start)
            except Exception as err:  # noqa: BLE001 (every failure is a finding, recorded)
                result.honest_errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=watch, daemon=True)]
    if honest is not None:
        threads.append(threading.Thread(target=call_honestly, daemon=True))
    for thread in threads:
        thread.start()
    body = os.urandom(body_bytes)
    metadata = None if token is None else [("authorization", f"Bearer {token}")]
    options = [("grpc.max_send_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    try:
        with grpc.insecure_channel(server.address, options=options) as channel:
            call = channel.unary_unary(method)
            started = time.monotonic()
            for _ in range(rounds):
                calls = [call.future(body, metadata=metadata, timeout=60) for _ in range(concurrent)]
                for future in calls:
                    try:
                        future.result()
                        result.codes["OK"] += 1
                    except grpc.RpcError as err:
                        result.codes[err.code().name] += 1
            result.seconds = time.monotonic() - started
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    result.peak_mb = max(result.peak_mb, rss_mb(server.pid))
    return result

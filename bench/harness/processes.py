"""Servers the benchmarks start in their own processes (so client and server never share a GIL): a replay
shard exactly as operators run it, or the raw gRPC ceiling server. Each writes its port to a file; each is
stopped by its pid (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time


class Child:
    """A server process we started: waits for its port file; stopped by its pid with SIGTERM (then
    SIGKILL)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.port_file = os.path.join(workdir, f"{name}.port")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the child runs)
        self.proc = subprocess.Popen(
            [*argv, "--port-file", self.port_file],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
        self.port: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.wait_ready()}"

    def wait_ready(self, timeout: float = 60.0) -> int:
        """The port the child listens on, once it has written its port file."""
        if self.port is not None:
            return self.port
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(FileNotFoundError, ValueError), open(self.port_file) as f:
                self.port = int(f.read().strip())
                return self.port
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not write its port within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the child (idempotent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Children:
    """The children of one run, all stopped when the `with` block ends, whatever happened in it."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.started: list[Child] = []

    def start(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.workdir)
        self.started.append(child)
        return child

    def start_shard(self, name: str, capacity: int, *, seed: int = 0, alpha: float | None = None) -> Child:
        """A replay shard: `python -m apexrl.launcher replay --port 0 --port-file ...`, what operators run."""
        return self.start(name, shard_argv(capacity, seed=seed, alpha=alpha))

    def stop_all(self) -> None:
        for child in self.started:
            child.stop()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def shard_argv(capacity: int, *, seed: int, alpha: float | None = None) -> list[str]:
    argv = [
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
        str(seed),
    ]
    return argv if alpha is None else [*argv, "--alpha", str(alpha)]


def wait_healthy(children: list[Child], timeout: float = 60.0) -> None:
    """Wait until every shard answers its gRPC health check with SERVING."""
    from apexrl.common.grpc_util import wait_for_health

    for child in children:
        wait_for_health(child.address, timeout=timeout)

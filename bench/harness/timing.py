"""Timing loops: a warm-up that is not counted, then calls counted for a fixed time; and the CPU time the
client (this process) and a server process used meanwhile.

Only the standard library is imported: the cpprb worker runs this under an interpreter with just numpy and
cpprb.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """How long each figure runs: `warmup` seconds not counted, then `seconds` counted."""

    seconds: float
    warmup: float


@dataclass(frozen=True)
class Measurement:
    """Calls counted in `seconds`, and the cores (CPU seconds per wall second, warm-up included) that this
    process and the server process used while the figure ran (None: not measured)."""

    calls: int
    seconds: float
    client_cpu: float | None = None
    server_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.calls / self.seconds


def measure_loop(
    step: Callable[[], object], seconds: float, warmup: float, finish: Callable[[], object] | None = None
) -> tuple[int, float]:
    """Call step() for `warmup` seconds (at least once), then count calls for `seconds`; `finish` (e.g.
    waiting for acks or in-flight calls) runs after each phase and its time counts. Returns (calls, elapsed
    seconds)."""
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
        _count_responses(responses, credits, warmup)
        count, elapsed = _count_responses(responses, credits, seconds)
    finally:
        stop.set()
        credits.release()
    for _ in responses:  # drain: the request generator sees `stop` and half-closes the stream
        credits.release()
    return count, elapsed


def _count_responses(responses, credits: threading.Semaphore, seconds: float) -> tuple[int, float]:
    """Take responses (giving a credit back for each) until `seconds` have passed."""
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    for _ in responses:
        credits.release()
        count += 1
        if time.perf_counter() >= deadline:
            break
    return count, time.perf_counter() - t0


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(
    server_pid: int | None, measure: Callable[..., tuple[int, float]], *args, **kwargs
) -> Measurement:
    """Run one measurement (a function returning (calls, seconds)) and note the cores this process and the
    server process (when given) used meanwhile, warm-up included."""
    t0, c0 = time.perf_counter(), time.process_time()
    s0 = process_cpu_seconds(server_pid) if server_pid else 0.0
    calls, elapsed = measure(*args, **kwargs)
    wall = time.perf_counter() - t0
    server = (process_cpu_seconds(server_pid) - s0) / wall if server_pid else None
    return Measurement(calls, elapsed, (time.process_time() - c0) / wall, server)

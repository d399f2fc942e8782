"""The raw gRPC ceiling, measured in the same run as the apexrl figures: the same call shapes and message
sizes against `ceiling_server` (bytes only, no protobuf, its own process), through a channel made by the same
`grpc_util.make_channel` as the SDK's. An apexrl figure divided by its ceiling is the share of what Python
gRPC itself allows that apexrl reaches with protobuf, codec, table and sum tree on top."""

from __future__ import annotations

import os
import struct
import sys
import time

from harness.ceiling_server import ECHO_SERVICE
from harness.processes import Child, Children
from harness.timing import Measurement, Timing, measure_bidi, measure_loop, measure_window, with_cpu

SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ceiling_server.py")


def start_ceiling_server(children: Children, *, aio: bool = False) -> Child:
    """The ceiling server: gRPC's thread-pool server, or with `aio` the same handlers on grpc.aio."""
    if aio:
        return children.start("echo-aio", [sys.executable, SERVER_SCRIPT, "--aio"])
    return children.start("echo", [sys.executable, SERVER_SCRIPT])


def sized_request(request_bytes: int, reply_bytes: int) -> bytes:
    """A request of `request_bytes` (>= 8) whose first 8 bytes ask for a reply of `reply_bytes`."""
    return struct.pack("<Q", reply_bytes) + bytes(max(0, request_bytes - 8))


class CeilingClient:
    """Measures the ceiling server; every method returns a Measurement with both processes' CPU."""

    def __init__(self, server: Child, timing: Timing) -> None:
        from apexrl.common import grpc_util

        self.pid = server.pid
        self.timing = timing
        self.channel = grpc_util.make_channel(server.address)
        self._count = self.channel.stream_unary(f"/{ECHO_SERVICE}/Count")
        self._acked = self.channel.stream_stream(f"/{ECHO_SERVICE}/Acked")
        self._unary = self.channel.unary_unary(f"/{ECHO_SERVICE}/Unary")

    def client_stream(self, message_bytes: int) -> Measurement:
        """A client stream of messages of `message_bytes`, no answer per message (the server counts them)."""
        return with_cpu(self.pid, self._client_stream, sized_request(message_bytes, 0))

    def bidi(self, message_bytes: int, reply_bytes: int, window: int) -> Measurement:
        """A bidirectional stream, one answer of `reply_bytes` per message, at most `window` unanswered."""
        message = sized_request(message_bytes, reply_bytes)
        t = self.timing
        return with_cpu(self.pid, measure_bidi, self._acked, lambda: message, window, t.seconds, t.warmup)

    def unary(self, request_bytes: int, reply_bytes: int) -> Measurement:
        """Blocking unary calls."""
        message = sized_request(request_bytes, reply_bytes)
        t = self.timing
        return with_cpu(self.pid, measure_loop, lambda: self._unary(message), t.seconds, t.warmup)

    def unary_window(self, request_bytes: int, reply_bytes: int, window: int) -> Measurement:
        """Unary futures, `window` in flight."""
        message = sized_request(request_bytes, reply_bytes)
        t = self.timing
        return with_cpu(
            self.pid,
            measure_window,
            lambda: self._unary.future(message),
            lambda f: f.result(),
            window,
            t.seconds,
            t.warmup,
        )

    def _client_stream(self, message: bytes) -> tuple[int, float]:
        self._one_stream(message, self.timing.warmup)
        return self._one_stream(message, self.timing.seconds)

    def _one_stream(self, message: bytes, duration: float) -> tuple[int, float]:
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
        reply = self._count(requests())
        elapsed = time.perf_counter() - t0
        received, nbytes = struct.unpack("<QQ", reply)
        if received != sent or nbytes != sent * len(message):
            raise RuntimeError(
                f"ceiling server counted {received} messages / {nbytes} bytes, client sent {sent}"
            )
        return received, elapsed

    def close(self) -> None:
        self.channel.close()

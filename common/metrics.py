"""Prometheus helpers: one registry per server object (so tests can run several in one process) and an HTTP
exposition endpoint at http://HOST:PORT/metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

# Latency buckets in seconds, from 50 µs (an in-memory table op) to 10 s (a rate-limited call).
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> str:
    """Expose `registry` at http://host:port/metrics in a daemon thread (port 0 picks one, -1 serves nothing);
    return the URL, or "off". OSError when the port cannot be bound."""
    if port < 0:
        return "off"
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return f"http://{host}:{int(server.server_address[1])}/metrics"


class RpcMetrics:
    """Per-method request latency and error counts for one gRPC service."""

    def __init__(self, registry: CollectorRegistry, role: str) -> None:
        self.latency = Histogram(
            f"apexrl_{role}_request_duration_seconds",
            "Time spent handling one request (one message for streams), by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            f"apexrl_{role}_request_errors_total",
            "Requests answered with a non-OK status, by method and gRPC code",
            ["method", "code"],
            registry=registry,
        )

    @contextmanager
    def time(self, method: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(method).observe(time.perf_counter() - start)

"""Prometheus helpers: one registry per server object (so tests can run several in one process), an HTTP
exposition endpoint at http://HOST:PORT/metrics, and the series every process adds to its role's (TLS expiry).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from apexrl.common.addresses import join_host_port
from apexrl.common.tls_reload import expiries

# Latency buckets in seconds, from 50 µs (an in-memory table op) to 10 s (a rate-limited call).
LATENCY_BUCKETS = (
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> str:
    """Expose `registry` at http://host:port/metrics in a daemon thread (port 0 picks one, -1 serves nothing);
    return the URL, or "off". OSError when the port cannot be bound."""
    if port < 0:
        return "off"
    add_process_metrics(registry)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:  # taken since the start-up check (common/port_check.py): still name the port
        raise OSError(
            err.errno,
            f"cannot serve metrics on port {port} of {host} (--metrics-port): {err.strerror or err}",
        ) from None
    return f"http://{join_host_port(host, int(server.server_address[1]))}/metrics"


def add_process_metrics(registry: CollectorRegistry) -> None:
    """Register what every process exports beside its role's own series (serve_metrics does): the expiry of the
    TLS certificates it serves or presents, and the calls its servers refused (common/refusals.py)."""
    from apexrl.common.refusals import RefusalCollector

    registry.register(TlsExpiryCollector())
    registry.register(RefusalCollector())


class TlsExpiryCollector:
    """apexrl_tls_certificate_expiry_timestamp_seconds: when each TLS file this process's servers and channels use
    now expires (common/tls_reload.py follows renewals); no series without TLS."""

    name = "apexrl_tls_certificate_expiry_timestamp_seconds"
    label_names = (
        "file",
        "path",
    )  # read by scripts/metrics_doc.py: a process without TLS has no sample to show them

    def describe(self):
        return []

    def collect(self):
        family = GaugeMetricFamily(
            self.name,
            "When a TLS certificate file this process serves or presents expires (notAfter, Unix time): "
            "file=cert the earliest of its certificate chain, file=ca the earliest of the CA bundle it verifies peers "
            "with; path the file; follows renewals on disk",
            labels=list(self.label_names),
        )
        for (file, path), when in sorted(expiries().items()):
            family.add_metric([file, path], when)
        yield family


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


class ArrayHistogram:
    """A Prometheus histogram fed a whole numpy array per call (e.g. one value per sampled row): one searchsorted
    and one bincount instead of one `observe` per value (256 `observe` calls cost ~0.5 ms of a train step)."""

    def __init__(
        self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry
    ) -> None:
        import numpy as np

        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(
            len(buckets) + 1, dtype=np.int64
        )  # the last one: above every bound (+Inf only)
        self.total = 0.0
        self._lock = threading.Lock()  # a scrape reads counts and sum together
        registry.register(self)

    def observe_many(self, values) -> None:
        import numpy as np

        values = np.asarray(values, dtype=np.float64).ravel()
        counts = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        with self._lock:
            self.counts += counts
            self.total += float(values.sum())

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily

        with self._lock:
            cumulative, total = self.counts.cumsum(), self.total
        buckets = [(repr(float(b)), int(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", int(cumulative[-1])))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)

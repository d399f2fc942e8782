"""`apexrl replay`: run one replay shard until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from apexrl.common import grpc_util
from apexrl.common.files import atomic_write
from apexrl.common.metrics import serve_metrics
from apexrl.common.tls import describe, tls_of
from apexrl.replay_server.config import ReplayConfig

if TYPE_CHECKING:
    from apexrl.replay_server.table import ReplayTable

log = logging.getLogger("apexrl.replay")

CONFIG = ReplayConfig
HELP = "run one prioritized replay shard (gRPC ReplayService)"


def metrics_registry(table: ReplayTable) -> CollectorRegistry:
    """The shard's registry before create_replay_server adds the servicer's and table's metrics: the time the
    rate limiter held calls back (read from the table at scrape time)."""
    registry = CollectorRegistry()
    registry.register(_BlockedTimeCollector(table))
    return registry


class _BlockedTimeCollector:
    def __init__(self, table: ReplayTable) -> None:
        self._table = table

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            "apexrl_replay_rate_limiter_blocked_seconds",
            "Seconds during which calls were held back by the rate limiter (samples: also below "
            "min_size_to_sample), by call (insert, sample); concurrent waiters count once, so the rate is the "
            "fraction of time that side was blocked", labels=["call"])
        for call, seconds in self._table.blocked_seconds().items():
            family.add_metric([call], seconds)
        yield family


def run(config: ReplayConfig, stop: threading.Event) -> int:
    from apexrl.replay_server.service import create_replay_server
    from apexrl.replay_server.table import ReplayTable

    table = ReplayTable(config)
    tls = tls_of(config, serves=True)
    server, port, health, registry = create_replay_server(
        table, f"{config.host}:{config.port}", registry=metrics_registry(table),
        max_message_bytes=config.max_message_bytes, token=config.token, tls=tls,
        health_address=None if config.health_port is None else f"{config.host}:{config.health_port}",
    )
    metrics = serve_metrics(registry, config.metrics_port, config.host)
    log.info("replay shard serving on %s:%d (capacity %d, alpha %.2f, signature %s, %s%s); metrics %s",
             config.host, port, config.capacity, config.alpha, config.signature or "from first insert",
             describe(tls), "" if server.health_port is None else f", plaintext health on port {server.health_port}",
             metrics)
    if config.port_file:
        atomic_write(config.port_file, f"{port}\n")
    grpc_util.serve_until(stop, server, health, before_stop=table.close)
    info = table.info()
    log.info("replay shard stopped: %d rows held, %d inserted, %d sampled", info.size, info.inserted_total,
             info.sampled_total)
    return 0

"""`apexrl replay`: run one replay shard until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import threading

from apexrl.common import grpc_util
from apexrl.common.files import atomic_write
from apexrl.common.metrics import serve_metrics
from apexrl.replay_server.config import ReplayConfig

log = logging.getLogger("apexrl.replay")

CONFIG = ReplayConfig
HELP = "run one prioritized replay shard (gRPC ReplayService)"


def run(config: ReplayConfig, stop: threading.Event) -> int:
    from apexrl.replay_server.service import create_replay_server
    from apexrl.replay_server.table import ReplayTable

    table = ReplayTable(config)
    server, port, health, registry = create_replay_server(
        table, f"{config.host}:{config.port}", max_message_bytes=config.max_message_bytes, token=config.token,
    )
    metrics = serve_metrics(registry, config.metrics_port, config.host)
    log.info("replay shard serving on %s:%d (capacity %d, alpha %.2f, signature %s); metrics %s",
             config.host, port, config.capacity, config.alpha, config.signature or "from first insert", metrics)
    if config.port_file:
        atomic_write(config.port_file, f"{port}\n")
    grpc_util.serve_until(stop, server, health, before_stop=table.close)
    info = table.info()
    log.info("replay shard stopped: %d rows held, %d inserted, %d sampled", info.size, info.inserted_total,
             info.sampled_total)
    return 0

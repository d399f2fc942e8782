"""`apexrl params`: run a standalone parameter service until SIGTERM or Ctrl-C.

The learner hosts the same service in its own process by default; run it standalone when several learners or
external tools publish weights, or to test actors without a learner.
"""

from __future__ import annotations

import logging
import threading

from apexrl.common.serving import Serving
from apexrl.parameter_server.config import ParamsConfig
from apexrl.parameter_server.limits import PublishLimits

log = logging.getLogger("apexrl.params")

CONFIG = ParamsConfig
HELP = "run a standalone parameter service (versioned weights)"


def run(config: ParamsConfig, stop: threading.Event) -> int:
    from prometheus_client import CollectorRegistry

    from apexrl.parameter_server.service import create_parameter_server

    registry = CollectorRegistry()
    limits = PublishLimits.of(config)
    service = create_parameter_server(
        config.address(),
        registry=registry,
        chunk_bytes=config.chunk_bytes,
        max_message_bytes=config.max_message_bytes,
        limits=limits,
        tls=config.tls(),
        connections=config,
        call_limits=config,
        max_request_bytes=config.max_request_bytes,
        access=config.access(),
        health_address=config.health_address(),
    )
    serving = Serving(service.server, service.port, config, registry, log)
    serving.announce(
        "parameter service",
        f"chunks of {config.chunk_bytes} bytes, messages up to {config.max_message_bytes} bytes (requests "
        f"{config.max_request_bytes}), weights up to "
        f"{limits.max_weights_bytes} bytes, {limits.max_concurrent_publishes} publishes at once, idle publishes "
        f"aborted after {limits.publish_idle_timeout:g} s",
    )
    serving.until_stopped(stop)
    log.info("parameter service stopped at version %d", service.store.version)
    return 0

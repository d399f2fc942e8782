"""`apexrl params`: run a standalone parameter service until SIGTERM or Ctrl-C.

The learner hosts the same service in its own process by default; run it standalone when several learners or
external tools publish weights, or to test actors without a learner.
"""

from __future__ import annotations

import logging
import threading

from apexrl.common import grpc_util
from apexrl.common.access import AccessPolicy, describe_access
from apexrl.common.files import atomic_write
from apexrl.common.metrics import serve_metrics
from apexrl.common.tls import describe, tls_of
from apexrl.parameter_server.config import ParamsConfig
from apexrl.parameter_server.limits import PublishLimits

log = logging.getLogger("apexrl.params")

CONFIG = ParamsConfig
HELP = "run a standalone parameter service (versioned weights)"


def run(config: ParamsConfig, stop: threading.Event) -> int:
    from prometheus_client import CollectorRegistry

    from apexrl.parameter_server.service import create_parameter_server

    registry = CollectorRegistry()
    tls = tls_of(config, serves=True)
    limits = PublishLimits.of(config)
    service = create_parameter_server(
        f"{config.host}:{config.port}",
        registry=registry,
        chunk_bytes=config.chunk_bytes,
        max_message_bytes=config.max_message_bytes,
        limits=limits,
        tls=tls,
        connections=config,
        access=AccessPolicy.from_settings(config.token, config.role_tokens, config.certificate_roles),
        health_address=None if config.health_port is None else f"{config.host}:{config.health_port}",
    )
    server, port, store = service.server, service.port, service.store
    try:
        metrics = serve_metrics(registry, config.metrics_port, config.host)
    except OSError:
        server.stop(None).wait()
        raise
    log.info(
        "parameter service serving on %s:%d (chunks of %d bytes, messages up to %d bytes, weights up to %d "
        "bytes, %d publishes at once, idle publishes aborted after %g s, %s, %s%s); metrics %s",
        config.host,
        port,
        config.chunk_bytes,
        config.max_message_bytes,
        limits.max_weights_bytes,
        limits.max_concurrent_publishes,
        limits.publish_idle_timeout,
        describe_access(config),
        describe(tls),
        "" if config.health_port is None else f", plaintext health on port {config.health_port}",
        metrics,
    )
    if config.port_file:
        atomic_write(config.port_file, f"{port}\n")
    grpc_util.serve_until(stop, server)
    log.info("parameter service stopped at version %d", store.version)
    return 0

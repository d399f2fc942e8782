"""The one serving path of every server role (the replay shard, the parameter service, the learner hosting one):
its Prometheus endpoint, its start line, its port file, then serving until SIGTERM/Ctrl-C, then the drain.

In that order on purpose: the port file is what `apexrl launch` and the tests wait for, so it is written once the
server answers and its metrics are served; the start line names the port bound, the access mode, TLS, the health
port and the metrics URL, so one line says how to reach the role.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from apexrl.common.access import describe_access
from apexrl.common.files import atomic_write
from apexrl.common.grpc_util import DRAIN_GRACE_SECONDS, GracefulServer, drain, wait_for_stop
from apexrl.common.metrics import serve_metrics
from apexrl.common.serving_settings import ServingSettings
from apexrl.common.tls import describe


class Serving:
    """A started server announced (`announce`): serve it until `stop` (`until_stopped`), or around other work
    (the learner trains meanwhile, then `close`)."""

    def __init__(
        self,
        server: GracefulServer,
        port: int,
        settings: ServingSettings,
        registry: CollectorRegistry,
        log: logging.Logger,
    ) -> None:
        self.server = server
        self.port = port
        self.settings = settings
        self.registry = registry
        self.log = log
        self.metrics = "off"

    def describe(self) -> str:
        """How to reach it, for start lines: "ACCESS, TLS[, plaintext health on port N]"."""
        health = self.settings.health_port
        return f"{describe_access(self.settings)}, {describe(self.settings.tls())}" + (
            "" if health is None else f", plaintext health on port {health}"
        )

    def serve_metrics(self) -> str:
        """Serve the Prometheus endpoint (the server is stopped if its port cannot be bound); its URL or "off"."""
        try:
            self.metrics = serve_metrics(self.registry, self.settings.metrics_port, self.settings.host)
        except OSError:
            self.server.stop(None).wait()
            raise
        return self.metrics

    def write_port_file(self) -> None:
        if self.settings.port_file:
            atomic_write(self.settings.port_file, f"{self.port}\n")

    def announce(self, what: str, details: str) -> Serving:
        """Serve the metrics, log the start line ("`what` serving on HOST:PORT (`details`, ACCESS, TLS[,
        health]); metrics URL") and write the port file."""
        self.serve_metrics()
        self.log.info(
            "%s serving on %s (%s%s); metrics %s",
            what,
            self.settings.address(self.port),
            f"{details}, " if details else "",
            self.describe(),
            self.metrics,
        )
        self.write_port_file()
        return self

    def until_stopped(
        self,
        stop: threading.Event,
        *,
        grace: float = DRAIN_GRACE_SECONDS,
        before_stop: Callable[[], None] | None = None,
    ) -> None:
        """Serve until `stop` is set, then drain (grpc_util.drain: NOT_SERVING, `before_stop`, `grace`)."""
        wait_for_stop(stop)
        self.close(grace=grace, before_stop=before_stop)

    def close(
        self, *, grace: float = DRAIN_GRACE_SECONDS, before_stop: Callable[[], None] | None = None
    ) -> None:
        drain(self.server, grace=grace, before_stop=before_stop)

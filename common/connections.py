"""How a gRPC server treats its connections: keepalive pings to find dead peers, and closing connections that
sit idle or live too long. Without them a client that vanished (a killed actor behind a NAT, a half-open TCP
connection) holds its streams and their memory on the server until the kernel gives up, hours later.

Declared once here; the servers' settings dataclasses inherit it, and `server_options` turns it into gRPC channel
arguments (core's names: https://grpc.github.io/grpc/core/group__grpc__arg__keys.html).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.common.settings import setting


@dataclass(frozen=True)
class ConnectionPolicy:
    keepalive_seconds: float = setting(
        60.0,
        "seconds between the server's keepalive pings on a connection; a peer "
        "that does not answer within keepalive_timeout_seconds is dropped "
        "with its calls",
    )
    keepalive_timeout_seconds: float = setting(20.0, "seconds a keepalive ping may wait for its answer")
    max_connection_idle_seconds: float = setting(
        1800.0, "seconds a connection without calls stays open (clients reconnect by themselves); 0: forever"
    )
    max_connection_age_seconds: float = setting(
        0.0,
        "seconds after which the server asks a client to reconnect (calls in flight get 30 s to finish; an "
        "insert stream is resent on the new connection, exactly once): spreads clients over new shards "
        "behind a load balancer; 0: never",
    )

    def __post_init__(self) -> None:
        for name in ("keepalive_seconds", "keepalive_timeout_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 1):
                raise ValueError(f"{name} ({value}) must be a finite number of seconds >= 1")
        for name in ("max_connection_idle_seconds", "max_connection_age_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} ({value}) must be a finite number of seconds >= 0 (0: no limit)")

    def server_options(self) -> list[tuple[str, int]]:
        """gRPC server arguments for this policy. Clients may ping as often as every 10 s without being told off
        (their own keepalive, if any, must not be mistaken for abuse)."""
        options = [
            ("grpc.keepalive_time_ms", _ms(self.keepalive_seconds)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout_seconds)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ]
        if self.max_connection_idle_seconds:
            options.append(("grpc.max_connection_idle_ms", _ms(self.max_connection_idle_seconds)))
        if self.max_connection_age_seconds:
            options += [
                ("grpc.max_connection_age_ms", _ms(self.max_connection_age_seconds)),
                ("grpc.max_connection_age_grace_ms", 30_000),
            ]
        return options


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))

"""`apexrl replay` settings: the table's (TableConfig) plus the server's, declared once (see common/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.process import (
    health_port_setting,
    host_setting,
    metrics_port_setting,
    port_file_setting,
    tls_ca_setting,
    tls_cert_setting,
    tls_key_setting,
    token_setting,
)
from apexrl.common.settings import setting
from apexrl.common.tls import check_health_port, tls_of
from apexrl.replay_server.table import TableConfig

DEFAULT_PORT = 7000
DEFAULT_METRICS_PORT = 9000


@dataclass(frozen=True)
class ReplayConfig(TableConfig):
    """One replay shard process: its table, and where and how it serves."""

    host: str = host_setting()
    port: int = setting(DEFAULT_PORT, "gRPC port of the ReplayService; 0 picks a free port (see --port-file)")
    metrics_port: int = metrics_port_setting(DEFAULT_METRICS_PORT)
    max_message_bytes: int = setting(64 * 1024 * 1024, "largest gRPC message received or sent; larger ones are "
                                                       "refused with RESOURCE_EXHAUSTED")
    token: str | None = token_setting()
    tls_cert: str | None = tls_cert_setting()
    tls_key: str | None = tls_key_setting()
    tls_ca: str | None = tls_ca_setting()
    health_port: int | None = health_port_setting()
    port_file: str | None = port_file_setting()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not -1 <= self.metrics_port <= 65535 or not 0 <= self.port <= 65535:
            raise ValueError(f"port ({self.port}) and metrics_port ({self.metrics_port}) must be valid ports")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes ({self.max_message_bytes}) must be at least 1024")
        tls_of(self, serves=True)
        check_health_port(self.health_port, self.port)

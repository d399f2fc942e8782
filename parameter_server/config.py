"""`apexrl params` settings, declared once (see common/settings.py)."""

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
    token_file_setting,
    token_setting,
)
from apexrl.common.settings import setting
from apexrl.common.tls import check_health_port, tls_of
from apexrl.parameter_server.wire import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES

DEFAULT_PORT = 7100
DEFAULT_METRICS_PORT = 9100


@dataclass(frozen=True)
class ParamsConfig:
    """A standalone parameter service process."""

    host: str = host_setting()
    port: int = setting(DEFAULT_PORT, "gRPC port of the ParameterService; 0 picks a free port (see --port-file)")
    metrics_port: int = metrics_port_setting(DEFAULT_METRICS_PORT)
    chunk_bytes: int = setting(DEFAULT_CHUNK_BYTES, "largest piece of weight bytes in one Fetch message; a model of "
                                                    "any size travels as several messages, so keep it under the "
                                                    "clients' message limit")
    max_message_bytes: int = setting(DEFAULT_MAX_MESSAGE_BYTES, "largest gRPC message received or sent; chunking "
                                                                "makes gRPC's default 4 MiB enough for any model")
    token: str | None = token_setting()
    token_file: str | None = token_file_setting()
    tls_cert: str | None = tls_cert_setting()
    tls_key: str | None = tls_key_setting()
    tls_ca: str | None = tls_ca_setting()
    health_port: int | None = health_port_setting()
    port_file: str | None = port_file_setting()

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_bytes <= self.max_message_bytes:
            raise ValueError(f"chunk_bytes ({self.chunk_bytes}) must be in [1, max_message_bytes "
                             f"({self.max_message_bytes})]")
        tls_of(self, serves=True)
        check_health_port(self.health_port, self.port)

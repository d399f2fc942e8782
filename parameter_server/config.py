"""`apexrl params` settings, declared once (see common/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.access import certificate_roles_setting, check_access_settings, role_tokens_setting
from apexrl.common.addresses import check_listen
from apexrl.common.connections import ConnectionPolicy
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
from apexrl.parameter_server.limits import (
    DEFAULT_MAX_CONCURRENT_PUBLISHES,
    DEFAULT_MAX_WEIGHTS_BYTES,
    DEFAULT_PUBLISH_IDLE_TIMEOUT,
    PublishLimits,
)
from apexrl.parameter_server.wire import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES

DEFAULT_PORT = 7100
DEFAULT_METRICS_PORT = 9100


@dataclass(frozen=True)
class ParamsConfig(ConnectionPolicy):
    """A standalone parameter service process."""

    host: str = host_setting()
    port: int = setting(
        DEFAULT_PORT, "gRPC port of the ParameterService; 0 picks a free port (see --port-file)"
    )
    metrics_port: int = metrics_port_setting(DEFAULT_METRICS_PORT)
    chunk_bytes: int = setting(
        DEFAULT_CHUNK_BYTES,
        "largest piece of weight bytes in one Fetch message; a model of "
        "any size travels as several messages, so keep it under the "
        "clients' message limit",
    )
    max_message_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES,
        "largest gRPC message received or sent; chunking makes gRPC's default 4 MiB enough for any model",
    )
    # What publishers may make the service hold: at most max_concurrent_publishes x max_weights_bytes.
    max_weights_bytes: int = setting(
        DEFAULT_MAX_WEIGHTS_BYTES,
        "largest weights version accepted, in tensor bytes: a Publish declaring more is "
        "refused with RESOURCE_EXHAUSTED before any byte is buffered",
    )
    max_concurrent_publishes: int = setting(
        DEFAULT_MAX_CONCURRENT_PUBLISHES,
        "Publish calls served at once; one more is refused with "
        "RESOURCE_EXHAUSTED (Fetch and GetVersion are not limited)",
    )
    publish_idle_timeout: float = setting(
        DEFAULT_PUBLISH_IDLE_TIMEOUT,
        "seconds a Publish stream may go without a message before it is aborted "
        "(DEADLINE_EXCEEDED), freeing its slot and its buffered bytes",
    )
    token: str | None = token_setting()
    token_file: str | None = token_file_setting()
    role_tokens: str | None = role_tokens_setting()
    certificate_roles: bool = certificate_roles_setting()
    tls_cert: str | None = tls_cert_setting()
    tls_key: str | None = tls_key_setting()
    tls_ca: str | None = tls_ca_setting()
    health_port: int | None = health_port_setting()
    port_file: str | None = port_file_setting()

    def __post_init__(self) -> None:
        ConnectionPolicy.__post_init__(self)
        check_listen(self.host, self.port, self.metrics_port)
        if not 1 <= self.chunk_bytes <= self.max_message_bytes:
            raise ValueError(
                f"chunk_bytes ({self.chunk_bytes}) must be in [1, max_message_bytes "
                f"({self.max_message_bytes})]"
            )
        PublishLimits.of(self)
        tls = tls_of(self, serves=True)
        check_access_settings(
            self.token, self.role_tokens, self.certificate_roles, tls is not None and tls.mutual
        )
        check_health_port(self.health_port, self.port)

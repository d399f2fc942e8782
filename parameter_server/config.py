"""`apexrl params` settings, declared once (see common/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.call_limits import CallLimitSettings
from apexrl.common.connections import ConnectionPolicy
from apexrl.common.process import metrics_port_setting
from apexrl.common.serving_settings import ServingSettings
from apexrl.common.settings import setting
from apexrl.parameter_server.limits import (
    DEFAULT_MAX_CONCURRENT_PUBLISHES,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_WEIGHTS_BYTES,
    DEFAULT_PUBLISH_IDLE_TIMEOUT,
    DEFAULT_PUBLISH_MAX_SECONDS,
    PublishLimits,
)
from apexrl.parameter_server.wire import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES

DEFAULT_PORT = 7100
DEFAULT_METRICS_PORT = 9100


@dataclass(frozen=True)
class ParamsConfig(ServingSettings, CallLimitSettings, ConnectionPolicy):
    """A standalone parameter service process: its limits, and where and how it serves (ServingSettings)."""

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
        "largest gRPC message sent; chunking makes gRPC's default 4 MiB enough for any model",
    )
    max_request_bytes: int = setting(
        DEFAULT_MAX_REQUEST_BYTES,
        "largest request message received (a Publish chunk is 1 MiB of weights and the header): gRPC refuses a "
        "larger one with RESOURCE_EXHAUSTED from its length prefix, before buffering it",
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
        "RESOURCE_EXHAUSTED (Fetch and GetVersion: max_concurrent_calls)",
    )
    publish_idle_timeout: float = setting(
        DEFAULT_PUBLISH_IDLE_TIMEOUT,
        "seconds a Publish stream may go without a message before it is aborted "
        "(DEADLINE_EXCEEDED), freeing its slot and its buffered bytes",
    )
    publish_max_seconds: float = setting(
        DEFAULT_PUBLISH_MAX_SECONDS,
        "seconds a whole Publish may take, however often its messages come, before it is aborted "
        "(DEADLINE_EXCEEDED): a trickle of bytes holds a slot no longer",
    )

    def __post_init__(self) -> None:
        ConnectionPolicy.__post_init__(self)
        CallLimitSettings.__post_init__(self)
        self.check_serving()
        if not 1 <= self.chunk_bytes <= self.max_message_bytes:
            raise ValueError(
                f"chunk_bytes ({self.chunk_bytes}) must be in [1, max_message_bytes "
                f"({self.max_message_bytes})]"
            )
        if self.max_request_bytes <= DEFAULT_CHUNK_BYTES:
            raise ValueError(
                f"max_request_bytes ({self.max_request_bytes}) must exceed the {DEFAULT_CHUNK_BYTES} bytes of weights "
                f"a Publish message carries"
            )
        PublishLimits.of(self)

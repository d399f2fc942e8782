"""What a server lets any peer make it hold in memory, before and after authentication: calls open at once (per
server and per connection), unary requests being received at once, and each method's largest request.

gRPC receives a unary call's whole request before any Python code sees the call, up to the server's message
limit: 16 concurrent 60 MiB calls without a credential once took a shard from 70 MB to 2.1 GB, and a parameter
service from 68 MB to 1.6 GB. The servers now (common/aio_grpc.py; bounds in docs/security.md, "Memory under a flood";
figures in bench/README.md, `flood_bench.py`):

- refuse a call without a credential, or one its role may not make, without reading its request: gRPC holds
  only what HTTP/2's flow-control window let in before the refusal;
- receive a unary request only in one of `max_reading_requests` slots, all callers together (health checks, open
  to anyone, in one slot of their own), within `request_read_seconds`; a call waiting for a slot holds its
  flow-control window, not its request;
- refuse a request larger than its method's limit with RESOURCE_EXHAUSTED: the largest methods (a shard's Insert)
  may send up to the server's `max_message_bytes`, every other method `max_request_bytes`; where no method needs
  more (the parameter service), gRPC itself refuses a larger one from its length prefix, before buffering it;
- cap calls open at once per server (`max_concurrent_calls`: grpc.aio refuses one more with RESOURCE_EXHAUSTED
  without reading it) and streams per connection (`max_streams_per_connection`, HTTP/2's
  SETTINGS_MAX_CONCURRENT_STREAMS: a client queues calls beyond it);
- give freed memory back to the system every `trim_memory_seconds` (common/memory.py).

Streaming requests (Insert, StreamUpdatePriorities, Publish) take no slot: a stream waits for its next message for
as long as its writer is idle, and a slot held meanwhile would stop every other read. Each stream receives one
message at a time, so streams hold at most one message each (Insert: max_message_bytes; docs/security.md).
Settings are declared once here; ReplayConfig and ParamsConfig inherit them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from apexrl.common.memory import DEFAULT_TRIM_SECONDS
from apexrl.common.settings import setting

DEFAULT_MAX_CONCURRENT_CALLS = 4096
DEFAULT_MAX_STREAMS_PER_CONNECTION = 1024
DEFAULT_MAX_READING_REQUESTS = 4
DEFAULT_REQUEST_READ_SECONDS = 10.0


@dataclass(frozen=True)
class CallLimitSettings:
    """The limits every server role shares, declared once (each role's `max_request_bytes` is its own)."""

    max_concurrent_calls: int = setting(
        DEFAULT_MAX_CONCURRENT_CALLS,
        "calls (streams included) the server serves at once, all callers together; one more is refused with "
        "RESOURCE_EXHAUSTED before its request is read",
    )
    max_streams_per_connection: int = setting(
        DEFAULT_MAX_STREAMS_PER_CONNECTION,
        "calls one connection may have open at once at the HTTP/2 level (SETTINGS_MAX_CONCURRENT_STREAMS): a "
        "client queues further calls, a peer that ignores it has them reset",
    )
    max_reading_requests: int = setting(
        DEFAULT_MAX_READING_REQUESTS,
        "unary requests received at once, all callers together: a request waits for a free slot before gRPC "
        "receives it, so requests being received hold at most this many x 2 x the largest request (gRPC's "
        "buffer and its Python copy); health checks have one slot of their own, streaming requests take none",
    )
    request_read_seconds: float = setting(
        DEFAULT_REQUEST_READ_SECONDS,
        "longest a unary call's request may take to arrive once its reading slot is given (then "
        "DEADLINE_EXCEEDED): a peer trickling bytes holds a slot no longer",
    )
    trim_memory_seconds: float = setting(
        DEFAULT_TRIM_SECONDS,
        "seconds between two returns of freed memory to the system (glibc malloc_trim), so that what a flood "
        "of requests made the server allocate does not stay in its RSS; 0: never",
    )

    def __post_init__(self) -> None:
        for name in ("max_concurrent_calls", "max_streams_per_connection", "max_reading_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be a positive integer")
        if not (math.isfinite(self.request_read_seconds) and self.request_read_seconds > 0):
            raise ValueError(
                f"request_read_seconds ({self.request_read_seconds}) must be a finite number of seconds > 0"
            )
        if not (math.isfinite(self.trim_memory_seconds) and self.trim_memory_seconds >= 0):
            raise ValueError(
                f"trim_memory_seconds ({self.trim_memory_seconds}) must be a finite number of seconds >= 0 (0: never)"
            )


@dataclass(frozen=True)
class CallLimits:
    """The limits one server applies (AioServerThread): `large_methods` ("/package.Service/Method") may send
    requests up to the server's max_message_bytes, every other method up to `max_request_bytes`."""

    max_request_bytes: int
    large_methods: frozenset[str] = frozenset()
    max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    max_reading_requests: int = DEFAULT_MAX_READING_REQUESTS
    request_read_seconds: float = DEFAULT_REQUEST_READ_SECONDS
    trim_memory_seconds: float = DEFAULT_TRIM_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.max_request_bytes, bool) or self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes ({self.max_request_bytes!r}) must be at least 1024")
        CallLimitSettings.__post_init__(self)  # type: ignore[arg-type] (the same three fields)

    @classmethod
    def of(
        cls, settings: CallLimitSettings, max_request_bytes: int, large_methods: Iterable[str] = ()
    ) -> CallLimits:
        return cls(
            max_request_bytes,
            frozenset(large_methods),
            settings.max_concurrent_calls,
            settings.max_streams_per_connection,
            settings.max_reading_requests,
            settings.request_read_seconds,
            settings.trim_memory_seconds,
        )

    def request_limit(self, method: str) -> int | None:
        """The largest request message of `method`; None: the server's own (max_message_bytes)."""
        return None if method in self.large_methods else self.max_request_bytes

    def receive_limit(self, max_message_bytes: int) -> int:
        """gRPC's own receive limit for a server whose largest message is `max_message_bytes`: that when a method
        needs it, else max_request_bytes (then gRPC refuses a larger request from its length prefix)."""
        return max_message_bytes if self.large_methods else min(max_message_bytes, self.max_request_bytes)

    def server_options(self) -> list[tuple[str, int]]:
        return [("grpc.max_concurrent_streams", self.max_streams_per_connection)]

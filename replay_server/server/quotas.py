"""What one caller, and all callers together, may hold open on a replay shard: calls per connection, calls waiting
for the table (rate limiter, minimum size), insert bytes those waiting calls hold (requests and decoded arrays), and how long any call
may wait. Without these, one client could hold 1,500 waiting Samples on one channel, or park gigabytes of decoded
inserts behind the rate limiter (docs/security.md, "Limits").

A caller over a limit gets RESOURCE_EXHAUSTED naming the limit and its setting; every refusal is counted in
`apexrl_replay_quota_refusals_total{limit}`. Pure bookkeeping: no gRPC, called from the servicer on its loop.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from apexrl.common.errors import ResourceExhaustedError
from apexrl.common.settings import setting

LIMITS = ("calls_per_connection", "waiting_calls", "waiting_insert_bytes")


@dataclass(frozen=True)
class QuotaSettings:
    """The limits, declared once (ReplayConfig inherits them)."""

    max_calls_per_connection: int = setting(
        256,
        "calls one connection (client address and port) may have open at once: insert streams, samples, "
        "updates, ...; more: RESOURCE_EXHAUSTED",
    )
    max_waiting_calls: int = setting(
        4096,
        "calls all clients together may have waiting for the table (rate limiter, minimum size); more: "
        "RESOURCE_EXHAUSTED",
    )
    max_waiting_insert_bytes: int = setting(
        256 * 1024 * 1024,
        "bytes that waiting inserts may hold, all together: each its request message and the arrays decoded "
        "from it; an insert that would go over it is refused with RESOURCE_EXHAUSTED (its data is not stored)",
    )
    max_wait_seconds: float = setting(
        60.0,
        "longest any call waits for the table, whatever its own deadline (a call without one included); "
        "then DEADLINE_EXCEEDED (an insert's ack: the client resends it)",
    )

    def __post_init__(self) -> None:
        for name in ("max_calls_per_connection", "max_waiting_calls", "max_waiting_insert_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        if not (math.isfinite(self.max_wait_seconds) and self.max_wait_seconds > 0):
            raise ValueError(
                f"max_wait_seconds ({self.max_wait_seconds}) must be a finite number of seconds > 0"
            )


class Quotas:
    """The shard's counters against QuotaSettings."""

    def __init__(self, settings: QuotaSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self._calls: Counter[str] = Counter()
        self.waiting = 0
        self.waiting_bytes = 0
        self._refusals = PromCounter(
            "apexrl_replay_quota_refusals",
            "Calls refused with RESOURCE_EXHAUSTED because "
            "a quota was reached, by limit (calls_per_connection, waiting_calls, "
            "waiting_insert_bytes)",
            ["limit"],
            registry=registry,
        )
        configured = Gauge(
            "apexrl_replay_quota_limit",
            "Each quota's setting, by limit (calls_per_connection and "
            "waiting_calls in calls, waiting_insert_bytes in bytes), to compare usage with",
            ["limit"],
            registry=registry,
        )
        for limit, value in zip(
            LIMITS,
            (
                settings.max_calls_per_connection,
                settings.max_waiting_calls,
                settings.max_waiting_insert_bytes,
            ),
            strict=True,
        ):
            self._refusals.labels(limit)
            configured.labels(limit).set(value)
        Gauge(
            "apexrl_replay_open_calls",
            "Calls open on this shard, all connections together",
            registry=registry,
        ).set_function(lambda: sum(self._calls.values()))
        Gauge(
            "apexrl_replay_waiting_insert_bytes",
            "Bytes held by inserts waiting for the table (their requests and the arrays decoded from them)",
            registry=registry,
        ).set_function(lambda: self.waiting_bytes)

    @contextmanager
    def call(self, peer: str) -> Iterator[None]:
        """One call of `peer` (its connection) open for the duration."""
        if self._calls[peer] >= self.settings.max_calls_per_connection:
            raise self._refuse(
                "calls_per_connection",
                f"connection {peer} already has {self._calls[peer]} calls "
                f"open, the limit (max_calls_per_connection)",
            )
        self._calls[peer] += 1
        try:
            yield
        finally:
            self._calls[peer] -= 1
            if not self._calls[peer]:
                del self._calls[peer]

    @contextmanager
    def waiting_call(self, held_bytes: int = 0) -> Iterator[None]:
        """A call waiting for the table, holding `held_bytes` of decoded data, for the duration."""
        if self.waiting >= self.settings.max_waiting_calls:
            raise self._refuse(
                "waiting_calls",
                f"{self.waiting} calls are already waiting for the table, the limit (max_waiting_calls)",
            )
        if held_bytes and self.waiting_bytes + held_bytes > self.settings.max_waiting_insert_bytes:
            raise self._refuse(
                "waiting_insert_bytes",
                f"waiting inserts hold {self.waiting_bytes:,} bytes, and this batch's {held_bytes:,} "
                f"bytes would go over the limit (max_waiting_insert_bytes) of",
            )
        self.waiting += 1
        self.waiting_bytes += held_bytes
        try:
            yield
        finally:
            self.waiting -= 1
            self.waiting_bytes -= held_bytes

    def _refuse(self, limit: str, what: str) -> ResourceExhaustedError:
        self._refusals.labels(limit).inc()
        value = {
            "calls_per_connection": self.settings.max_calls_per_connection,
            "waiting_calls": self.settings.max_waiting_calls,
            "waiting_insert_bytes": self.settings.max_waiting_insert_bytes,
        }[limit]
        setting = "--max-" + limit.replace("_", "-")
        hint = " (each client object has a connection of its own)" if limit == "calls_per_connection" else ""
        return ResourceExhaustedError(f"{what} {value:,}: raise the shard's {setting}{hint}")

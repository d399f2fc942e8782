"""When a table lets an insert or a sample through: the rate limiter, the minimum size, a refusal while a checkpoint
is restored, and shutdown.

The table never blocks: a call that may not go on yet raises `NotReadyError` at once, and the one wait is the
server's (waits.py: the call is tried again, on the event loop, each time the table changes). The time a side was
held back is counted from its first refusal to its admission (BlockedTime).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.replay_server.core.rate_limiter import BlockedTime, RateLimiter
from apexrl.replay_server.core.table_config import TableConfig


class NotReadyError(DeadlineExceededError):
    """The rate limiter or the minimum size holds the call back for now; `reason` says which (waits.py tries it
    again as the table changes, and answers DEADLINE_EXCEEDED with the reason when the call's time runs out)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} not ready: {reason}")
        self.reason = reason


class Admission:
    """The table's gate. Every method runs under the table's lock."""

    def __init__(self, config: TableConfig, size: Callable[[], int]) -> None:
        self._config = config
        self._size = size
        self.limiter = self._fresh_limiter()
        self.blocked = {"insert": BlockedTime(), "sample": BlockedTime()}  # seconds held back, by call
        self.closed = False
        self.unavailable: str | None = None  # why calls are refused for now (a restore in progress), or None

    def _fresh_limiter(self) -> RateLimiter:
        return RateLimiter(
            min_size=self._config.min_size_to_sample,
            samples_per_insert=self._config.samples_per_insert,
            tolerance=self._config.samples_per_insert_tolerance,
        )

    def check_available(self) -> None:
        """UnavailableError while the table refuses calls (see refuse)."""
        if self.unavailable is not None:
            raise UnavailableError(self.unavailable)

    def refuse(self, reason: str | None) -> None:
        """Refuse calls with `reason`, or serve them again with None; the limiter starts afresh then (rows restored
        or replayed from the log earn no samples)."""
        if reason is None and self.unavailable is not None:
            self.limiter = self._fresh_limiter()
        self.unavailable = reason

    def can_sample(self) -> bool:
        return self.limiter.can_sample(self._size())

    def not_ready_reason(self) -> str:
        """Why a sample or insert is held back now (for error messages)."""
        size, least = self._size(), self._config.min_size_to_sample
        if size < least:
            return f"table holds {size} rows, fewer than min_size_to_sample ({least})"
        return f"rate limiter: {self.limiter.describe()}"

    def admit_insert(self) -> None:
        self._admit(self.limiter.can_insert(), "insert")

    def admit_sample(self) -> None:
        self._admit(self.can_sample(), "sample")

    def _admit(self, ready: bool, what: str) -> None:
        """Let the call through, or raise NotReadyError (UnavailableError once the table is closed); the held-back
        clock is kept either way."""
        if self.closed:
            raise UnavailableError("replay table is shutting down")
        clock = self.blocked[what]
        if not ready:
            clock.refused(time.monotonic())
            raise NotReadyError(what, self.not_ready_reason())
        if clock.waiting:
            clock.admitted(time.monotonic())

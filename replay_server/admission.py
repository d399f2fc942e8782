"""When a table lets an insert or a sample through: the rate limiter, the minimum size, a refusal while a checkpoint
is restored, and shutdown; and the blocking wait on the table's condition until it does.

The servicer holds calls back without blocking a thread (waits.py) and asks with `timeout=0`; the blocking wait
serves in-process users of the table. Both count the time a side was held back (BlockedTime).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.replay_server.rate_limiter import BlockedTime, RateLimiter
from apexrl.replay_server.table_config import TableConfig

# How often a blocked call re-checks whether its caller is still there.
_WAIT_SLICE_SECONDS = 0.25


class Admission:
    """The table's gate. Every method runs under the table's lock (`cond`), which the wait releases."""

    def __init__(self, config: TableConfig, cond: threading.Condition, size: Callable[[], int]) -> None:
        self._config = config
        self._cond = cond
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
        """Why a sample or insert would wait now (for error messages)."""
        size, least = self._size(), self._config.min_size_to_sample
        if size < least:
            return f"table holds {size} rows, fewer than min_size_to_sample ({least})"
        return f"rate limiter: {self.limiter.describe()}"

    def wait_to_insert(self, timeout: float | None, is_active: Callable[[], bool] | None) -> None:
        self._wait(lambda: self.limiter.can_insert(), timeout, is_active, "insert")

    def wait_to_sample(self, timeout: float | None, is_active: Callable[[], bool] | None) -> None:
        self._wait(self.can_sample, timeout, is_active, "sample")

    def _wait(
        self,
        ready: Callable[[], bool],
        timeout: float | None,
        is_active: Callable[[], bool] | None,
        what: str,
    ) -> None:
        """Wait (the lock released while waiting) until ready(); raise on deadline, abandonment or shutdown."""
        deadline = None if timeout is None else time.monotonic() + timeout
        clock = self.blocked[what]
        while True:
            if self.closed:
                raise UnavailableError("replay table is shutting down")
            if ready():
                if clock.waiting:
                    clock.admitted(time.monotonic())
                return
            clock.refused(time.monotonic())
            remaining = _WAIT_SLICE_SECONDS if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceededError(f"{what} waited until its deadline: {self.not_ready_reason()}")
            if is_active is not None and not is_active():
                raise DeadlineExceededError(f"{what} abandoned: the caller went away")
            self._cond.wait(min(remaining, _WAIT_SLICE_SECONDS))

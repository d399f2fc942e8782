"""Calls the table holds back (the rate limiter, the minimum size) waited for on the server's event loop: the one
wait there is. The table answers at once; while a call is not ready (NotReadyError) it is tried again each time the
table changes (`Changes`, woken by every insert, sample and update), until the call's deadline or the shard's
max_wait_seconds. Waiting calls cost a coroutine, not a thread, and count against the waiting quotas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import grpc
from prometheus_client import CollectorRegistry, Gauge

from apexrl.common.aio_grpc import Changes, Lane
from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.replay_server.core.admission import NotReadyError
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.server.quotas import Quotas

T = TypeVar("T")
# How often a waiting call re-checks its deadline and its caller when nothing changes.
_WAIT_SLICE_SECONDS = 0.25


class Waits:
    """The table's waiting calls: `when_ready` retries a table call as the table changes; `notify` after a change;
    `close` answers every waiting call UNAVAILABLE."""

    def __init__(self, table: ReplayTable, quotas: Quotas, registry: CollectorRegistry) -> None:
        self.table = table
        self.quotas = quotas
        self.changes = Changes()
        self.closing = False
        self._waiting = Gauge(
            "apexrl_replay_waiting_calls",
            "Calls held back by the rate limiter or the minimum size, waiting for the table to change",
            ["call"],
            registry=registry,
        )
        for call in ("insert", "sample"):
            self._waiting.labels(call)

    def notify(self) -> None:
        """The table changed: waiting calls try again."""
        self.changes.notify()

    def close(self) -> None:
        """The server is stopping: every waiting call answers UNAVAILABLE."""
        self.closing = True
        self.changes.notify()

    async def when_ready(
        self,
        attempt: Callable[[], T],
        context: grpc.aio.ServicerContext,
        what: str,
        lane: Lane | None = None,
        held_bytes: Callable[[], int] = lambda: 0,
    ) -> T:
        """attempt() (in `lane`'s turn when given) until it does not raise NotReadyError,
        waiting for table changes in between, up to the call's deadline or the shard's max_wait_seconds, whichever
        comes first; then DeadlineExceededError naming what held it back. While it waits the call counts against
        the waiting quotas (with the `held_bytes()` of decoded data it keeps): ResourceExhaustedError when full."""
        try:
            return attempt() if lane is None else await lane.run(attempt)
        except NotReadyError:
            pass
        with self.quotas.waiting_call(held_bytes()):
            return await self._wait_until_ready(attempt, context, what, lane)

    async def _wait_until_ready(
        self, attempt: Callable[[], T], context: grpc.aio.ServicerContext, what: str, lane: Lane | None
    ) -> T:
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        longest = self.quotas.settings.max_wait_seconds
        deadline = loop.time() + (longest if remaining is None else min(remaining, longest))
        while True:
            if self.closing:
                raise UnavailableError("replay shard is shutting down")
            if loop.time() >= deadline:
                raise DeadlineExceededError(
                    f"{what} waited until its deadline (at most max_wait_seconds "
                    f"{longest:g}): {self.table.not_ready_reason()}"
                )
            if context.done():
                raise DeadlineExceededError(f"{what} abandoned: the caller went away")
            with self._waiting.labels(what).track_inprogress():
                await self.changes.wait(max(0.0, min(_WAIT_SLICE_SECONDS, deadline - loop.time())))
            try:
                return attempt() if lane is None else await lane.run(attempt)
            except NotReadyError:
                continue

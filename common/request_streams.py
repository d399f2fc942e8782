"""RequestStreams: the request streams an asyncio servicer is reading, each read ahead by a task of its own, so
that a stopping server ends them itself.

A long-lived stream (an actor's Insert stream, a learner's priority stream) never ends on its own. Left to
grpc.aio, a stopping server cancels its handler when the grace period runs out, and gRPC logs the cancellation
as an unhandled exception with a traceback. `close()` ends every stream at its next read instead, with
UNAVAILABLE: the client resends what was not acknowledged, to this shard once it is back or to another.

Reading ahead also lets a consumer take what queued up together: `steps` hands out lists of the requests that
arrived while it handled the previous list (a priority stream applies each list in one table call).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

from apexrl.common.errors import UnavailableError

T = TypeVar("T")
_END = object()  # the client closed its side of the stream
_CLOSED = object()  # close() was called


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass(eq=False)
class _Reading:
    queue: asyncio.Queue
    reader: asyncio.Task


class RequestStreams:
    """The streams open on one servicer (see the module docstring). Used on the server's event loop only."""

    def __init__(self, closed_message: str = "the server is shutting down") -> None:
        self._closed_message = closed_message
        self._open: set[_Reading] = set()
        self._closed = False

    def __len__(self) -> int:
        """Streams being read now."""
        return len(self._open)

    async def each(self, requests: AsyncIterator[T]) -> AsyncIterator[T]:
        """The stream's requests one by one, in order (one read ahead); see `steps` for how it ends."""
        async for step in self.steps(requests, most=1):
            yield step[0]

    async def steps(self, requests: AsyncIterator[T], most: int = 64) -> AsyncIterator[list[T]]:
        """Lists of 1 .. `most` requests, in order: each the requests read while the consumer handled the previous
        list. An error of the request stream is raised after the requests read before it were yielded; at most
        `most` requests are read ahead (flow control stays with gRPC). Once `close()` is called, the next read
        raises UnavailableError (requests read but not yet handed out are dropped: unacknowledged, so resent)."""
        if self._closed:
            raise UnavailableError(self._closed_message)
        queue: asyncio.Queue = asyncio.Queue(maxsize=most)

        async def read() -> None:
            try:
                async for request in requests:
                    await queue.put(request)
            except asyncio.CancelledError:
                raise
            except BaseException as err:  # noqa: BLE001 (handed to the consumer, which raises it)
                await queue.put(_Failed(err))
                return
            await queue.put(_END)

        reading = _Reading(queue, asyncio.ensure_future(read()))
        self._open.add(reading)
        try:
            item = await queue.get()
            while True:
                step: list[T] = []
                while not (item is _END or item is _CLOSED or isinstance(item, _Failed)):
                    step.append(item)
                    if len(step) >= most or queue.empty():
                        item = None
                        break
                    item = queue.get_nowait()
                if self._closed:
                    raise UnavailableError(self._closed_message)
                if step:
                    yield step
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                item = await queue.get()
        finally:
            self._open.discard(reading)
            reading.reader.cancel()

    def close(self) -> None:
        """End every open stream at its next read (UNAVAILABLE), and refuse new ones."""
        self._closed = True
        for reading in self._open:
            reading.reader.cancel()
            # A consumer waiting for a request wakes up; one busy with a full queue sees `_closed` at its next read.
            with contextlib.suppress(asyncio.QueueFull):
                reading.queue.put_nowait(_CLOSED)

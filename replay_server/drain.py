"""drain_requests: a request stream read as steps, each step every request that arrived while the last was handled.

A priority stream's requests are cheap to apply together and costly one by one (each table call takes the lock
and walks the sum tree), so the servicer reads ahead in a task of its own and applies what queued up in one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def drain_requests(requests: AsyncIterator[T], most: int = 64) -> AsyncIterator[list[T]]:
    """Lists of 1 .. `most` requests, in order: each the requests read while the consumer handled the previous
    list. An error of the request stream is raised after the requests read before it were yielded; at most
    `most` requests are read ahead (flow control stays with gRPC)."""
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

    reader = asyncio.ensure_future(read())
    try:
        item = await queue.get()
        while True:
            step: list[T] = []
            while item is not _END and not isinstance(item, _Failed):
                step.append(item)
                if len(step) >= most or queue.empty():
                    item = None
                    break
                item = queue.get_nowait()
            if step:
                yield step
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            item = await queue.get()
    finally:
        reader.cancel()

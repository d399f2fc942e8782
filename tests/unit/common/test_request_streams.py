"""RequestStreams (common/request_streams.py): a request stream read as steps of what queued up, in order, at most
`most` per step; an error of the stream comes after the requests read before it; close() ends every open stream
with UNAVAILABLE at its next read, whether it waits for a request or is busy."""

from __future__ import annotations

import asyncio

import pytest

from apexrl.common.errors import UnavailableError
from apexrl.common.request_streams import RequestStreams


async def _items(n: int, error: BaseException | None = None):
    for i in range(n):
        yield i
    if error is not None:
        raise error


async def _forever(sent: list[int]):
    """A client that sends 0, 1, 2 and then keeps its stream open (an idle actor)."""
    for i in range(3):
        sent.append(i)
        yield i
    await asyncio.Event().wait()


def _steps(
    n: int, most: int, error: BaseException | None = None
) -> tuple[list[list[int]], BaseException | None]:
    async def run():
        steps, raised = [], None
        try:
            async for step in RequestStreams().steps(_items(n, error), most=most):
                steps.append(step)
                await asyncio.sleep(0)  # the consumer is busy: more requests queue up meanwhile
        except ValueError as err:
            raised = err
        return steps, raised

    return asyncio.run(run())


def test_requests_that_queued_up_come_together_in_order_at_most_most_per_step():
    steps, raised = _steps(100, most=16)
    assert raised is None
    assert [i for step in steps for i in step] == list(range(100))
    assert all(1 <= len(step) <= 16 for step in steps)
    assert max(len(step) for step in steps) > 1  # ready requests were taken together


def test_an_error_comes_after_the_requests_before_it():
    bad = ValueError("undecodable request")
    steps, raised = _steps(5, most=4, error=bad)
    assert raised is bad
    assert [i for step in steps for i in step] == list(range(5))


@pytest.mark.parametrize("n", [0, 1])
def test_short_streams(n):
    steps, raised = _steps(n, most=4)
    assert raised is None and [i for step in steps for i in step] == list(range(n))


def test_each_hands_out_requests_one_by_one_in_order():
    async def run():
        return [request async for request in RequestStreams().each(_items(10))]

    assert asyncio.run(run()) == list(range(10))


def test_close_ends_a_stream_that_waits_for_its_next_request():
    async def run():
        streams, sent, got = RequestStreams("shard stopping"), [], []

        async def consume():
            async for request in streams.each(_forever(sent)):
                got.append(request)

        consumer = asyncio.ensure_future(consume())
        while len(got) < 3:
            await asyncio.sleep(0)
        assert len(streams) == 1 and not consumer.done()  # open, waiting for the client
        streams.close()
        with pytest.raises(UnavailableError, match="shard stopping"):
            await asyncio.wait_for(consumer, 10)
        assert len(streams) == 0
        return got

    assert asyncio.run(run()) == [0, 1, 2]


def test_close_ends_a_busy_stream_at_its_next_read_and_refuses_new_ones():
    async def run():
        streams, handled = RequestStreams(), []
        release = asyncio.Event()

        async def consume():
            async for step in streams.steps(_items(1000), most=4):
                handled.append(step)
                await release.wait()  # busy with this step while the queue fills up

        consumer = asyncio.ensure_future(consume())
        while not handled:
            await asyncio.sleep(0)
        for _ in range(10):  # the reader fills the queue meanwhile
            await asyncio.sleep(0)
        streams.close()
        release.set()
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(consumer, 10)
        with pytest.raises(UnavailableError):
            async for _ in streams.each(_items(1)):
                pass
        return handled

    assert len(asyncio.run(run())) == 1  # nothing handed out after close()

"""drain_requests (replay_server/drain.py): a request stream read as steps of what queued up, in order, at most
`most` per step; an error of the stream comes after the requests read before it."""

from __future__ import annotations

import asyncio

import pytest

from apexrl.replay_server.drain import drain_requests


async def _items(n: int, error: BaseException | None = None):
    for i in range(n):
        yield i
    if error is not None:
        raise error


def _steps(
    n: int, most: int, error: BaseException | None = None
) -> tuple[list[list[int]], BaseException | None]:
    async def run():
        steps, raised = [], None
        try:
            async for step in drain_requests(_items(n, error), most=most):
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

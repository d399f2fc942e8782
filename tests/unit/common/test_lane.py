"""common.aio_grpc.Lane: queued work runs in order, in slices, with every other callback served between slices."""

from __future__ import annotations

import asyncio

import pytest

from apexrl.common.aio_grpc import Lane


def test_work_runs_in_order_and_hands_back_results_and_errors():
    async def main():
        lane = Lane()
        order: list[int] = []

        def work(i: int):
            order.append(i)
            if i == 2:
                raise ValueError("two")
            return i * 10

        results = await asyncio.gather(
            *(lane.run(lambda i=i: work(i)) for i in range(4)), return_exceptions=True
        )
        return order, results, len(lane)

    order, results, left = asyncio.run(main())
    assert order == [0, 1, 2, 3] and left == 0
    assert results[:2] == [0, 10] and isinstance(results[2], ValueError) and results[3] == 30


def test_other_callbacks_run_between_slices():
    """With a slice shorter than one item, a callback queued after 50 items runs after the first one, not the
    last: the property that lets a shard answer Sample while hundreds of writers' inserts wait."""

    async def main():
        lane = Lane(slice_seconds=1e-9)
        done: list[str] = []
        tasks = [asyncio.ensure_future(lane.run(lambda i=i: done.append(f"insert {i}"))) for i in range(50)]
        await asyncio.sleep(0)  # every insert is queued
        asyncio.get_running_loop().call_soon(done.append, "sample")
        await asyncio.gather(*tasks)
        return done

    done = asyncio.run(main())
    assert done.index("sample") <= 2, done[:5]
    assert [d for d in done if d != "sample"] == [f"insert {i}" for i in range(50)]


def test_a_caller_that_went_away_runs_nothing():
    async def main():
        lane = Lane(slice_seconds=1e-9)
        ran: list[int] = []
        first = asyncio.ensure_future(lane.run(lambda: ran.append(1)))
        second = asyncio.ensure_future(lane.run(lambda: ran.append(2)))
        await asyncio.sleep(0)
        second.cancel()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await asyncio.sleep(0)
        return ran

    assert asyncio.run(main()) == [1]


def test_slice_must_be_positive():
    with pytest.raises(ValueError, match="slice_seconds"):
        Lane(slice_seconds=0)

"""The call limits' own logic (common/call_limits.py), the read timeout of RequestDecodeInterceptor and the memory
trimmer (common/memory.py). The limits against real floods: tests/integration/test_memory_flood.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from apexrl.common import memory
from apexrl.common.aio_grpc import _Refused, _within
from apexrl.common.call_limits import CallLimits, CallLimitSettings

INSERT = "/apexrl.v1.ReplayService/Insert"


def test_only_the_large_methods_may_send_the_servers_largest_message():
    limits = CallLimits(4096, frozenset({INSERT}))
    assert limits.request_limit(INSERT) is None  # gRPC's own: max_message_bytes
    assert limits.request_limit("/apexrl.v1.ReplayService/Info") == 4096
    assert limits.receive_limit(1 << 20) == 1 << 20  # Insert needs it


def test_a_server_without_large_methods_has_grpc_refuse_larger_requests_itself():
    assert CallLimits(4096).receive_limit(1 << 20) == 4096
    assert CallLimits(1 << 21).receive_limit(1 << 20) == 1 << 20  # never above max_message_bytes


@pytest.mark.parametrize(
    "bad",
    [
        {"max_concurrent_calls": 0},
        {"max_streams_per_connection": -1},
        {"max_reading_requests": 0},
        {"request_read_seconds": 0.0},
        {"request_read_seconds": float("inf")},
        {"trim_memory_seconds": -1.0},
    ],
)
def test_settings_out_of_range_are_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        CallLimitSettings(**bad)


def test_limits_take_the_settings_of_a_config():
    settings = CallLimitSettings(max_concurrent_calls=7, max_reading_requests=2, trim_memory_seconds=0.0)
    limits = CallLimits.of(settings, 8192, [INSERT])
    assert (limits.max_concurrent_calls, limits.max_reading_requests, limits.trim_memory_seconds) == (
        7,
        2,
        0.0,
    )
    assert limits.large_methods == frozenset({INSERT})
    assert ("grpc.max_concurrent_streams", settings.max_streams_per_connection) in limits.server_options()
    with pytest.raises(ValueError, match="max_request_bytes"):
        CallLimits(100)


def test_a_request_that_does_not_arrive_in_time_is_deadline_exceeded_and_the_task_goes_on():
    async def main():
        with pytest.raises(_Refused) as refused:
            await _within(asyncio.sleep(10), 0.05, "/s/M")
        assert refused.value.status()[0] is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "request_read_seconds" in refused.value.status()[1]
        assert await _within(asyncio.sleep(0, "arrived"), 5, "/s/M") == "arrived"
        await asyncio.sleep(0)  # this task was not left cancelled

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    async def main():
        task = asyncio.ensure_future(_within(asyncio.sleep(10), 5, "/s/M"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_trimming_returns_memory_where_glibc_is():
    assert memory.trim_now() in (True, False)  # False off glibc: nothing to do
    memory.trim_periodically(0)  # 0: never, and no thread

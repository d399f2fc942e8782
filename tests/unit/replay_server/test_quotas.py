"""The quota bookkeeping (replay_server/server/quotas.py) at its exact boundaries: a limit's last slot is granted, one more
is refused naming the limit and its setting and counted, and a released slot is granted again. Pure: no server,
so a limit off by one, or never enforced, fails here at once instead of through a call that waits for its deadline
(tests/integration/replay_server/test_quotas.py shows the same limits on a real shard)."""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack

import pytest
from prometheus_client import CollectorRegistry

from apexrl.common.errors import ResourceExhaustedError
from apexrl.replay_server.server.quotas import Quotas, QuotaSettings


def quotas(**settings) -> tuple[Quotas, CollectorRegistry]:
    registry = CollectorRegistry()
    return Quotas(QuotaSettings(**settings), registry), registry


def refusals(registry: CollectorRegistry, limit: str) -> float:
    return registry.get_sample_value("apexrl_replay_quota_refusals_total", {"limit": limit})


def refusal(slot: AbstractContextManager, what: str) -> str:
    """The message `slot` is refused with; fails naming `what` when it is granted."""
    try:
        with slot:
            pass
    except ResourceExhaustedError as err:
        return str(err)
    pytest.fail(f"{what} was granted: the limit is off by one or not enforced")


def test_a_connection_gets_exactly_max_calls_per_connection_and_a_released_call_is_granted_again():
    q, registry = quotas(max_calls_per_connection=3)
    with ExitStack() as held:
        for _ in range(3):
            held.enter_context(q.call("ipv4:10.0.0.1:5000"))  # the limit itself is granted
        assert registry.get_sample_value("apexrl_replay_open_calls") == 3
        assert refusal(q.call("ipv4:10.0.0.1:5000"), "a 4th call with max_calls_per_connection 3") == (
            "connection ipv4:10.0.0.1:5000 already has 3 calls open, the limit (max_calls_per_connection) 3: "
            "raise the shard's --max-calls-per-connection (each client object has a connection of its own)"
        )
        assert refusals(registry, "calls_per_connection") == 1
        with q.call("ipv4:10.0.0.2:5000"):  # another connection has its own count
            pass
        held.close()  # one slot given back ...
        with q.call("ipv4:10.0.0.1:5000"):  # ... is granted again
            assert registry.get_sample_value("apexrl_replay_open_calls") == 1
    assert registry.get_sample_value("apexrl_replay_open_calls") == 0
    assert refusals(registry, "calls_per_connection") == 1


def test_a_call_that_fails_gives_its_slot_back():
    q, _ = quotas(max_calls_per_connection=1, max_waiting_calls=1)
    for _ in range(3):
        with pytest.raises(KeyError), q.call("peer"), q.waiting_call(10):
            raise KeyError("the call failed")
    assert q.waiting == 0 and q.waiting_bytes == 0
    with q.call("peer"), q.waiting_call(10):
        assert q.waiting == 1 and q.waiting_bytes == 10


def test_exactly_max_waiting_calls_wait_across_connections_and_a_released_one_is_granted_again():
    q, registry = quotas(max_waiting_calls=2)
    with ExitStack() as held:
        held.enter_context(q.waiting_call())
        held.enter_context(q.waiting_call())  # the limit itself is granted
        assert q.waiting == 2
        assert refusal(q.waiting_call(), "a 3rd waiting call with max_waiting_calls 2") == (
            "2 calls are already waiting for the table, the limit (max_waiting_calls) 2: "
            "raise the shard's --max-waiting-calls"
        )
        assert refusals(registry, "waiting_calls") == 1 and q.waiting == 2
    assert q.waiting == 0
    with q.waiting_call(), q.waiting_call():
        assert q.waiting == 2
    assert refusals(registry, "waiting_calls") == 1


def test_waiting_inserts_may_hold_exactly_max_waiting_insert_bytes_and_not_one_byte_more():
    q, registry = quotas(max_waiting_insert_bytes=100)
    with ExitStack() as held:
        held.enter_context(q.waiting_call(60))
        held.enter_context(q.waiting_call(40))  # 100 bytes: the limit itself is granted
        assert q.waiting_bytes == 100
        assert refusal(q.waiting_call(1), "a 101st byte with max_waiting_insert_bytes 100") == (
            "waiting inserts hold 100 bytes, and this batch's 1 bytes would go over the limit "
            "(max_waiting_insert_bytes) of 100: raise the shard's --max-waiting-insert-bytes"
        )
        assert refusals(registry, "waiting_insert_bytes") == 1
        held.enter_context(q.waiting_call())  # a call holding no insert bytes (a Sample) still waits
        assert q.waiting == 3 and q.waiting_bytes == 100
    assert q.waiting_bytes == 0 and q.waiting == 0
    with q.waiting_call(100):  # released bytes are granted again, all at once
        assert "this batch's 1 bytes" in refusal(q.waiting_call(1), "a 101st byte, after a release")
    assert refusals(registry, "waiting_insert_bytes") == 2
    assert "this batch's 101 bytes" in refusal(q.waiting_call(101), "a batch of 101 bytes alone")

"""Per-connection and shard-wide quotas on a real shard (loopback): a caller over a limit gets RESOURCE_EXHAUSTED
naming the limit and its setting, the refusal is counted, and nothing is stored or drawn for it.

Each test fails on a shard without quotas (it held every waiting call, and waiting inserts' bytes, unbounded), and
fails within seconds: the call that must be refused has a short deadline, and a call let in instead (a limit off by
one, or not enforced) fails the test naming the limit. tests/unit/replay_server/test_quotas.py holds the boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from apexrl.common.errors import ApexError, DeadlineExceededError, ResourceExhaustedError
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.core.table import TableConfig
from apexrl.replay_server.server.quotas import QuotaSettings
from tests.conftest import cartpole_batch, wait_until

# The deadline of a call that must be refused: a refusal comes at once; a call let in waits for the table.
REFUSED_WITHIN = 5.0


def refusals(shard, limit: str) -> float:
    return shard.registry.get_sample_value("apexrl_replay_quota_refusals_total", {"limit": limit})


def refusal(call: Callable[[float], object], setting: str) -> str:
    """The message of the RESOURCE_EXHAUSTED that `call(deadline)` must get; fails naming `setting` when the call
    was let in instead (it then waits for the table until its short deadline, or is answered)."""
    try:
        answer = call(REFUSED_WITHIN)
    except ResourceExhaustedError as err:
        return str(err)
    except DeadlineExceededError as err:
        pytest.fail(f"the call over {setting} was let in, not refused: it waited for the table ({err})")
    except ApexError as err:
        pytest.fail(f"the call over {setting} was let in, not refused: {type(err).__name__}: {err}")
    pytest.fail(f"the call over {setting} was let in, not refused: answered {answer!r}")


def test_one_connection_cannot_hold_more_calls_than_its_quota(make_shard):
    shard = make_shard(
        TableConfig(capacity=100, min_size_to_sample=10, seed=0),
        quotas=QuotaSettings(max_calls_per_connection=8),
    )
    with ReplayClient(shard.address, timeout=60.0) as greedy:
        waiting = [
            greedy.sample_future(4, timeout=60.0) for _ in range(8)
        ]  # an empty shard: all of them wait
        wait_until(
            lambda: shard.registry.get_sample_value("apexrl_replay_open_calls") == 8,
            "8 calls are open",
            timeout=30,
        )
        assert refusal(
            lambda deadline: greedy.sample(4, timeout=deadline), "max_calls_per_connection"
        ).endswith(
            "already has 8 calls open, the limit (max_calls_per_connection) 8: raise the shard's "
            "--max-calls-per-connection (each client object has a connection of its own)"
        )
        assert refusals(shard, "calls_per_connection") == 1
        # Another connection is not affected (channels of one process share a connection unless told not to).
        with grpc.insecure_channel(shard.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            with pytest.raises(grpc.RpcError) as other:
                replay_pb2_grpc.ReplayServiceStub(channel).Sample(
                    replay_pb2.SampleRequest(batch_size=4, no_wait=True), timeout=30
                )
            assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # too few rows, not the quota
        shard.table.insert(cartpole_batch(16), np.ones(16))
        for call in waiting:  # rows arrived: the held calls are answered, and the connection may call again
            assert len(call.result(timeout=30).keys) == 4
        assert len(greedy.sample(4, timeout=30.0).keys) == 4
    assert shard.table.info().sampled_total == 9 * 4


def test_calls_waiting_for_the_table_are_capped_across_connections(make_shard):
    shard = make_shard(
        TableConfig(capacity=100, min_size_to_sample=10, seed=0), quotas=QuotaSettings(max_waiting_calls=3)
    )
    clients = [ReplayClient(shard.address, timeout=60.0) for _ in range(4)]
    try:
        waiting = [c.sample_future(4, timeout=60.0) for c in clients[:3]]
        wait_until(
            lambda: shard.registry.get_sample_value("apexrl_replay_waiting_calls", {"call": "sample"}) == 3,
            "3 samples wait",
            timeout=30,
        )
        message = refusal(lambda deadline: clients[3].sample(4, timeout=deadline), "max_waiting_calls")
        assert message.endswith(
            "RESOURCE_EXHAUSTED: 3 calls are already waiting for the table, the limit (max_waiting_calls) 3: "
            "raise the shard's --max-waiting-calls"
        ), message
        assert refusals(shard, "waiting_calls") == 1
        for call in waiting:
            call.cancel()
    finally:
        for c in clients:
            c.close()
    assert shard.table.info().sampled_total == 0


def test_a_call_waits_at_most_max_wait_seconds_whatever_its_deadline(make_shard):
    shard = make_shard(
        TableConfig(capacity=100, min_size_to_sample=10, seed=0), quotas=QuotaSettings(max_wait_seconds=0.5)
    )
    with ReplayClient(shard.address, timeout=120.0) as patient:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="max_wait_seconds 0.5"):
            patient.sample(4, timeout=120.0)
        assert time.monotonic() - started < 60  # the shard answered long before the call's own deadline


def test_inserts_waiting_on_the_rate_limiter_hold_bounded_bytes(make_shard):
    # The ratio limiter lets 10 rows in, then holds inserts until the learner samples: the second batch waits.
    shard = make_shard(
        TableConfig(
            capacity=1000,
            min_size_to_sample=1,
            samples_per_insert=1.0,
            samples_per_insert_tolerance=1.0,
            seed=0,
        ),
        quotas=QuotaSettings(max_waiting_insert_bytes=100),
    )
    with ReplayClient(shard.address, timeout=30.0, writer_id="w") as writer:
        writer.insert(cartpole_batch(10), priorities=np.ones(10))
        writer.flush(timeout=30)
        writer.insert(cartpole_batch(10, start=10), priorities=np.ones(10))
        message = refusal(lambda deadline: writer.flush(timeout=deadline), "max_waiting_insert_bytes")
        assert message.endswith(
            "over the limit (max_waiting_insert_bytes) of 100: raise the shard's --max-waiting-insert-bytes"
        ), message
    assert shard.table.info().size == 10 and refusals(shard, "waiting_insert_bytes") == 1


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_calls_per_connection", 0),
        ("max_waiting_calls", -1),
        ("max_waiting_insert_bytes", 0),
        ("max_wait_seconds", float("inf")),
        ("max_wait_seconds", -1.0),
    ],
)
def test_bad_quota_settings_are_refused_naming_the_setting(setting, value):
    with pytest.raises(ValueError, match=setting):
        QuotaSettings(**{setting: value})

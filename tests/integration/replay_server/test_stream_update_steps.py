"""StreamUpdatePriorities applies the requests that queued up on a stream together (one table call) and still
answers each with its own response, in order; a bad request ends the stream with INVALID_ARGUMENT after the ones
before it were applied and answered, and nothing after it is applied."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.proto import replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch


@pytest.fixture
def filled(make_shard):
    shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=0))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100), priorities=np.ones(100))
        client.flush()
    return shard


def _requests(incarnation: int) -> list:
    """40 requests: request i sets keys i and i + 50 to i + 2, the odd ones also name a key never stored; key 0
    again last, so the last entry for a key must win across requests applied together."""
    requests = []
    for i in range(40):
        keys = [i, i + 50] + ([1000 + i] if i % 2 else [])
        requests.append(wire.encode_update(np.array(keys), np.full(len(keys), i + 2.0), incarnation))
    requests.append(wire.encode_update(np.array([0]), np.array([7.0]), incarnation))
    return requests


def test_each_request_gets_its_own_counts_in_order_and_the_last_value_wins(filled):
    requests = _requests(filled.table.incarnation)
    with grpc.insecure_channel(filled.address) as channel:
        responses = list(replay_pb2_grpc.ReplayServiceStub(channel).StreamUpdatePriorities(iter(requests)))
    assert [(r.applied, r.stale) for r in responses] == [(2, i % 2) for i in range(40)] + [(1, 0)]
    want = np.ones(100)
    for i in range(40):
        want[[i, i + 50]] = i + 2.0
    want[0] = 7.0
    np.testing.assert_allclose(filled.table._tree.get(np.arange(100)), want)
    assert responses[-1].total_priority == pytest.approx(want.sum())
    info = filled.table.info()
    assert (info.updated_total, info.stale_updates_total) == (81, 20)


def test_a_bad_request_ends_the_stream_after_the_ones_before_it(filled):
    requests = _requests(filled.table.incarnation)[:10]
    bad = wire.encode_update(np.array([3]), np.array([np.nan]), 0)
    after = wire.encode_update(np.array([99]), np.array([50.0]), 0)
    answered = []
    with grpc.insecure_channel(filled.address) as channel:
        stream = replay_pb2_grpc.ReplayServiceStub(channel).StreamUpdatePriorities(
            iter([*requests, bad, after])
        )
        with pytest.raises(grpc.RpcError) as err:
            for response in stream:
                answered.append((response.applied, response.stale))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "finite" in err.value.details()
    assert answered == [(2, i % 2) for i in range(10)]
    leaves = filled.table._tree.get(np.arange(100))
    assert leaves[99] == 1.0 and leaves[3] == 5.0  # nothing after the bad request; request 3 before it
    assert filled.table.info().updated_total == 20

"""The shard client (replay_server/client.py) against real shards on 127.0.0.1: acknowledged inserts resent after
failures without loss or duplicates, and call futures that raise apexrl errors."""

from __future__ import annotations

import socket
import time

import grpc
import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.common.errors import (
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from apexrl.common.grpc_util import CallFuture
from apexrl.replay_server.table import TableConfig
from tests.conftest import cartpole_batch


def test_client_resends_after_the_stream_breaks_without_loss_or_duplicates(shard):
    """Stop the server under a writing client and start a new one on the same port over the same table: the
    client reconnects, resends what was not acknowledged, and every row lands exactly once."""
    from apexrl.replay_server.service import create_replay_server

    port = int(shard.address.rsplit(":", 1)[1])
    client = ReplayClient(shard.address, max_in_flight=64, timeout=30)
    try:
        for i in range(10):
            client.insert(cartpole_batch(10, 10 * i))
        client.flush()  # the insert stream is open
        for i in range(10, 20):
            client.insert(cartpole_batch(10, 10 * i))
        shard.server.stop(0).wait(10)  # breaks the stream, maybe with batches in flight
        for i in range(20, 30):  # these queue up while the shard is down
            client.insert(cartpole_batch(10, 10 * i))
        shard.server, _, _, _ = create_replay_server(shard.table, f"127.0.0.1:{port}")
        for i in range(30, 40):
            client.insert(cartpole_batch(10, 10 * i))
        client.flush(timeout=30)
        assert client.reconnects >= 1
    finally:
        client.close()
    info = shard.table.info()
    assert info.inserted_total == info.size == 400
    stored_ids = np.sort(shard.table._storage["action"][:400])  # white box: every row exactly once
    np.testing.assert_array_equal(stored_ids, np.arange(400))



def test_batches_refused_by_a_shutting_down_shard_are_resent_to_its_replacement(shard):
    """UNAVAILABLE in an ack means 'not stored, try later': the SDK keeps the batch and resends it when the shard
    is back (here: a new shard process on the same address), instead of failing the writer."""
    from apexrl.replay_server.service import create_replay_server
    from apexrl.replay_server.table import ReplayTable

    port = int(shard.address.rsplit(":", 1)[1])
    with ReplayClient(shard.address, timeout=30) as client:
        client.insert(cartpole_batch(10))
        client.flush()
        shard.table.close()  # shutting down: refuses every batch with UNAVAILABLE
        client.insert(cartpole_batch(10, 10))
        client.insert(cartpole_batch(10, 20))
        with pytest.raises(DeadlineExceededError, match="unacknowledged"):
            client.flush(timeout=1.0)
        assert client.pending == 2
        shard.server.stop(0).wait(10)
        replacement = ReplayTable(TableConfig(capacity=100))
        shard.server, _, _, _ = create_replay_server(replacement, f"127.0.0.1:{port}")
        client.flush(timeout=30)
    assert replacement.info().inserted_total == 20
    np.testing.assert_array_equal(np.sort(replacement.sample(200).columns["action"].reshape(-1))[[0, -1]], [10, 29])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_futures_decode_answers_into_the_wire_types(make_shard):
    shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=0))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10), priorities=np.arange(1, 11, dtype=np.float64))
        client.flush()
        info_future, sample_future = client.info_future(), client.sample_future(5)
        assert isinstance(info_future, CallFuture) and isinstance(sample_future, CallFuture)
        info, batch = info_future.result(), sample_future.result()
        assert (info.size, info.total_priority, info.incarnation) == (10, 55.0, shard.table.incarnation)
        assert batch.keys.dtype == np.uint64 and len(batch.keys) == 5 and batch.totals == info.totals
        np.testing.assert_allclose(batch.probabilities, (batch.keys + 1.0) / 55.0)
        update = client.update_priorities_future(batch.keys, np.full(5, 100.0), incarnation=batch.incarnation)
        result = update.result()
        assert result.applied == 5 and result.stale == 0 and update.done()
        stale = client.update_priorities_future(batch.keys, np.ones(5), incarnation=batch.incarnation ^ 2)
        assert (stale.result().applied, stale.result().stale) == (0, 5)


def test_futures_raise_apexrl_errors_never_grpc_ones(make_shard):
    shard = make_shard(TableConfig(capacity=100, min_size_to_sample=5))
    with ReplayClient(shard.address) as client:
        with pytest.raises(FailedPreconditionError, match="sample on .*FAILED_PRECONDITION.*fewer than"):
            client.sample_future(4, wait=False).result()
        with pytest.raises(InvalidArgumentError, match="batch_size"):
            client.sample_future(0).result()
        with pytest.raises(InvalidArgumentError, match="index 0 = nan"):
            client.update_priorities_future(np.zeros(1, np.uint64), np.array([np.nan]), incarnation=0).result()
        waiting = client.sample_future(4, timeout=30)  # waits for rows that never come
        with pytest.raises(DeadlineExceededError, match="no answer within 0.05s"):
            waiting.result(timeout=0.05)  # the caller's own wait ran out; the call goes on
        assert not waiting.done() and waiting.cancel()
        with pytest.raises(CancelledError, match="cancelled"):
            waiting.result()
        with pytest.raises(DeadlineExceededError, match="DEADLINE_EXCEEDED"):
            client.sample_future(4, timeout=0.2).result()
    with ReplayClient(f"127.0.0.1:{free_port()}", timeout=2) as dead:
        start = time.monotonic()
        for future in (dead.info_future(), dead.sample_future(1), dead.update_priorities_future(
                np.zeros(1, np.uint64), np.ones(1), incarnation=0)):
            with pytest.raises(UnavailableError) as err:
                future.result()
            assert not isinstance(err.value, grpc.RpcError)
        assert time.monotonic() - start < 5

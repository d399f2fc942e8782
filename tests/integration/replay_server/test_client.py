"""The shard client (replay_server/client/replay_client.py) against real shards on 127.0.0.1: acknowledged inserts resent after
failures without loss or duplicates, and call futures that raise apexrl errors."""

from __future__ import annotations

import re
import socket
import threading
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
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch


def test_client_resends_after_the_stream_breaks_without_loss_or_duplicates(shard):
    """Stop the server under a writing client and start a new one on the same port over the same table: the
    client reconnects, resends what was not acknowledged, and every row lands exactly once."""
    from apexrl.replay_server.server.service import create_replay_server

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
        made = create_replay_server(shard.table, f"127.0.0.1:{port}")
        shard.server = made.server
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
    from apexrl.replay_server.core.table import ReplayTable
    from apexrl.replay_server.server.service import create_replay_server

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
        made = create_replay_server(replacement, f"127.0.0.1:{port}")
        shard.server = made.server
        client.flush(timeout=30)
    assert replacement.info().inserted_total == 20
    np.testing.assert_array_equal(
        np.sort(replacement.sample(200).columns["action"].reshape(-1))[[0, -1]], [10, 29]
    )


class HeldBack:
    """Holds every table insert of a shard, once `hold(client)` was called, until its writer is ahead: the client's
    window of unacknowledged batches is full (`insert` would block) or `release()` says it sent its last batch. The
    writer then outruns its shard on any machine, however loaded (a sleep per insert only slows the shard, and a
    writer slowed down more by a busy machine catches up with it), so the batches that queue up behind an unanswered
    request are exactly what these tests count. The shard's event loop waits meanwhile: nothing else is served."""

    def __init__(self, table, timeout: float = 30.0) -> None:
        self._client: ReplayClient | None = None
        self._released = threading.Event()
        insert = table.insert

        def held_insert(*args, **kwargs):
            deadline = time.monotonic() + timeout
            while not self._ahead():
                assert time.monotonic() < deadline, "the writer never filled its window"
                time.sleep(0.001)
            return insert(*args, **kwargs)

        table.insert = held_insert

    def _ahead(self) -> bool:
        client = self._client
        return client is None or self._released.is_set() or client.pending >= client.max_in_flight

    def hold(self, client: ReplayClient) -> None:
        self._client = client

    def release(self) -> None:
        self._released.set()


def insert_requests(shard) -> float:
    """InsertRequest messages the shard has handled (one per message, whatever it carried)."""
    return (
        shard.registry.get_sample_value("apexrl_replay_request_duration_seconds_count", {"method": "Insert"})
        or 0
    )


def test_batches_queued_behind_an_unanswered_request_are_merged_with_fewer_acks(shard):
    """A writer faster than its shard: the batches that queue while a request is unanswered travel as one merged
    request, answered by one ack, and every row is stored once, in order."""
    held = HeldBack(shard.table)
    with ReplayClient(shard.address, timeout=30) as client:
        for i in range(200):
            client.insert(cartpole_batch(4, 4 * i), priorities=np.full(4, 1.0 + i))
            if i == 0:
                client.flush()  # the stream's first ack shows that the shard merges (until then: one by one)
                held.hold(client)
        held.release()
        client.flush()
        counts = (client.acks_received, client.requests_sent, insert_requests(shard))
    assert counts[0] == counts[1] == counts[2] <= 200 / 8, counts
    info = shard.table.info()
    assert info.inserted_total == info.size == 800
    np.testing.assert_array_equal(
        shard.table._storage["action"][:800], np.arange(800)
    )  # white box: key order
    batch = shard.table.sample(256)  # each row kept its own batch's priority
    np.testing.assert_allclose(
        batch.priorities, (1.0 + batch.columns["action"] // 4) ** shard.table.config.alpha
    )


def test_merged_resends_after_the_stream_breaks_lose_and_duplicate_nothing(make_shard):
    """Stop the shard's server while merged requests are in flight, with a new one on the same port over the same
    table: the client resends what was not acknowledged (merged again, maybe differently) and every row lands
    exactly once."""
    from apexrl.replay_server.server.service import create_replay_server

    shard = make_shard(TableConfig(capacity=10_000))
    held = HeldBack(shard.table)
    port = int(shard.address.rsplit(":", 1)[1])
    client = ReplayClient(
        shard.address, max_in_flight=256, timeout=30
    )  # room for every batch while it is down
    try:
        for i in range(100):
            client.insert(cartpole_batch(10, 10 * i))
            if i == 0:
                client.flush()  # the stream's first ack shows that the shard merges
                held.hold(client)  # the shard answers nothing more until the server stops
        assert client.pending == 99  # one request in flight, the rest queued behind it to go merged
        held.release()
        shard.server.stop(0).wait(
            10
        )  # breaks the stream, maybe with batches in flight or half a request stored
        first_requests = insert_requests(shard)
        for i in range(100, 150):  # these queue up while the shard is down
            client.insert(cartpole_batch(10, 10 * i))
        made = create_replay_server(shard.table, f"127.0.0.1:{port}")
        shard.server, shard.registry = made.server, made.registry
        for i in range(150, 200):
            client.insert(cartpole_batch(10, 10 * i))
        client.flush(timeout=30)
        assert client.reconnects >= 1
    finally:
        client.close()
    assert first_requests + insert_requests(shard) < 200 / 2
    info = shard.table.info()
    assert info.inserted_total == info.size == 2000
    np.testing.assert_array_equal(np.sort(shard.table._storage["action"][:2000]), np.arange(2000))


def test_a_rejected_batch_among_merged_ones_raises_its_own_error_and_the_others_are_stored(shard):
    held = HeldBack(shard.table)
    errors = []
    with ReplayClient(shard.address, timeout=30) as client:
        for i in range(40):
            batch, priorities = cartpole_batch(5, 5 * i), np.full(5, np.nan if i == 25 else 1.0)
            try:
                client.insert(batch, priorities)
            except InvalidArgumentError as err:  # raised by the next call after its ack came back
                errors.append(err)
                client.insert(batch, priorities)
            if i == 0:
                client.flush()  # the stream's first ack shows that the shard merges
                held.hold(client)
        held.release()
        try:
            client.flush()
        except InvalidArgumentError as err:
            errors.append(err)
        client.flush()  # the error is raised once; the rest is acknowledged
        assert insert_requests(shard) < 40 / 2
    assert len(errors) == 1
    assert re.search(r"insert of batch 26 to .*INVALID_ARGUMENT.*index 0 = nan", str(errors[0])), errors[0]
    stored = shard.table._storage["action"][: shard.table.info().inserted_total]  # white box: key order
    np.testing.assert_array_equal(stored, np.r_[0:125, 130:200])


def test_bool_bytes_other_than_0_or_1_travel_alone_so_only_their_batch_is_refused(make_shard):
    """The shard refuses a BOOL tensor holding other bytes when it decodes the request, which for a merged request
    would refuse all its batches: such a batch is never merged."""
    shard = make_shard(TableConfig(capacity=1000))
    held = HeldBack(shard.table)
    errors = []
    with ReplayClient(shard.address, timeout=30) as client:
        for i in range(30):
            done = np.frombuffer(bytes([0, 2, 1, 0]), np.bool_) if i == 20 else np.zeros(4, np.bool_)
            try:
                client.insert({"x": np.arange(4 * i, 4 * i + 4), "done": done})
            except InvalidArgumentError as err:
                errors.append(err)
            if i == 0:
                client.flush()  # the stream's first ack shows that the shard merges
                held.hold(client)
        held.release()
        try:
            client.flush()
        except InvalidArgumentError as err:
            errors.append(err)
        assert client.requests_sent < 30 / 2
    assert len(errors) == 1 and "insert of batch 21 " in str(errors[0]) and "BOOL bytes" in str(errors[0])
    stored = shard.table._storage["x"][: shard.table.info().inserted_total]  # white box: key order
    np.testing.assert_array_equal(stored, np.r_[0:80, 84:120])


def test_a_shard_whose_acks_carry_no_batch_count_gets_one_batch_per_request():
    """An older shard ignores batch_rows (it would store a merged request as one batch): the SDK merges only
    after an ack shows `batches`, so such a shard only ever sees one-batch requests, each acknowledged."""
    from concurrent.futures import ThreadPoolExecutor

    from apexrl.common import codec
    from apexrl.proto import replay_pb2, replay_pb2_grpc

    received = []

    class OlderShard(replay_pb2_grpc.ReplayServiceServicer):
        def Insert(self, request_iterator, context):  # noqa: N802
            for request in request_iterator:
                rows = len(codec.decode_tensor(request.batch.columns[0].tensor))
                received.append((request.sequence, rows, len(request.batch_rows)))
                time.sleep(0.002)
                yield replay_pb2.InsertAck(sequence=request.sequence, rows=rows, incarnation=7)

    server = grpc.server(ThreadPoolExecutor(4))
    replay_pb2_grpc.add_ReplayServiceServicer_to_server(OlderShard(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with ReplayClient(f"127.0.0.1:{port}", timeout=30) as client:
            for i in range(60):
                client.insert(cartpole_batch(3, 3 * i))
            client.flush()
            assert client.pending == 0 and client.last_incarnation == 7
    finally:
        server.stop(0).wait(10)
    assert received == [(i + 1, 3, 0) for i in range(60)]


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
            client.update_priorities_future(
                np.zeros(1, np.uint64), np.array([np.nan]), incarnation=0
            ).result()
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
        for future in (
            dead.info_future(),
            dead.sample_future(1),
            dead.update_priorities_future(np.zeros(1, np.uint64), np.ones(1), incarnation=0),
        ):
            with pytest.raises(UnavailableError) as err:
                future.result()
            assert not isinstance(err.value, grpc.RpcError)
        assert time.monotonic() - start < 5

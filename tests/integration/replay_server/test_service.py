"""A real replay shard on 127.0.0.1 (replay_server/server/service.py) through the SDK and the raw stub: storage, keys,
de-duplication, rate limiting, health, reflection and tokens."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apexrl.actor import ReplayClient
from apexrl.common import codec
from apexrl.common.errors import DeadlineExceededError, FailedPreconditionError, UnauthenticatedError
from apexrl.common.grpc_util import make_channel
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch


def test_inserted_rows_come_back_intact_with_their_keys(shard):
    with ReplayClient(shard.address) as client:
        for start in range(0, 600, 200):
            client.insert(cartpole_batch(200, start))
        client.flush()
        info = client.info()
        assert (info.size, info.inserted_total, info.evicted_total) == (600, 600, 0)
        assert str(info.signature) == (
            "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
        )
        batch = client.sample(256)
    ids = batch.columns["action"]
    # Keys are insertion indices, and each row is exactly what was inserted under it.
    np.testing.assert_array_equal(batch.keys.astype(np.int64), ids)
    np.testing.assert_array_equal(batch.columns["obs"], np.tile(ids[:, None], (1, 4)).astype(np.float32))
    np.testing.assert_array_equal(batch.columns["next_obs"], batch.columns["obs"] + 1)
    assert batch.size == 600 and batch.total_priority == pytest.approx(600.0)  # default priority 1 ** 0.6


def test_fifo_eviction_wraps_and_counts(make_shard):
    shard = make_shard(TableConfig(capacity=250, seed=1))
    with ReplayClient(shard.address) as client:
        for start in range(0, 700, 100):
            client.insert(cartpole_batch(100, start))
        client.flush()
        info = client.info()
        assert (info.size, info.inserted_total, info.evicted_total) == (250, 700, 450)
        ids = client.sample(1000).columns["action"]
    assert ids.min() >= 450 and ids.max() < 700  # only the newest 250 rows remain


def test_new_rows_get_the_largest_priority_seen(shard):
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10), priorities=np.full(10, 5.0))
        client.insert(cartpole_batch(10, 10))  # no priorities: gets max seen = 5.0
        client.flush()
        batch = client.sample(64)
    assert np.allclose(batch.priorities, 5.0**0.6)


def test_priority_updates_apply_and_stale_keys_are_counted(make_shard):
    shard = make_shard(TableConfig(capacity=100, alpha=1.0, seed=2))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100), priorities=np.ones(100))
        client.flush()
        keys = np.arange(100, dtype=np.uint64)
        assert client.update_priorities(keys[:10], np.zeros(10), incarnation=0).applied == 10
        # Evict keys 0..49 by inserting 50 rows: updates for them are stale, the rest still apply.
        client.insert(cartpole_batch(50, 100), priorities=np.ones(50))
        client.flush()
        result = client.update_priorities(keys[40:60], np.full(20, 3.0), incarnation=0)
        assert (result.applied, result.stale) == (10, 10)
        info = client.info()
        assert info.total_priority == pytest.approx(40 * 1 + 10 * 3 + 50 * 1)
        assert info.stale_updates_total == 10 and info.updated_total == 20
        # Keys of another incarnation (a restarted shard) are stale too.
        result = client.update_priorities(keys[50:60], np.ones(10), incarnation=info.incarnation ^ 2)
        assert (result.applied, result.stale) == (0, 10)


def test_duplicate_keys_in_one_update_last_value_wins(make_shard):
    shard = make_shard(TableConfig(capacity=10, alpha=1.0))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10), priorities=np.ones(10))
        client.flush()
        client.update_priorities(
            np.array([3, 3, 3], dtype=np.uint64), np.array([7.0, 2.0, 4.0]), incarnation=0
        )
        assert client.info().total_priority == pytest.approx(9 + 4.0)


def test_zero_priority_rows_are_never_sampled_unless_all_are_zero(make_shard):
    shard = make_shard(TableConfig(capacity=100, seed=3))
    with ReplayClient(shard.address) as client:
        priorities = np.zeros(100)
        priorities[[7, 42]] = 1.0
        client.insert(cartpole_batch(100), priorities=priorities)
        client.flush()
        assert set(client.sample(500).columns["action"]) == {7, 42}
        client.update_priorities(np.array([7, 42], dtype=np.uint64), np.zeros(2), incarnation=0)
        uniform = client.sample(2000).columns["action"]
    assert len(set(uniform)) > 90  # all zero: uniform over every stored row


def _raw_insert(address: str, requests: list[replay_pb2.InsertRequest]) -> list[replay_pb2.InsertAck]:
    with make_channel(address) as channel:
        return list(replay_pb2_grpc.ReplayServiceStub(channel).Insert(iter(requests), timeout=10))


def _request(writer: str, sequence: int, rows: int = 8, start: int = 0) -> replay_pb2.InsertRequest:
    request = replay_pb2.InsertRequest(writer_id=writer, sequence=sequence)
    codec.encode_batch(cartpole_batch(rows, start), request.batch)
    return request


def test_resent_batches_are_acknowledged_but_stored_once(shard):
    acks = _raw_insert(shard.address, [_request("w", 1), _request("w", 2, start=8)])
    assert [(a.sequence, a.duplicate, a.first_key, a.rows) for a in acks] == [
        (1, False, 0, 8),
        (2, False, 8, 8),
    ]
    # A new stream resends 2 (already stored) then sends 3: only 3 is stored.
    acks = _raw_insert(shard.address, [_request("w", 2, start=8), _request("w", 3, start=16)])
    assert [(a.sequence, a.duplicate) for a in acks] == [(2, True), (3, False)]
    # Another writer with the same sequence numbers is independent.
    acks = _raw_insert(shard.address, [_request("other", 1, start=24)])
    assert not acks[0].duplicate
    info = shard.table.info()
    assert (info.size, info.inserted_total, info.duplicate_batches_total) == (32, 32, 1)


def _merged(
    writer: str, sequence: int, batches: int, rows: int = 8, start: int = 0
) -> replay_pb2.InsertRequest:
    """One request carrying `batches` batches of `rows` rows numbered sequence, sequence + 1, ... (batch_rows)."""
    request = _request(writer, sequence, rows * batches, start)
    request.batch_rows.extend([rows] * batches)
    return request


def _stored_ids(shard) -> np.ndarray:
    info = shard.table.info()
    assert info.size == info.inserted_total  # nothing evicted: the ring holds rows in key order
    return shard.table._storage["action"][: info.size]  # white box: the stored rows in key order


def test_merged_requests_store_each_batch_once_and_are_answered_by_one_ack(shard):
    """A merged request is its batches sent one by one: stored in order under their own sequence numbers, and
    answered by one ack naming the last one; one-batch requests keep one ack each (batches = 1)."""
    acks = _raw_insert(
        shard.address, [_request("w", 1), _merged("w", 2, 4, start=8), _request("w", 6, start=40)]
    )
    assert [(a.sequence, a.batches, a.duplicate, a.first_key, a.rows, a.error_code) for a in acks] == [
        (1, 1, False, 0, 8, 0),
        (5, 4, False, 8, 32, 0),
        (6, 1, False, 40, 8, 0),
    ]
    assert len({a.incarnation for a in acks}) == 1 and acks[0].incarnation == shard.table.incarnation
    # After a broken stream a client resends 4..6 merged differently: 4..6 are duplicates, 7..8 are new. Each
    # batch is judged on its own number, so nothing is stored twice and nothing is lost.
    acks = _raw_insert(shard.address, [_merged("w", 4, 5, start=24)])
    assert [(a.sequence, a.batches, a.duplicate, a.first_key, a.rows) for a in acks] == [
        (6, 3, True, 0, 0),
        (8, 2, False, 48, 16),
    ]
    np.testing.assert_array_equal(_stored_ids(shard), np.arange(64))
    info = shard.table.info()
    assert info.duplicate_batches_total == 3
    # The writer's last stored number is the last batch's: resending any of them again stores nothing.
    acks = _raw_insert(shard.address, [_merged("w", 1, 8), _request("w", 8, start=56)])
    assert [(a.sequence, a.batches, a.duplicate) for a in acks] == [(8, 8, True), (8, 1, True)]
    assert shard.table.info().inserted_total == 64
    # Without a writer id nothing is de-duplicated: every batch of a merged request is stored.
    acks = _raw_insert(shard.address, [_merged("", 1, 3, start=64)])
    assert [(a.sequence, a.batches, a.first_key, a.rows) for a in acks] == [(3, 3, 64, 24)]
    np.testing.assert_array_equal(_stored_ids(shard), np.arange(88))


def test_a_merged_request_with_compressed_columns_is_stored_batch_by_batch(shard):
    """A client in another language may merge batches with compressed image columns: each batch keeps its own
    rows' frames (the Python SDK sends compressed batches alone)."""
    from tests.conftest import pixel_batch

    request = replay_pb2.InsertRequest(writer_id="w", sequence=1)
    codec.encode_batch(pixel_batch(12), request.batch)
    request.batch_rows.extend([4, 4, 4])
    (ack,) = _raw_insert(shard.address, [request])
    assert (ack.sequence, ack.batches, ack.rows, ack.error_code) == (3, 3, 12, 0), ack
    assert shard.table.info().size == 12
    sampled = shard.table.sample(64)
    frames = sampled.columns["obs"]
    assert len(frames) == 64 and sorted(set(sampled.columns["action"].tolist())) == list(range(12))


def test_sample_below_min_size_waits_for_its_deadline_or_fails_at_once(make_shard):
    shard = make_shard(TableConfig(capacity=100, min_size_to_sample=50))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10))
        client.flush()
        with pytest.raises(FailedPreconditionError, match="fewer than min_size_to_sample"):
            client.sample(4, wait=False)
        start = time.monotonic()
        # The shard's own answer ("waited until its deadline: ... min_size_to_sample") races with the client's
        # deadline, which falls at the same moment: either way the call waited for its deadline.
        with pytest.raises(DeadlineExceededError, match="DEADLINE_EXCEEDED"):
            client.sample(4, timeout=0.3)
        assert time.monotonic() - start >= 0.25
        client.insert(cartpole_batch(40, 10))
        client.flush()
        assert client.sample(4, wait=False).size == 50


def calls_reached(table, method: str) -> threading.Event:
    """An event set when the servicer calls `table.<method>`: the request has reached the table."""
    reached = threading.Event()
    original = getattr(table, method)

    def wrapper(*args, **kwargs):
        reached.set()
        return original(*args, **kwargs)

    setattr(table, method, wrapper)
    return reached


def test_samples_per_insert_limiter_blocks_the_sampler_until_inserts_catch_up(make_shard):
    shard = make_shard(TableConfig(capacity=1000, samples_per_insert=1.0, samples_per_insert_tolerance=16))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(32))
        client.flush()
        client.sample(32)  # diff = inserted * 1 - sampled: 32 -> 0
        client.sample(32)  # 0 >= -16 was allowed (checked before the call): 0 -> -32
        with pytest.raises(FailedPreconditionError, match="rate limiter"):
            client.sample(32, wait=False)  # diff -32 < -16
        # A waiting sampler is held by the shard until an insert lets it go.
        reached = calls_reached(shard.table, "sample")
        waiting = client.sample_future(32, timeout=30)
        assert reached.wait(10)
        with pytest.raises(DeadlineExceededError, match="no answer"):
            waiting.result(timeout=0.3)  # still held
        client.insert(cartpole_batch(32, 32))  # -32 -> 0: sampling is allowed again
        client.flush()
        batch = waiting.result(timeout=10)
        assert batch.size == 64  # answered after the insert, from the grown table
        assert client.info().sampled_total == 96
        with pytest.raises(FailedPreconditionError, match="rate limiter"):
            client.sample(32, wait=False)  # the released sample took diff 0 -> -32: the ratio holds again


def test_samples_per_insert_limiter_blocks_writers_until_samples_catch_up(make_shard):
    """The insert side (the shipped launcher turns the ratio on): writers that run ahead of the learner wait."""
    shard = make_shard(TableConfig(capacity=1000, samples_per_insert=1.0, samples_per_insert_tolerance=16))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(32))
        client.flush()  # diff 0 -> 32, above the tolerance: the next insert must wait
        reached = calls_reached(shard.table, "insert")
        client.insert(cartpole_batch(32, 32))
        assert reached.wait(10)
        with pytest.raises(DeadlineExceededError, match="1 batches still unacknowledged"):
            client.flush(timeout=0.3)
        assert client.pending == 1 and shard.table.info().inserted_total == 32
        client.sample(32)  # 32 -> 0: the writer may go on
        client.flush(timeout=10)
        info = client.info()
        assert (info.inserted_total, info.size, info.sampled_total) == (64, 64, 32)


def test_health_reflection_and_token(make_shard):
    shard = make_shard(token="s3cret")
    with make_channel(shard.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "apexrl.v1.ReplayService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as err:  # reflection needs the token like every other service
            list(
                reflection.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(UnauthenticatedError):
        ReplayClient(shard.address).info()
    with pytest.raises(UnauthenticatedError):
        ReplayClient(shard.address, token="wrong").info()
    with ReplayClient(shard.address, token="s3cret") as client:
        assert client.info().size == 0
    with make_channel(shard.address, token="s3cret") as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
        )
        names = {s.name for s in replies[0].list_services_response.service}
    assert {"apexrl.v1.ReplayService", "grpc.health.v1.Health"} <= names

"""The bad-input checklist (shared/FACTS.md): every malformed request gets its precise status and message, and
the shard keeps serving with its contents unchanged."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from apexrl.actor import ReplayClient
from apexrl.common import codec
from apexrl.common.errors import InvalidArgumentError, ResourceExhaustedError
from apexrl.common.grpc_util import make_channel
from apexrl.proto import replay_pb2, replay_pb2_grpc, tensor_pb2
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, wait_until

ROWS = 64


@pytest.fixture
def filled(make_shard):
    """A shard holding 64 known rows (priorities 1..64, alpha 1), plus a snapshot to compare against."""
    shard = make_shard(
        TableConfig(capacity=1000, alpha=1.0, max_sample_batch_size=512, seed=0), max_message_bytes=1 << 20
    )
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(ROWS), priorities=np.arange(1, ROWS + 1, dtype=np.float64))
        client.flush()
    return shard


def assert_intact(shard) -> None:
    """The shard still answers, and holds exactly the 64 original rows with their original priorities."""
    info = shard.table.info()
    assert (info.size, info.inserted_total) == (ROWS, ROWS)
    assert info.total_priority == pytest.approx(ROWS * (ROWS + 1) / 2)
    with ReplayClient(shard.address) as client:
        batch = client.sample(256)
    ids = batch.columns["action"]
    np.testing.assert_array_equal(batch.keys.astype(np.int64), ids)
    np.testing.assert_allclose(batch.priorities, ids + 1.0)
    np.testing.assert_array_equal(batch.columns["obs"][:, 0], ids.astype(np.float32))


def stub(shard):
    channel = make_channel(shard.address, max_message_bytes=64 << 20)
    return channel, replay_pb2_grpc.ReplayServiceStub(channel)


def insert_ack(shard, request: replay_pb2.InsertRequest) -> replay_pb2.InsertAck:
    channel, s = stub(shard)
    with channel:
        return next(iter(s.Insert(iter([request]), timeout=10)))


def good_request(rows: int = 8) -> replay_pb2.InsertRequest:
    request = replay_pb2.InsertRequest(writer_id="bad-input-test", sequence=1)
    codec.encode_batch(cartpole_batch(rows, 1000), request.batch)
    return request


def column(request: replay_pb2.InsertRequest, name: str) -> tensor_pb2.Tensor:
    return next(c.tensor for c in request.batch.columns if c.name == name)


def _mutations():
    """(case id, mutation of a valid request, expected substring of the message)."""

    def wrong_dtype(r):
        codec.encode_tensor(np.zeros((8, 4), np.float64), column(r, "obs"))

    def wrong_shape(r):
        codec.encode_tensor(np.zeros((8, 5), np.float32), column(r, "obs"))

    def short_data(r):
        column(r, "obs").data = column(r, "obs").data[:-3]

    def negative_dim(r):
        column(r, "obs").shape[:] = [8, -4]

    def huge_dim(r):
        column(r, "obs").shape[:] = [8, 1 << 40]

    def unspecified_dtype(r):
        column(r, "reward").dtype = tensor_pb2.DTYPE_UNSPECIFIED

    def unknown_dtype_number(r):
        column(r, "reward").dtype = 99

    def unknown_column(r):
        c = r.batch.columns.add(name="bonus")
        codec.encode_tensor(np.zeros(8, np.float32), c.tensor)

    def missing_column(r):
        del r.batch.columns[1]

    def duplicate_column(r):
        c = r.batch.columns.add(name="reward")
        codec.encode_tensor(np.zeros(8, np.float32), c.tensor)

    def ragged(r):
        codec.encode_tensor(np.zeros(7, np.float32), column(r, "reward"))

    def scalar_column(r):
        codec.encode_tensor(np.float32(1.0), column(r, "reward"))

    def empty_batch(r):
        del r.batch.columns[:]

    def zero_rows(r):
        for c in r.batch.columns:
            arr = codec.decode_tensor(c.tensor)
            codec.encode_tensor(arr[:0], c.tensor)

    def too_many_rows(r):
        r.CopyFrom(good_request(1001))

    def priority(value):
        def set_priority(r):
            p = np.ones(8)
            p[3] = value
            codec.encode_tensor(p, r.priorities)

        return set_priority

    def priorities_wrong_length(r):
        codec.encode_tensor(np.ones(5), r.priorities)

    def priorities_int(r):
        codec.encode_tensor(np.ones(8, np.int64), r.priorities)

    def writer_id(value):
        def set_writer_id(r):
            r.writer_id = value

        return set_writer_id

    return [
        (
            "dtype differs",
            wrong_dtype,
            "column 'obs' is float64[4] per row, the table signature wants float32[4]",
        ),
        ("shape differs", wrong_shape, "column 'obs' is float32[5] per row"),
        ("byte length", short_data, "column 'obs': 125 data bytes, but shape [8, 4] of float32 needs 128"),
        ("negative dim", negative_dim, "column 'obs': dimension -4 out of range"),
        ("huge dim", huge_dim, "column 'obs': dimension 1099511627776 out of range"),
        ("unspecified dtype", unspecified_dtype, "column 'reward': unknown or unspecified dtype 0"),
        ("unknown dtype", unknown_dtype_number, "column 'reward': unknown or unspecified dtype 99"),
        ("unknown column", unknown_column, "unknown ['bonus']"),
        ("missing column", missing_column, "missing ['action']"),
        ("duplicate column", duplicate_column, "duplicate column 'reward'"),
        ("ragged", ragged, "ragged batch"),
        ("scalar column", scalar_column, "column 'reward' is a scalar"),
        ("no columns", empty_batch, "batch has no columns"),
        ("zero rows", zero_rows, "batch has 0 rows"),
        ("rows over capacity", too_many_rows, "batch of 1001 rows exceeds the table capacity (1000)"),
        ("priority NaN", priority(np.nan), "first: index 3 = nan"),
        ("priority +inf", priority(np.inf), "first: index 3 = inf"),
        ("priority -inf", priority(-np.inf), "first: index 3 = -inf"),
        ("priority negative", priority(-0.5), "first: index 3 = -0.5"),
        ("priority huge", priority(1e300), "<= 1e+25; 1 are not (first: index 3 = 1e+300)"),
        ("priorities length", priorities_wrong_length, "priorities has shape [5], expected [8]"),
        ("priorities dtype", priorities_int, "priorities must be float32 or float64, got int64"),
        (
            "writer id 70,000 characters",
            writer_id("w" * 70_000),
            "writer_id is 70000 bytes (UTF-8), over the limit of 256 bytes",
        ),
        (
            "writer id 257 bytes",
            writer_id("é" * 128 + "w"),
            "writer_id is 257 bytes (UTF-8), over the limit of 256",
        ),
    ]


@pytest.mark.parametrize(("case", "mutate", "message"), _mutations(), ids=[m[0] for m in _mutations()])
def test_bad_insert_is_rejected_precisely_and_nothing_changes(filled, case, mutate, message):
    request = good_request()
    mutate(request)
    ack = insert_ack(filled, request)
    assert ack.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0], case
    assert message in ack.error_message
    assert_intact(filled)
    # The same stream/writer can go on: a good batch after a bad one is stored.
    assert insert_ack(filled, good_request()).rows == 8


def merged_request(batches: int, rows: int = 8, sequence: int = 1) -> replay_pb2.InsertRequest:
    """`batches` batches of `rows` rows in one request (InsertRequest.batch_rows), with priorities 1, 2, ..."""
    request = replay_pb2.InsertRequest(writer_id="merged-test", sequence=sequence)
    codec.encode_batch(cartpole_batch(batches * rows, 1000), request.batch)
    codec.encode_tensor(np.arange(1, batches * rows + 1, dtype=np.float64), request.priorities)
    request.batch_rows.extend([rows] * batches)
    return request


def test_a_bad_batch_inside_a_merged_request_is_refused_alone(filled):
    """Batch 2 of 4 has a NaN priority: exactly it is refused, with the message it would get alone; the batches
    around it are stored, and the acks say so in batch order."""
    request = merged_request(4)
    priorities = codec.decode_tensor(request.priorities).copy()
    priorities[8 + 3] = np.nan  # row 3 of batch 2
    codec.encode_tensor(priorities, request.priorities)
    channel, s = stub(filled)
    with channel:
        acks = list(s.Insert(iter([request]), timeout=10))
    assert [(a.sequence, a.batches, a.error_code, a.rows, a.first_key) for a in acks] == [
        (1, 1, 0, 8, ROWS),
        (2, 1, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0, 0),
        (4, 2, 0, 16, ROWS + 8),
    ]
    assert "first: index 3 = nan" in acks[1].error_message
    info = filled.table.info()
    assert (info.size, info.inserted_total) == (ROWS + 24, ROWS + 24)
    stored = filled.table._storage["action"][ROWS : ROWS + 24]  # white box: the rows in key order
    np.testing.assert_array_equal(stored, np.r_[1000:1008, 1016:1032])
    # A request whose batches all miss the signature: each refused on its own, all with the table's reason.
    request = merged_request(3, sequence=10)
    codec.encode_tensor(np.zeros((24, 4), np.float64), column(request, "obs"))
    channel, s = stub(filled)
    with channel:
        acks = list(s.Insert(iter([request]), timeout=10))
    assert [(a.sequence, a.batches) for a in acks] == [(10, 1), (11, 1), (12, 1)]
    assert all("'obs' is float64" in a.error_message for a in acks)
    assert filled.table.info().inserted_total == ROWS + 24


def _malformed_merges():
    def sum_short(r):
        r.batch_rows[-1] -= 1

    def zero_entry(r):
        r.batch_rows[:] = [8, 0, 8, 8]

    def ragged(r):
        codec.encode_tensor(np.zeros(31, np.float32), column(r, "reward"))

    def priorities_short(r):
        codec.encode_tensor(np.ones(31), r.priorities)

    def sequence_overflow(r):
        r.sequence = (1 << 64) - 2

    def too_many(r):
        r.batch_rows[:] = [1] * 5000

    def undecodable(r):
        column(r, "obs").data = column(r, "obs").data[:-1]

    def long_writer_id(r):
        r.writer_id = "w" * 70_000

    return [
        ("batch_rows sum short", sum_short, "column 'obs' has 32 rows; batch_rows sum to 31"),
        ("zero entry", zero_entry, "batch_rows has an entry 0"),
        ("ragged", ragged, "column 'reward' has 31 rows; batch_rows sum to 32"),
        ("priorities short", priorities_short, "column 'priorities' has 31 rows"),
        ("sequence overflow", sequence_overflow, "sequence numbers pass 2**64 - 1"),
        ("too many batches", too_many, "more than 4096 batches"),
        ("undecodable tensor", undecodable, "column 'obs': 511 data bytes"),
        (
            "writer id 70,000 characters",
            long_writer_id,
            "writer_id is 70000 bytes (UTF-8), over the limit of 256",
        ),
    ]


@pytest.mark.parametrize(
    ("case", "mutate", "message"), _malformed_merges(), ids=[m[0] for m in _malformed_merges()]
)
def test_a_malformed_merged_request_is_refused_whole_by_one_ack(filled, case, mutate, message):
    request = merged_request(4)
    mutate(request)
    channel, s = stub(filled)
    with channel:
        acks = list(s.Insert(iter([request]), timeout=10))
    batches = len(request.batch_rows)
    assert [(a.error_code, a.batches) for a in acks] == [
        (grpc.StatusCode.INVALID_ARGUMENT.value[0], batches)
    ], case
    assert acks[0].sequence == min(request.sequence + batches - 1, (1 << 64) - 1)
    assert message in acks[0].error_message
    assert_intact(filled)


def test_sdk_raises_the_rejection_on_flush(filled):
    with ReplayClient(filled.address) as client:
        batch = cartpole_batch(8)
        batch["obs"] = batch["obs"].astype(np.float64)
        client.insert(batch)
        with pytest.raises(InvalidArgumentError, match="INVALID_ARGUMENT.*'obs' is float64"):
            client.flush()
    assert_intact(filled)


def test_writer_ids_are_at_most_256_bytes_in_the_sdk_and_on_the_shard(filled):
    """MAX_WRITER_ID_BYTES (replay.proto, InsertRequest.writer_id): the SDK refuses a longer id when the client is
    made; an id of exactly 256 bytes (UTF-8, not characters) is stored and de-duplicated."""
    with pytest.raises(ValueError, match=r"is 257 bytes in UTF-8, over the limit of 256 bytes"):
        ReplayClient(filled.address, writer_id="é" * 128 + "w")
    with pytest.raises(ValueError, match=r"is 70000 bytes in UTF-8"):
        ReplayClient(filled.address, writer_id="w" * 70_000)
    request = good_request()
    request.writer_id = "é" * 128
    assert insert_ack(filled, request).rows == 8
    assert insert_ack(filled, request).duplicate
    with ReplayClient(filled.address, writer_id="ü" * 128) as client:
        client.insert(cartpole_batch(8, 2000))
        client.flush()
    assert filled.table.info().inserted_total == ROWS + 16


def test_oversize_message_is_resource_exhausted(filled):
    request = replay_pb2.InsertRequest(writer_id="big", sequence=1)
    codec.encode_batch(cartpole_batch(40_000), request.batch)  # 1.3 MiB > the shard's 1 MiB limit
    channel, s = stub(filled)
    with channel, pytest.raises(grpc.RpcError) as err:
        list(s.Insert(iter([request]), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_intact(filled)
    # The SDK refuses it before sending when it knows the limit.
    with (
        ReplayClient(filled.address, max_message_bytes=1 << 20) as client,
        pytest.raises(ResourceExhaustedError, match="over the message limit"),
    ):
        client.insert(cartpole_batch(40_000))
    assert_intact(filled)


@pytest.mark.parametrize(
    ("value", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"), (-1.0, "-1.0")]
)
def test_bad_priority_update_is_invalid_argument(filled, value, shown):
    priorities = np.ones(4)
    priorities[2] = value
    with (
        ReplayClient(filled.address) as client,
        pytest.raises(InvalidArgumentError, match=f"index 2 = {shown}"),
    ):
        client.update_priorities(np.arange(4, dtype=np.uint64), priorities, incarnation=0)
    assert_intact(filled)


def test_malformed_update_requests(filled):
    channel, s = stub(filled)
    cases = [
        (np.arange(4, dtype=np.uint64), np.ones(3), "keys [4] and priorities [3] must have the same shape"),
        (np.arange(4, dtype=np.float32), np.ones(4), "keys must be uint64 or int64, got float32"),
        (np.arange(4, dtype=np.uint64).reshape(2, 2), np.ones((2, 2)), "keys has shape [2, 2], expected [n]"),
    ]
    with channel:
        for keys, priorities, message in cases:
            request = replay_pb2.UpdatePrioritiesRequest()
            codec.encode_tensor(keys, request.keys)
            codec.encode_tensor(priorities, request.priorities)
            with pytest.raises(grpc.RpcError) as err:
                s.UpdatePriorities(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in err.value.details()
    assert_intact(filled)


def test_stale_and_unknown_keys_are_ignored_and_counted(filled):
    with ReplayClient(filled.address) as client:
        result = client.update_priorities(
            np.array([64, 10_000, 2**63 + 5], dtype=np.uint64), np.full(3, 9.0), incarnation=0
        )
        assert (result.applied, result.stale) == (0, 3)
        assert client.info().stale_updates_total == 3
    assert_intact(filled)


@pytest.mark.parametrize("batch_size", [0, 513])
def test_sample_batch_size_out_of_range(filled, batch_size):
    channel, s = stub(filled)
    with channel, pytest.raises(grpc.RpcError) as err:
        s.Sample(replay_pb2.SampleRequest(batch_size=batch_size), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"batch_size ({batch_size}) must be in [1, 512]" in err.value.details()
    assert_intact(filled)


def test_empty_table_sample(make_shard):
    shard = make_shard()
    channel, s = stub(shard)
    with channel:
        with pytest.raises(grpc.RpcError) as err:
            s.Sample(replay_pb2.SampleRequest(batch_size=4, no_wait=True), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "holds 0 rows" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            s.Sample(replay_pb2.SampleRequest(batch_size=4), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(4))
        client.flush()
        assert client.sample(4).size == 4


def test_cancelled_stream_leaves_no_half_batch(filled):
    """A client that cancels mid-stream: the batches the shard got are stored whole and in order, nothing after the
    cancellation is stored. Asserted once the shard itself has seen the cancellation."""
    inserts = {"running": 0}
    original = filled.table.insert

    def observed_insert(*args, **kwargs):
        inserts["running"] += 1
        try:
            return original(*args, **kwargs)
        finally:
            inserts["running"] -= 1

    filled.table.insert = observed_insert
    release = threading.Event()

    def requests():
        for i in range(50):
            if i == 10:
                release.wait(10)  # the rest would come after the cancellation
            request = replay_pb2.InsertRequest(writer_id="cancelling", sequence=i + 1)
            codec.encode_batch(cartpole_batch(8, 1000 + 8 * i), request.batch)
            yield request

    channel, s = stub(filled)
    with channel:
        call = s.Insert(requests(), timeout=10)
        assert next(call).rows == 8  # at least one batch stored
        call.cancel()
        stored_then = filled.table.info().inserted_total
        wait_until(lambda: not inserts["running"] and call.done(), "the shard finished its last insert")
        release.set()
        # Nothing arrives after the cancellation: the count stays where the cancelled stream left it.
        assert filled.table.info().inserted_total - stored_then <= 8
    info = filled.table.info()
    stored = info.size - ROWS
    assert info.size == info.inserted_total and 8 <= stored <= 80 and stored % 8 == 0
    ids = filled.table._storage["action"][ROWS : info.size]  # white box: the rows in insertion order
    np.testing.assert_array_equal(ids, np.arange(1000, 1000 + stored))

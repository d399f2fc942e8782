"""The ReplayService's messages as Python types (replay_server/core/types.py) and their encodings (wire.py): what the table produces, the servicer
encodes and the client decodes is the same value, field for field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.proto import replay_pb2
from apexrl.replay_server import wire
from apexrl.replay_server.core import types
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from tests.conftest import cartpole_batch


def over_the_wire(message):
    return type(message).FromString(message.SerializeToString())


@pytest.fixture
def table() -> ReplayTable:
    t = ReplayTable(TableConfig(capacity=50, alpha=0.5, seed=0, samples_per_insert=2.0, min_size_to_sample=3))
    t.insert(cartpole_batch(30), np.linspace(0.5, 3.0, 30))
    t.insert(cartpole_batch(30, 30), np.linspace(1.0, 2.0, 30))  # wraps: 10 rows evicted
    t.sample(8)
    t.update_priorities(np.array([1, 59], np.uint64), np.array([2.0, 4.0]))
    return t


def test_shard_info_round_trips_every_field(table):
    info = table.info()
    decoded = wire.decode_info(over_the_wire(wire.encode_info(info)))
    assert decoded == info and decoded.signature is not None  # every field, the signature included
    signatures = ("signature", "item_signature")
    assert [f.name for f in dataclasses.fields(info) if f.name not in signatures] == list(wire._INFO_SCALARS)
    assert decoded.totals == types.ShardTotals(info.total_priority, 50, info.min_priority, table.incarnation)
    assert set(wire._INFO_SCALARS) <= set(replay_pb2.InfoResponse.DESCRIPTOR.fields_by_name)
    empty = ReplayTable(TableConfig(capacity=5)).info()
    assert wire.decode_info(over_the_wire(wire.encode_info(empty))).signature is None


def test_a_sampled_batch_round_trips_with_its_totals(table):
    batch = table.sample(16)
    decoded = wire.decode_sample(over_the_wire(wire.encode_sample(batch)))
    for name in ("keys", "priorities"):
        assert getattr(decoded, name).dtype == getattr(batch, name).dtype
        np.testing.assert_array_equal(getattr(decoded, name), getattr(batch, name))
    assert decoded.columns.keys() == batch.columns.keys()
    for name, column in batch.columns.items():
        np.testing.assert_array_equal(decoded.columns[name], column)
    assert decoded.totals == batch.totals
    np.testing.assert_allclose(decoded.probabilities, batch.priorities / batch.total_priority)


def test_a_sequence_sample_and_info_round_trip():
    config = TableConfig(capacity=50, max_sequence_length=4, seed=0)
    t = ReplayTable(config)
    state = np.arange(16, dtype=np.float32).reshape(2, 8)
    items = ItemBatch(np.array([3, 5]), np.array([3, 4]), {"state": state}, np.array([1.0, 2.0]))
    request = wire.encode_insert(cartpole_batch(5), None, "w", items=items)
    decoded_items = wire.decode_items(over_the_wire(request))
    np.testing.assert_array_equal(decoded_items.lengths, [3, 4])
    assert t.insert(cartpole_batch(5), writer_id="w", sequence=1, items=decoded_items).items == 2
    info = wire.decode_info(over_the_wire(wire.encode_info(t.info())))
    assert info == t.info() and info.item_signature == Signature.parse("state:float32[8]")
    assert (info.size, info.steps, info.max_sequence_length) == (2, 5, 4)
    batch = t.sample(6)
    back = wire.decode_sample(over_the_wire(wire.encode_sample(batch)))
    assert back.sequence_length == 4 and back.lengths.dtype == np.int32
    np.testing.assert_array_equal(back.lengths, batch.lengths)
    np.testing.assert_array_equal(back.item_columns["state"], batch.item_columns["state"])
    assert back.columns["obs"].shape == (24, *batch.columns["obs"].shape[1:])


def test_probabilities_are_uniform_when_every_priority_is_zero():
    t = ReplayTable(TableConfig(capacity=4, seed=0))
    t.insert(cartpole_batch(4), np.zeros(4))
    np.testing.assert_array_equal(t.sample(8).probabilities, np.full(8, 0.25))


def test_updates_and_their_results_round_trip():
    keys, priorities = np.array([3, 2**63 + 1], np.uint64), np.array([0.5, 7.0])
    decoded = wire.decode_update(over_the_wire(wire.encode_update(keys, priorities, incarnation=99)))
    assert decoded[0].dtype == np.uint64 and decoded[1].dtype == np.float64 and decoded[2] == 99
    np.testing.assert_array_equal(decoded[0], keys)
    np.testing.assert_array_equal(decoded[1], priorities)
    result = types.UpdateResult(applied=3, stale=2, totals=types.ShardTotals(12.5, 40, 0.25, 2**63 + 5))
    assert wire.decode_update_result(over_the_wire(wire.encode_update_result(result))) == result


def test_inserts_and_acks_round_trip():
    columns, priorities = cartpole_batch(5, 10), np.arange(5, dtype=np.float32)
    request = over_the_wire(wire.encode_insert(columns, priorities, "writer-7"))
    assert request.writer_id == "writer-7" and request.sequence == 0  # the client numbers it when queued
    got_columns, got_priorities = wire.decode_insert(request)
    for name, column in columns.items():
        np.testing.assert_array_equal(got_columns[name], column)
    np.testing.assert_array_equal(got_priorities, priorities)
    assert wire.decode_insert(wire.encode_insert(columns, None, "w"))[1] is None
    ack = over_the_wire(wire.encode_ack(4, 11, types.InsertResult(first_key=20, rows=5, duplicate=False)))
    assert (ack.sequence, ack.incarnation, ack.first_key, ack.rows, ack.duplicate, ack.error_code) == (
        4,
        11,
        20,
        5,
        False,
        0,
    )
    refused = over_the_wire(wire.encode_ack(5, 11, error_code=3, error_message="bad"))
    assert (refused.rows, refused.error_code, refused.error_message) == (0, 3, "bad")
    broken = wire.encode_insert(columns, None, "w")
    broken.batch.columns[0].tensor.data = b"\0"
    with pytest.raises(InvalidArgumentError, match="column 'obs'"):
        wire.decode_insert(broken)


def test_merged_inserts_carry_their_batch_boundaries_and_acks_their_batch_count():
    columns, priorities = cartpole_batch(9), np.arange(9, dtype=np.float64)
    one = over_the_wire(wire.encode_insert(columns, priorities, "w", batch_rows=[9]))
    assert list(one.batch_rows) == []  # one batch: a plain request, as every older client sends it
    assert wire.merged_batch_offsets(one, *wire.decode_insert(one)) is None
    merged = over_the_wire(wire.encode_insert(columns, priorities, "w", batch_rows=[2, 3, 4]))
    merged.sequence = 7
    assert list(merged.batch_rows) == [2, 3, 4]
    assert wire.merged_batch_offsets(merged, *wire.decode_insert(merged)) == [0, 2, 5, 9]
    ack = over_the_wire(
        wire.encode_ack(9, 1, types.InsertResult(first_key=0, rows=9, duplicate=False), batches=3)
    )
    assert (ack.sequence, ack.batches, ack.rows) == (9, 3, 9)
    assert over_the_wire(wire.encode_ack(4, 1, error_code=3)).batches == 1
    merged.batch_rows[1] = 4
    with pytest.raises(
        InvalidArgumentError,
        match=r"merged request 7 \(3 batches\): column 'obs' has 9 rows; "
        r"batch_rows sum to 10",
    ):
        wire.merged_batch_offsets(merged, *wire.decode_insert(merged))

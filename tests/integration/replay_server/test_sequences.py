"""Sequence tables over real gRPC on 127.0.0.1: the SDK's SequenceWriter writes overlapping windows that the shard
stores once and samples whole; bad items are refused with INVALID_ARGUMENT naming the field and store nothing;
a transition client is unchanged; a writer that fails over sends the steps its windows need again."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from apexrl.common import codec
from apexrl.common.compression import CompressedColumn, compress, decompress
from apexrl.common.errors import DeadlineExceededError, InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import ReplayClient, ShardedWriter
from apexrl.replay_server.client.sequence_writer import SequenceWriter
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import cartpole_batch, frame_ids, pixel_frames, start_shard_process

STEP = Signature.parse("obs:float32[2],reward:float32[]")
STATE = Signature.parse("state:float32[3]")


def sequence_config(**kwargs) -> TableConfig:
    base = {"capacity": 10_000, "max_sequence_length": 8, "signature": STEP, "seed": 0}
    return TableConfig(**{**base, **kwargs})


def write_episode(writer: SequenceWriter, steps: int, offset: float = 0.0) -> None:
    """An episode whose obs[0] numbers its steps (offset + t) and whose state at t is (offset + t) * 3."""
    for t in range(steps):
        value = offset + t
        writer.append(
            {"obs": np.array([value, -value], np.float32), "reward": np.float32(1.0)},
            {"state": np.full(3, value, np.float32)},
        )
    writer.end_episode()


def test_windows_are_written_once_and_sampled_whole(make_shard) -> None:
    shard = make_shard(sequence_config())
    with ShardedWriter(shard.address) as sharded:
        writer = SequenceWriter(sharded, length=8, period=4)
        write_episode(writer, 21)  # windows at 0, 4, 8, 12 (full) and 16 (cut to 5 steps)
        writer.flush()
    info = shard.table.info()
    assert (info.steps, info.size, info.inserted_total) == (21, 5, 21)  # each step stored once
    with ReplayClient(shard.address) as client:
        batch = client.sample(200)
    assert batch.sequence_length == 8
    obs = batch.columns["obs"].reshape(200, 8, 2)[:, :, 0]
    starts = obs[:, 0].astype(int)
    assert set(starts.tolist()) == {0, 4, 8, 12, 16}
    for row, start, length in zip(obs, starts, batch.lengths, strict=True):
        assert length == (5 if start == 16 else 8)
        np.testing.assert_array_equal(row[:length], start + np.arange(length))
        np.testing.assert_array_equal(row[length:], start + length - 1)  # padding repeats the last step
    np.testing.assert_array_equal(batch.item_columns["state"][:, 0], starts)
    np.testing.assert_array_equal(batch.keys, starts)  # one episode on a fresh shard: key = step number


def _items_held(table, count: int = 600) -> set[tuple]:
    """Every item a table holds (key, length, its steps' obs[0], its state[0]): `count` draws of uniform items."""
    batch = table.sample(count)
    obs = batch.columns["obs"].reshape(count, -1, 2)[:, :, 0]
    return {
        (key, length, tuple(row[:length].tolist()), float(state))
        for key, length, row, state in zip(
            batch.keys.tolist(), batch.lengths.tolist(), obs, batch.item_columns["state"][:, 0], strict=True
        )
    }


def test_several_windows_per_request_store_the_same_items_in_fewer_requests(make_shard) -> None:
    """windows_per_request = 3 sends up to 3 windows (or 12 steps) per request: the shard holds exactly the items
    one window per request gives (episodes cut short included), from far fewer requests; `flush` sends the complete
    windows still held back."""
    one, three = make_shard(sequence_config()), make_shard(sequence_config())
    requests = {}
    for shard, k in ((one, 1), (three, 3)):
        with ShardedWriter(shard.address) as sharded:
            writer = SequenceWriter(sharded, length=8, period=4, windows_per_request=k)
            write_episode(writer, 41)  # windows at 0 .. 32 full, 36 cut to 5 steps
            write_episode(writer, 6, offset=100)  # one window, cut to 6 steps
            write_episode(writer, 30, offset=200)
            for t in range(29):  # no end: windows at 0 .. 20 complete (the newest step is held back)
                writer.append(
                    {"obs": np.array([300 + t, 0], np.float32), "reward": np.float32(1.0)},
                    {"state": np.full(3, 300 + t, np.float32)},
                )
            assert writer.items_held == (0 if k == 1 else 1)  # sent at t = 24 with 16; 20 waits
            writer.flush()
            assert writer.items_held == 0
            requests[k] = sharded.shards[0].requests_sent
        info = shard.table.info()
        assert (info.size, info.steps) == (10 + 1 + 7 + 6, 41 + 6 + 30 + 28)
    assert _items_held(one.table) == _items_held(three.table)
    assert len(_items_held(one.table)) == 24
    assert requests[3] < requests[1] / 2  # 41 steps: 10 requests at one window each, 4 at three


@pytest.mark.parametrize("windows_per_request", [0, -1, 1.5, True])
def test_windows_per_request_must_be_a_positive_integer(make_shard, windows_per_request) -> None:
    shard = make_shard(sequence_config())
    with ShardedWriter(shard.address) as sharded, pytest.raises(ValueError, match="windows_per_request"):
        SequenceWriter(sharded, length=8, period=4, windows_per_request=windows_per_request)


def test_a_transition_client_is_unchanged_on_a_transition_shard(shard) -> None:
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10))
        client.flush()
        batch = client.sample(4)
        info = client.info()
    assert batch.sequence_length == 0 and batch.lengths is None and batch.item_columns == {}
    assert (info.max_sequence_length, info.steps, info.item_signature) == (0, 0, None)


def _raw_insert(address: str, request: replay_pb2.InsertRequest) -> replay_pb2.InsertAck:
    with grpc.insecure_channel(address) as channel:
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        return next(iter(stub.Insert(iter([request]), timeout=30)))


def _request(rows: int, ends, lengths, state_shape=(3,), writer_id: str = "w") -> replay_pb2.InsertRequest:
    request = replay_pb2.InsertRequest(writer_id=writer_id, sequence=1)
    steps = {"obs": np.zeros((rows, 2), np.float32), "reward": np.zeros(rows, np.float32)}
    codec.encode_batch(steps, request.batch)
    request.items.end.extend(ends)
    request.items.length.extend(lengths)
    codec.encode_batch({"state": np.zeros((len(ends), *state_shape), np.float32)}, request.items.columns)
    return request


@pytest.mark.parametrize(
    ("request_args", "field"),
    [
        ((4, [4], [9]), "items.length[0]"),  # a window longer than declared
        ((4, [4], [6]), "items.length[0]"),  # steps the shard does not hold
        ((4, [5], [4]), "items.end[0]"),
        ((4, [4], [4], (2,)), "items.columns"),  # a state of the wrong shape
        ((4, [4, 2], [4]), "items.length has 1"),
    ],
)
def test_bad_items_are_refused_with_invalid_argument_naming_the_field(
    make_shard, request_args, field
) -> None:
    shard = make_shard(sequence_config(item_signature=STATE))
    ack = _raw_insert(shard.address, _request(*request_args))
    assert ack.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert field in ack.error_message
    info = shard.table.info()
    assert (info.steps, info.size) == (0, 0)  # nothing of it stored


def test_items_sent_to_a_transition_shard_are_refused(shard) -> None:
    request = _request(4, [4], [4])
    request.batch.Clear()
    codec.encode_batch(cartpole_batch(4), request.batch)
    ack = _raw_insert(shard.address, request)
    assert ack.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "stores transitions" in ack.error_message
    assert shard.table.info().size == 0


def test_a_refused_item_is_raised_by_the_sdk(make_shard) -> None:
    shard = make_shard(sequence_config(item_signature=STATE))
    with ShardedWriter(shard.address) as sharded:
        writer = SequenceWriter(sharded, length=8, period=4)
        for _ in range(9):  # the window's state has the wrong shape
            writer.append({"obs": np.zeros(2, np.float32), "reward": np.float32(0)}, {"state": np.zeros(2)})
        with pytest.raises(InvalidArgumentError, match="items.columns"):
            writer.flush()


def test_trajectories_of_one_writer_keep_their_own_steps(make_shard) -> None:
    shard = make_shard(sequence_config(max_sequence_length=4))
    with ShardedWriter(shard.address) as sharded:
        writers = [SequenceWriter(sharded, length=4, period=2, trajectory=i) for i in range(3)]
        for t in range(12):  # the three environments step in turn, through one client
            for i, writer in enumerate(writers):
                value = 100 * i + t
                writer.append(
                    {"obs": np.array([value, 0], np.float32), "reward": np.float32(0)},
                    {"state": np.zeros(3, np.float32)},
                )
        for writer in writers:
            writer.end_episode()
        sharded.flush()
    with ReplayClient(shard.address) as client:
        batch = client.sample(300)
    obs = batch.columns["obs"].reshape(300, 4, 2)[:, :, 0]
    full = batch.lengths == 4
    np.testing.assert_array_equal(np.diff(obs[full], axis=1), 1)


def test_compressed_pixel_steps_keep_their_frames(make_shard) -> None:
    pixels = Signature.parse("obs:uint8[2,16,16]@zstd,reward:float32[]")
    shard = make_shard(sequence_config(signature=pixels, max_sequence_length=4))
    with ShardedWriter(shard.address) as sharded:
        writer = SequenceWriter(sharded, length=4, period=2)
        for t in range(7):
            frame = compress(pixel_frames([t]), "zstd")
            writer.append({"obs": frame, "reward": np.float32(0)}, {"state": np.zeros(1, np.float32)})
        writer.end_episode()
        sharded.flush()
    with ReplayClient(shard.address) as client:
        batch = client.sample(50)
    column = batch.columns["obs"]
    assert isinstance(column, CompressedColumn) and len(column) == 50 * 4
    frames, errors = decompress(column)
    assert not errors
    ids = frame_ids(frames).reshape(50, 4)
    for row, start, length in zip(ids, batch.keys.astype(int), batch.lengths, strict=True):
        np.testing.assert_array_equal(row[:length], start + np.arange(length))


@pytest.mark.parametrize("windows_per_request", [1, 3])
def test_a_writer_that_fails_over_sends_the_steps_its_windows_need_again(
    make_shard, windows_per_request
) -> None:
    """The writer's shard goes down mid-episode: once its backlog is full the writer moves to the other shard,
    sending first the episode's steps its open windows reach back to, so every window stored there is whole."""
    down, up = make_shard(sequence_config()), make_shard(sequence_config())
    down.server.stop(0).wait(10)
    sharded = ShardedWriter([down.address, up.address], max_in_flight=2, timeout=10)
    try:
        writer = SequenceWriter(sharded, length=8, period=4, windows_per_request=windows_per_request)
        write_episode(writer, 80)
        sharded.shards[1].flush(timeout=30)
    finally:
        sharded.close()
    info = up.table.info()
    assert info.size >= 5  # most windows reached the live shard
    batch = up.table.sample(100)
    obs = batch.columns["obs"].reshape(100, 8, 2)[:, :, 0]
    for row, length, state in zip(obs, batch.lengths, batch.item_columns["state"][:, 0], strict=True):
        np.testing.assert_array_equal(row[:length], row[0] + np.arange(length))
        assert state == row[0]  # the window's state is its first step's


def test_a_sigkill_loses_no_acknowledged_item(tmp_path) -> None:
    """A shard with --checkpoint-dir and --wal stores an episode's windows; once they are acknowledged it is
    SIGKILLed (no final checkpoint) and started again on the same directories: every item is back, whole."""
    args = [
        "--max-sequence-length",
        "8",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--wal",
        str(tmp_path / "wal"),
        "--checkpoint-every",
        "0",
    ]
    shard = start_shard_process(tmp_path, "first", *args)
    with ShardedWriter(shard.address, timeout=30) as sharded:
        writer = SequenceWriter(sharded, length=8, period=4)
        write_episode(writer, 41)
        write_episode(writer, 13, offset=500)
        writer.flush()
        with ReplayClient(shard.address) as client:
            before = client.info()
    shard.process.kill()
    shard.process.wait(10)
    shard = start_shard_process(tmp_path, "second", *args)
    try:
        with ReplayClient(shard.address) as client:
            after = client.info()
            batch = client.sample(500)
    finally:
        assert shard.stop() == 0
    assert "from the write-ahead log" in (tmp_path / "second.log").read_text()
    assert (after.size, after.steps, after.inserted_total) == (
        before.size,
        before.steps,
        before.inserted_total,
    )
    assert (before.size, before.steps) == (13, 54)
    obs = batch.columns["obs"].reshape(500, 8, 2)[:, :, 0]
    assert len(set(obs[:, 0].tolist())) == 13
    for row, length, state in zip(obs, batch.lengths, batch.item_columns["state"][:, 0], strict=True):
        np.testing.assert_array_equal(row[:length], row[0] + np.arange(length))
        assert state == row[0]


def test_a_writer_waits_for_a_name_to_list_a_shard_and_a_stop_ends_the_wait(make_shard) -> None:
    """A Service name lists no shard until the shards are Ready (Kubernetes, tests/integration/deploy): the writer
    waits for one, as ShardedWriter.insert does, instead of failing the actor; its stop ends the wait with
    nothing sent, and without a stop the writer's timeout does."""
    shard = make_shard(sequence_config())
    port = int(shard.address.rsplit(":", 1)[1])
    listed: list[str] = []

    def resolver(name: str, wanted: int) -> list[str]:
        assert (name, wanted) == ("apexrl-replay", port)
        return list(listed)

    with ShardedWriter([f"dns:///apexrl-replay:{port}"], resolve_every=0.1, resolver=resolver) as sharded:
        stop = threading.Event()
        writer = SequenceWriter(sharded, length=8, period=4, stop=stop)
        done = threading.Event()
        thread = threading.Thread(target=lambda: (write_episode(writer, 21), done.set()))
        thread.start()
        assert not done.wait(0.5)  # no shard listed: the writer waits (a bound the next lines do not need)
        listed.append("127.0.0.1")
        thread.join(30)
        assert done.is_set()
        writer.flush(timeout=30)
        assert (shard.table.info().steps, shard.table.info().size) == (21, 5)

    with ShardedWriter(
        [f"dns:///apexrl-replay:{port + 1}"], resolve_every=0.1, resolver=lambda n, p: []
    ) as none:
        stop = threading.Event()
        stopped = SequenceWriter(none, length=8, period=4, stop=stop)
        thread = threading.Thread(target=write_episode, args=(stopped, 21))
        thread.start()
        stop.set()
        thread.join(30)
        assert not thread.is_alive() and stopped.items_sent == 0
        with pytest.raises(DeadlineExceededError, match="no shard address resolved"):
            write_episode(SequenceWriter(none, length=8, period=4, timeout=0.3), 21)

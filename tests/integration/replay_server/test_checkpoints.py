"""Checkpoints of real shard processes (`apexrl replay --checkpoint-dir`): taken while rows are inserted and
sampled, written at SIGTERM and restored at start (NOT_SERVING until then), a corrupt newest one skipped (a torn
file, a flipped bit, or valid checksums over invalid content), a checkpoint of another signature refused; with the
write-ahead log, no acknowledged row lost, and a log that cannot be replayed whole is a loud, counted gap."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from collections import Counter

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from apexrl.actor import ReplayClient
from apexrl.common.errors import FailedPreconditionError, UnavailableError
from apexrl.common.grpc_util import make_channel
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.durability.checkpoint import CheckpointReader
from tests.conftest import cartpole_batch, start_shard_process, wait_until


def rows_of(path) -> tuple[dict[int, int], object]:
    """key -> the `action` id stored under it, and the state, of a checkpoint file."""
    with CheckpointReader(path) as reader:
        ids = {}
        for first, columns, _ in reader.blocks():
            ids.update(
                zip(range(first, first + len(columns["action"])), columns["action"].tolist(), strict=True)
            )
        return ids, reader.state


def test_checkpoints_taken_while_rows_are_inserted_and_sampled_are_consistent(tmp_path):
    """One writer inserts rows numbered by their key while a learner samples and updates; checkpoints are asked
    for meanwhile. Each holds exactly the keys of one instant, each row the one inserted under its key, and every
    row acknowledged before the call."""
    directory = tmp_path / "ck"
    shard = start_shard_process(
        tmp_path,
        "shard",
        "--capacity",
        "20000",
        "--checkpoint-dir",
        str(directory),
        "--checkpoint-every",
        "0",
        "--checkpoint-keep",
        "10",
    )
    stop, errors, acked = threading.Event(), [], [0]

    def write() -> None:
        with ReplayClient(shard.address, timeout=30) as client:
            start = 0
            while not stop.is_set():
                client.insert(cartpole_batch(250, start))
                start += 250
                if start % 5000 == 0:
                    client.flush()
                    acked[0] = start
            client.flush()

    def learn() -> None:
        with ReplayClient(shard.address, timeout=30) as client:
            while not stop.is_set():
                batch = client.sample(128)
                np.testing.assert_array_equal(batch.keys.astype(np.int64), batch.columns["action"])
                client.update_priorities(
                    batch.keys, np.random.default_rng().random(128) + 0.1, incarnation=batch.incarnation
                )

    def guarded(work):
        try:
            work()
        except Exception as err:  # noqa: BLE001 (reported by the test)
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in (write, learn)]
    try:
        for t in threads:
            t.start()
        results = []
        with ReplayClient(shard.address, timeout=60) as control:
            for _ in range(4):
                wait_until(
                    lambda: acked[0] > (results[-1].inserted_total if results else 0) + 5000,
                    "more rows acknowledged",
                    timeout=20,
                )
                before = acked[0]
                result = control.checkpoint()
                assert result.inserted_total >= before and result.rows == min(result.inserted_total, 20000)
                results.append(result)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    assert not errors, errors
    for result in results:
        ids, state = rows_of(result.path)
        assert (state.next_key, state.size) == (result.inserted_total, result.rows)
        assert sorted(ids) == list(range(state.next_key - state.size, state.next_key))
        assert all(i == key for key, i in ids.items()), "a row is not the one inserted under its key"


def test_sigterm_writes_a_checkpoint_that_the_next_start_restores(tmp_path):
    directory = tmp_path / "ck"
    args = ("--capacity", "3000", "--checkpoint-dir", str(directory), "--checkpoint-every", "0")
    shard = start_shard_process(tmp_path, "first", *args)
    with ReplayClient(shard.address, writer_id="actor-7") as client:
        for start in range(0, 4000, 500):
            client.insert(cartpole_batch(500, start), priorities=np.arange(start, start + 500) + 1.0)
        client.flush()
        batch = client.sample(100)
        client.update_priorities(batch.keys, np.full(100, 10.0), incarnation=batch.incarnation)
        before = client.info()
    assert shard.stop(signal.SIGTERM, timeout=30) == 0
    assert "checkpoint checkpoint-0000000001.apexrl: 3000 rows" in (tmp_path / "first.log").read_text()

    shard = start_shard_process(tmp_path, "second", *args)
    try:
        with ReplayClient(shard.address, writer_id="actor-7") as client:
            after = client.info()
            for field in (
                "size",
                "inserted_total",
                "evicted_total",
                "total_priority",
                "min_priority",
                "max_priority",
                "updated_total",
                "inserted_bytes_total",
            ):
                assert getattr(after, field) == getattr(before, field), field
            assert after.incarnation != before.incarnation
            sampled = client.sample(256)
            np.testing.assert_array_equal(sampled.keys.astype(np.int64), sampled.columns["action"])
            # Keys sampled before the restart still update the same rows.
            result = client.update_priorities(batch.keys, np.full(100, 2.0), incarnation=batch.incarnation)
            assert result.applied == 100
            # The writer's sequence numbers survived: a batch it resends is recognised.
            client._inserts._next_sequence = 8  # the last batch it sent before the restart
            client.insert(cartpole_batch(500, 3500))
            client.flush()
            assert client.info().duplicate_batches_total == before.duplicate_batches_total + 1
    finally:
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    log = (tmp_path / "second.log").read_text()
    assert f"restored 3000 rows (keys 1000..3999) from {directory}/checkpoint-0000000001.apexrl" in log


def test_the_newest_checkpoint_corrupt_the_previous_one_is_restored(tmp_path):
    directory = tmp_path / "ck"
    args = ("--capacity", "1000", "--checkpoint-dir", str(directory), "--checkpoint-every", "0")
    shard = start_shard_process(tmp_path, "first", *args)
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100))
        client.flush()
        good = client.checkpoint()
        client.insert(cartpole_batch(100, 100))
        client.flush()
    assert shard.stop(signal.SIGTERM, timeout=30) == 0
    newest = directory / "checkpoint-0000000002.apexrl"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01  # a flipped bit in its rows
    newest.write_bytes(bytes(data))

    shard = start_shard_process(tmp_path, "second", *args)
    try:
        with ReplayClient(shard.address) as client:
            assert client.info().inserted_total == good.inserted_total == 100
    finally:
        shard.stop(signal.SIGTERM, timeout=30)
    log = (tmp_path / "second.log").read_text()
    assert (
        f"CORRUPT CHECKPOINT skipped: checkpoint {newest} is corrupt: chunk at slot 0: CRC32 mismatch; "
        f"renamed to checkpoint-0000000002.apexrl.corrupt"
    ) in log
    assert "restored 100 rows (keys 0..99) from" in log


def test_a_checkpoint_of_another_signature_refuses_to_start(tmp_path):
    directory = tmp_path / "ck"
    shard = start_shard_process(tmp_path, "first", "--capacity", "100", "--checkpoint-dir", str(directory))
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(10))
        client.flush()
    assert shard.stop(signal.SIGTERM, timeout=30) == 0
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "replay",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--capacity",
            "100",
            "--checkpoint-dir",
            str(directory),
            "--signature",
            "obs:float32[4],action:int32[]",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "was made with signature obs:float32[4],action:int64[]," in run.stderr
    assert (
        "field 'action' is int64[] there, int32[] here; field 'reward' only there; field 'discount' only "
        "there; field 'next_obs' only there"
    ) in run.stderr


def test_the_checkpoint_rpc_without_a_checkpoint_directory_fails_precondition(shard):
    with (
        ReplayClient(shard.address) as client,
        pytest.raises(FailedPreconditionError, match="checkpoint directory"),
    ):
        client.checkpoint()


def test_not_serving_until_the_checkpoint_is_restored(tmp_path, monkeypatch):
    """The shard's own run(): its restore is held back here, to look at the shard meanwhile."""
    from apexrl.replay_server.durability import checkpointer
    from apexrl.replay_server.server import main
    from apexrl.replay_server.server.config import ReplayConfig

    directory = tmp_path / "ck"
    seed_shard = start_shard_process(
        tmp_path, "seed", "--capacity", "500", "--checkpoint-dir", str(directory)
    )
    with ReplayClient(seed_shard.address) as client:
        client.insert(cartpole_batch(300))
        client.flush()
    assert seed_shard.stop(signal.SIGTERM, timeout=30) == 0

    release, restoring = threading.Event(), threading.Event()
    real_restore = checkpointer.Checkpointer.restore

    def slow_restore(self):
        restoring.set()
        release.wait(30)
        return real_restore(self)

    monkeypatch.setattr(checkpointer.Checkpointer, "restore", slow_restore)
    port_file = tmp_path / "port"
    config = ReplayConfig(
        capacity=500, port=0, metrics_port=-1, port_file=str(port_file), checkpoint_dir=str(directory)
    )
    stop = threading.Event()
    shard = threading.Thread(target=main.run, args=(config, stop))
    shard.start()
    try:
        assert restoring.wait(20)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        channel = make_channel(address)
        health = health_pb2_grpc.HealthStub(channel)
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        for service in ("", "apexrl.v1.ReplayService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Sample(replay_pb2.SampleRequest(batch_size=1), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "restoring" in err.value.details()
        with ReplayClient(address) as client:
            with pytest.raises(UnavailableError, match="restoring"):
                client.checkpoint()
            assert client.info().size == 0  # Info answers
            client.insert(cartpole_batch(10, 300))  # refused for now (UNAVAILABLE): kept and resent
            wait_until(lambda: client.acks_received >= 1, "the restoring shard's answer to the batch")
            assert client.pending == 1, "a batch the restoring shard refused must stay pending, to be resent"
            info = client.info()
            assert (info.size, info.inserted_total) == (0, 0), "the restoring shard stored the batch"
            release.set()
            wait_until(
                lambda: (
                    health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                    == health_pb2.HealthCheckResponse.SERVING
                ),
                "SERVING after the restore",
            )
            client.flush(timeout=20)  # the held batch went in after the restored rows
            info = client.info()
            assert (info.size, info.inserted_total) == (310, 310)
        channel.close()
    finally:
        release.set()
        stop.set()
        shard.join(30)


def leaves_by_row(directory) -> Counter:
    """(row id, stored priority) of every row of each checkpoint in `directory`'s newest file."""
    (path,) = sorted(directory.glob("checkpoint-*.apexrl"))[-1:]
    with CheckpointReader(path) as reader:
        return Counter(
            (int(i), float(p))
            for _, columns, leaves in reader.blocks()
            for i, p in zip(columns["action"], leaves, strict=True)
        )


def reshard_cli(sources, targets) -> str:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "replay-reshard",
            "--sources",
            ",".join(map(str, sources)),
            "--targets",
            ",".join(map(str, targets)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_two_saved_shards_restore_onto_three_and_three_onto_one(tmp_path):
    """M -> N through `apexrl replay-reshard`: every row once, with its priority, served by the new shards."""
    old = [tmp_path / f"old{i}" for i in range(2)]
    for i, directory in enumerate(old):
        shard = start_shard_process(
            tmp_path, f"old{i}", "--capacity", "1500", "--checkpoint-dir", str(directory)
        )
        with ReplayClient(shard.address) as client:
            for start in range(10_000 * i, 10_000 * i + 1800, 300):  # 1800 rows into 1500: wrapped
                client.insert(
                    cartpole_batch(300, start), priorities=np.random.default_rng(start).random(300) + 0.1
                )
            client.flush()
            batch = client.sample(64)
            client.update_priorities(batch.keys, np.full(64, 4.0), incarnation=batch.incarnation)
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    saved = leaves_by_row(old[0]) + leaves_by_row(old[1])
    assert sum(saved.values()) == 3000

    new = [tmp_path / f"new{i}" for i in range(3)]
    assert "resharded 3000 rows from 2 shards onto 3 (3000 rows written)" in reshard_cli(old, new)
    sizes, totals = [], []
    for i, directory in enumerate(new):
        shard = start_shard_process(
            tmp_path, f"new{i}", "--capacity", "1000", "--checkpoint-dir", str(directory)
        )
        with ReplayClient(shard.address) as client:
            info = client.info()
            sizes.append(info.size)
            totals.append(info.total_priority)
            batch = client.sample(200)
            assert set(batch.columns["action"].tolist()) <= {row for row, _ in saved}
        assert shard.stop(signal.SIGTERM, timeout=30) == 0  # its final checkpoint: the rows it restored
    assert sizes == [1000, 1000, 1000]
    assert sum(totals) == pytest.approx(sum(p * n for (_, p), n in saved.items()))
    assert sum((leaves_by_row(d) for d in new), Counter()) == saved

    one = tmp_path / "one"
    reshard_cli(new, [one])
    shard = start_shard_process(tmp_path, "one", "--capacity", "3000", "--checkpoint-dir", str(one))
    with ReplayClient(shard.address) as client:
        assert client.info().size == 3000
    assert shard.stop(signal.SIGTERM, timeout=30) == 0
    assert leaves_by_row(one) == saved


def test_with_the_write_ahead_log_a_sigkill_loses_no_acknowledged_row(tmp_path):
    """A real writer (ReplayClient) streams batches into a shard with --wal; the shard is SIGKILLed mid-stream
    and restarted on the same port. Every batch acknowledged before the kill is there, and the batches the
    writer still held are resent and stored once: exactly once across the crash."""
    directory = tmp_path / "ck"
    args = [
        "--capacity",
        "200000",
        "--checkpoint-dir",
        str(directory),
        "--wal",
        str(tmp_path / "wal"),
        "--checkpoint-every",
        "0.5",
    ]
    shard = start_shard_process(tmp_path, "first", *args)
    port = shard.address.rsplit(":", 1)[1]
    stop, sent = threading.Event(), []
    client = ReplayClient(shard.address, timeout=60, max_in_flight=16)

    def write() -> None:
        start = 0
        while not stop.is_set():
            client.insert(cartpole_batch(100, start))
            sent.append(start)
            start += 100

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until(lambda: len(sent) > 300, "a few hundred batches sent", timeout=20)
        shard.process.kill()
        shard.process.wait(10)
        # What the writer had acknowledged at the kill: every sequence not pending.
        with client._inserts._cond:
            unacknowledged = set(client._inserts._pending)
            numbered = client._inserts._next_sequence - 1
        acknowledged = numbered - len(unacknowledged)
        assert acknowledged > 100  # killed mid-stream (usually with batches in flight: `unacknowledged`)
        shard = start_shard_process(tmp_path, "second", *args, "--port", port)
        stop.set()
        writer.join(60)
        client.flush(timeout=60)  # the held batches, resent to the restarted shard
        with ReplayClient(shard.address) as check:
            info = check.info()
    finally:
        stop.set()
        client.close()
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    log = (tmp_path / "second.log").read_text()
    assert "replayed" in log and "from the write-ahead log" in log
    ids, state = rows_of(sorted(directory.glob("checkpoint-*.apexrl"))[-1])
    stored = set(ids.values())
    acked_rows = {
        row
        for sequence in range(1, numbered + 1)
        if sequence not in unacknowledged
        for row in range(sent[sequence - 1], sent[sequence - 1] + 100)
    }  # batch n has sequence n + 1
    lost = acked_rows - stored
    print(
        f"WAL SIGKILL: {len(acked_rows)} rows acknowledged before the kill, {len(lost)} lost; "
        f"{len(unacknowledged)} batches in flight resent; {len(ids)} rows stored, {len(stored)} distinct"
    )
    assert not lost
    expected = {row for start in sent for row in range(start, start + 100)}
    assert sorted(ids.values()) == sorted(expected)  # every row once: none lost, none twice
    assert info.inserted_total == len(expected) == 100 * len(sent)
    assert state.next_key == len(expected)


def test_with_the_write_ahead_log_acks_keep_their_order_errors_and_duplicates(tmp_path):
    """The Insert stream of a shard with a write-ahead log (in-process): one ack per request, in order, each
    only once its batch is logged; a bad batch and a resend are answered as without the log."""
    from apexrl.common import codec
    from apexrl.replay_server.core.table import ReplayTable, TableConfig
    from apexrl.replay_server.durability.wal import WriteAheadLog
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(TableConfig(capacity=10_000))
    wal = WriteAheadLog(tmp_path / "wal")
    wal.open(table)
    made = create_replay_server(table, "127.0.0.1:0", wal=wal)
    server, port = made.server, made.port

    def request(sequence: int, rows: int = 10, bad: bool = False) -> replay_pb2.InsertRequest:
        r = replay_pb2.InsertRequest(writer_id="w", sequence=sequence)
        batch = cartpole_batch(rows, 10 * sequence)
        if bad:
            batch["action"] = batch["action"].astype(np.int32)
        codec.encode_batch(batch, r.batch)
        return r

    requests = [
        request(1),
        request(2),
        request(3, bad=True),
        request(2),
        request(4),
        *map(request, range(5, 60)),
    ]
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            acks = list(replay_pb2_grpc.ReplayServiceStub(channel).Insert(iter(requests), timeout=30))
        assert [a.sequence for a in acks] == [r.sequence for r in requests]
        assert [(a.first_key, a.rows, a.duplicate, a.error_code) for a in acks[:5]] == [
            (0, 10, False, 0),
            (10, 10, False, 0),
            (0, 0, False, 3),
            (0, 0, True, 0),
            (20, 10, False, 0),
        ]
        assert wal.durable_key == table.next_key == 580
        assert wal.stats.wal_batches == 58 and wal.stats.wal_fsyncs <= 58
    finally:
        server.stop(0).wait(10)
        wal.close()
    replayed = ReplayTable(TableConfig(capacity=10_000))
    replayed.refuse_calls("restoring")
    assert WriteAheadLog(tmp_path / "wal").replay(replayed, restored=False) == 580


def test_with_the_write_ahead_log_merged_requests_are_acknowledged_once_logged_and_replayed(tmp_path):
    """Merged requests (several batches in one request) on a shard with a write-ahead log: each run's ack goes out
    once its batches are logged, a bad batch inside is refused alone, a resend merged differently is de-duplicated
    batch by batch, and the log replays exactly the stored rows with the writer's last stored sequence."""
    from apexrl.common import codec
    from apexrl.replay_server.core.table import ReplayTable, TableConfig
    from apexrl.replay_server.durability.wal import WriteAheadLog
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(TableConfig(capacity=10_000))
    wal = WriteAheadLog(tmp_path / "wal")
    wal.open(table)
    made = create_replay_server(table, "127.0.0.1:0", wal=wal)
    server, port = made.server, made.port

    def merged(sequence: int, batches: int, bad: int | None = None) -> replay_pb2.InsertRequest:
        r = replay_pb2.InsertRequest(writer_id="w", sequence=sequence, batch_rows=[10] * batches)
        codec.encode_batch(cartpole_batch(10 * batches, 10 * sequence), r.batch)
        priorities = np.ones(10 * batches)
        if bad is not None:
            priorities[10 * (bad - sequence)] = -1.0
        codec.encode_tensor(priorities, r.priorities)
        return r

    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            acks = list(
                replay_pb2_grpc.ReplayServiceStub(channel).Insert(
                    iter([merged(1, 4), merged(5, 3, bad=6), merged(1, 8)]), timeout=30
                )
            )
        assert [(a.sequence, a.batches, a.first_key, a.rows, a.duplicate, a.error_code) for a in acks] == [
            (4, 4, 0, 40, False, 0),
            (5, 1, 40, 10, False, 0),
            (6, 1, 0, 0, False, 3),
            (7, 1, 50, 10, False, 0),
            (7, 7, 0, 0, True, 0),
            (8, 1, 60, 10, False, 0),
        ]
        assert wal.durable_key == table.next_key == 70
    finally:
        server.stop(0).wait(10)
        wal.close()
    replayed = ReplayTable(TableConfig(capacity=10_000))
    replayed.refuse_calls("restoring")
    assert WriteAheadLog(tmp_path / "wal").replay(replayed, restored=False) == 70
    replayed.refuse_calls(None)
    np.testing.assert_array_equal(replayed._storage["action"][:70], np.r_[10:60, 70:80, 80:90])  # white box
    assert replayed.insert(cartpole_batch(10), writer_id="w", sequence=8).duplicate


def test_with_the_write_ahead_log_a_long_writer_id_is_refused_and_no_acknowledged_row_is_lost(tmp_path):
    """The security review's reproduction against a real `apexrl replay --wal` process: an insert whose writer id is
    70,000 characters (beyond the log record's 16-bit length) used to be stored but not logged, and the log's replay
    stopped at the gap, losing every acknowledged batch after it, from every writer, on a SIGKILL. It is refused
    with INVALID_ARGUMENT at decode (the stream stays open), and every acknowledged row survives the SIGKILL."""
    from apexrl.common import codec

    args = ["--capacity", "10000", "--checkpoint-dir", str(tmp_path / "ck"), "--wal", str(tmp_path / "wal")]
    shard = start_shard_process(tmp_path, "first", *args)
    port = shard.address.rsplit(":", 1)[1]

    def request(writer_id: str, sequence: int, start: int) -> replay_pb2.InsertRequest:
        r = replay_pb2.InsertRequest(writer_id=writer_id, sequence=sequence)
        codec.encode_batch(cartpole_batch(1, start), r.batch)
        return r

    writers = [ReplayClient(shard.address, writer_id=f"writer-{i}", timeout=30) for i in range(2)]
    try:
        for i in range(50):
            writers[i % 2].insert(cartpole_batch(2, 2 * i))
        for writer in writers:
            writer.flush()
        with make_channel(shard.address) as channel:
            acks = list(
                replay_pb2_grpc.ReplayServiceStub(channel).Insert(
                    iter([request("raw", 1, 100), request("x" * 70_000, 1, 101), request("raw", 2, 102)]),
                    timeout=30,
                )
            )
        assert [(a.sequence, a.error_code, a.rows) for a in acks] == [
            (1, 0, 1),
            (1, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0),
            (2, 0, 1),
        ]
        assert "writer_id is 70000 bytes (UTF-8), over the limit of 256 bytes" in acks[1].error_message
        for i in range(50, 100):
            writers[i % 2].insert(cartpole_batch(2, 2 * i + 100))
        for writer in writers:
            writer.flush()  # every batch acknowledged
        acknowledged = 2 * 100 + 2
        with ReplayClient(shard.address) as check:
            assert check.info().inserted_total == acknowledged
        shard.process.kill()
        shard.process.wait(10)
        shard = start_shard_process(tmp_path, "second", *args, "--port", port)
        with ReplayClient(shard.address) as check:
            info = check.info()
            assert (info.inserted_total, info.size) == (acknowledged, acknowledged)
            # The writers' last stored sequences came back with their rows: a resend is a duplicate.
            with ReplayClient(shard.address, writer_id="writer-1") as resend:
                resend.insert(cartpole_batch(2, 10_000))
                resend.insert(cartpole_batch(2, 10_000))
                resend.flush()
            assert check.info().duplicate_batches_total == 2
    finally:
        for writer in writers:
            writer.close()
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    assert "replayed 202 rows from the write-ahead log" in (tmp_path / "second.log").read_text()


@pytest.mark.parametrize("fault", ["the disk fills up", "an append raises"])
def test_when_the_write_ahead_log_fails_inserts_are_refused_health_is_not_serving_and_it_is_counted(
    tmp_path, monkeypatch, fault
):
    """A real server on loopback whose log fails: by a write that raises (a full disk) or by an append that raises
    (a batch the log cannot encode). The insert that met the failure is not acknowledged (UNAVAILABLE), every later
    one is refused without being stored, health turns NOT_SERVING, apexrl_replay_wal_failed is 1 and
    apexrl_replay_wal_failures_total counts the failed inserts; Sample and Info still answer."""
    from apexrl.common import codec
    from apexrl.replay_server.core.table import ReplayTable, TableConfig
    from apexrl.replay_server.durability import wal as wal_module
    from apexrl.replay_server.durability.durability_metrics import DurabilityStats
    from apexrl.replay_server.durability.wal import WriteAheadLog
    from apexrl.replay_server.server.main import metrics_registry
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(TableConfig(capacity=10_000))
    stats = DurabilityStats()
    wal = WriteAheadLog(tmp_path / "wal", stats)
    wal.open(table)
    made = create_replay_server(table, "127.0.0.1:0", registry=metrics_registry(table, stats), wal=wal)
    server, port, registry = made.server, made.port, made.registry
    address = f"127.0.0.1:{port}"

    def request(sequence: int) -> replay_pb2.InsertRequest:
        r = replay_pb2.InsertRequest(writer_id="w", sequence=sequence)
        codec.encode_batch(cartpole_batch(10, 10 * sequence), r.batch)
        return r

    def metric(name: str) -> float:
        return registry.get_sample_value(name)

    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    try:
        with make_channel(address) as channel:
            stub = replay_pb2_grpc.ReplayServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)

            def status():
                return health.Check(
                    health_pb2.HealthCheckRequest(service="apexrl.v1.ReplayService"), timeout=5
                ).status

            def insert(sequence: int) -> replay_pb2.InsertAck:
                return next(iter(stub.Insert(iter([request(sequence)]), timeout=30)))

            assert insert(1).error_code == 0
            assert status() == health_pb2.HealthCheckResponse.SERVING
            assert (metric("apexrl_replay_wal_failed"), metric("apexrl_replay_wal_failures_total")) == (0, 0)
            if fault == "the disk fills up":

                def full(fd, data):
                    raise OSError(28, "No space left on device")

                monkeypatch.setattr(wal_module, "_write_all", full)
                reason = "No space left on device"
            else:
                encode, failed = wal._record, []

                def cannot_encode_once(*batch):
                    if not failed:
                        failed.append(batch)
                        raise struct.error("ushort format requires 0 <= number <= 65535")
                    return encode(*batch)

                monkeypatch.setattr(wal, "_record", cannot_encode_once)
                reason = "65535"
            ack = insert(2)
            assert (ack.error_code, ack.rows) == (unavailable, 0) and reason in ack.error_message
            held = table.info()
            assert held.inserted_total == (
                20 if fault == "the disk fills up" else 10
            )  # never more than logged
            wait_until(
                lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING,
                "health NOT_SERVING",
                timeout=30,
            )
            assert (
                health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                == health_pb2.HealthCheckResponse.NOT_SERVING
            )
            ack = insert(3)  # refused: nothing stored that the log does not hold
            assert (ack.error_code, ack.rows) == (unavailable, 0)
            assert "write-ahead log failed" in ack.error_message and reason in ack.error_message
            assert table.info() == held
            assert (metric("apexrl_replay_wal_failed"), metric("apexrl_replay_wal_failures_total")) == (1, 2)
            # The SDK keeps a refused batch and resends it (to the restarted shard); it is never acknowledged here.
            client = ReplayClient(address, timeout=30)
            try:
                client.insert(cartpole_batch(10, 1000))
                wait_until(
                    lambda: metric("apexrl_replay_wal_failures_total") >= 4,
                    "the SDK's resends refused",
                    timeout=30,
                )
                assert client.pending == 1
            finally:
                client.close(flush_timeout=0)
            assert table.info() == held
            assert stub.Sample(replay_pb2.SampleRequest(batch_size=4), timeout=10).size == held.size
    finally:
        server.stop(0).wait(10)
        monkeypatch.undo()
        wal.close()


# --- content that checksums cannot vouch for --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scraped(port: int) -> dict[str, float]:
    """The shard's /metrics, sample name -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


INVALID_CONTENT = {  # checkpoint content with every checksum right, as a bug or a hostile peer could leave it
    "a NaN priority": {"leaves": lambda leaves: np.where(np.arange(len(leaves)) == 150, np.nan, leaves)},
    "a negative priority": {"leaves": lambda leaves: -leaves},
    "a NaN max_priority": {"max_priority": float("nan")},
    "a NaN alpha": {"alpha": float("nan")},
}


@pytest.mark.parametrize("content", list(INVALID_CONTENT))
def test_a_newest_checkpoint_with_valid_checksums_and_invalid_content_is_set_aside_like_a_corrupt_one(
    tmp_path, content
):
    """The newest checkpoint of a real shard is rewritten with invalid content and every CRC recomputed. The next
    shard does not exit (it used to, with status 1 or 2, at every restart: a crash loop); it renames the file
    *.corrupt, says so in an ERROR, counts it in apexrl_replay_corrupt_checkpoints_total, restores the previous
    checkpoint and serves."""
    from tests.support.tampered import rewrite_checkpoint

    directory = tmp_path / "ck"
    args = ("--capacity", "1000", "--checkpoint-dir", str(directory), "--checkpoint-every", "0")
    shard = start_shard_process(tmp_path, "first", *args)
    with ReplayClient(shard.address) as client:
        client.insert(cartpole_batch(100), priorities=np.full(100, 2.0))
        client.flush()
        good = client.checkpoint()
        client.insert(cartpole_batch(100, 100), priorities=np.full(100, 3.0))
        client.flush()
    assert shard.stop(signal.SIGTERM, timeout=30) == 0  # its final checkpoint holds all 200 rows
    newest = directory / "checkpoint-0000000002.apexrl"
    rewrite_checkpoint(newest, **INVALID_CONTENT[content])

    metrics_port = free_port()
    shard = start_shard_process(tmp_path, "second", *args, "--metrics-port", str(metrics_port))
    try:
        with ReplayClient(shard.address) as client:
            info = client.info()
            assert (info.inserted_total, info.size, info.max_priority) == (good.inserted_total, 100, 2.0)
            assert set(client.sample(256).columns["action"].tolist()) <= set(range(100))
            client.insert(cartpole_batch(10, 1000))  # and it takes new rows, at the priority it restored
            client.flush()
        assert scraped(metrics_port)["apexrl_replay_corrupt_checkpoints_total"] == 1
    finally:
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    log = (tmp_path / "second.log").read_text()
    assert f"CORRUPT CHECKPOINT skipped: checkpoint {newest} holds invalid content: " in log, log
    assert "restored 100 rows (keys 0..99) from" in log
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()


def test_with_the_write_ahead_log_an_invalid_newest_checkpoint_loses_no_acknowledged_row(tmp_path):
    """With --wal, falling back to the previous checkpoint costs nothing: the log still holds every row after it
    (it is truncated only up to the oldest checkpoint kept), so after a SIGKILL every acknowledged row is back."""
    from tests.support.tampered import rewrite_checkpoint

    args = [
        "--capacity",
        "10000",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--wal",
        str(tmp_path / "wal"),
        "--checkpoint-every",
        "0",
        "--checkpoint-keep",
        "2",
    ]
    shard = start_shard_process(tmp_path, "first", *args)
    port = shard.address.rsplit(":", 1)[1]
    with ReplayClient(shard.address) as client:
        for start in (0, 100, 200):
            client.insert(cartpole_batch(100, start))
            client.flush()
            if start < 200:
                client.checkpoint()  # at keys 100 and 200
    shard.process.kill()
    shard.process.wait(10)
    newest = sorted((tmp_path / "ck").glob("checkpoint-*.apexrl"))[-1]
    rewrite_checkpoint(newest, leaves=lambda leaves: np.where(leaves > 0, np.inf, leaves))
    shard = start_shard_process(tmp_path, "second", *args, "--port", port)
    try:
        with ReplayClient(shard.address) as client:
            info = client.info()
            assert (info.inserted_total, info.size) == (300, 300)
            result = client.checkpoint()
    finally:
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    ids, _ = rows_of(result.path)
    assert ids == {key: key for key in range(300)}  # every row under its own key
    log = (tmp_path / "second.log").read_text()
    assert "holds invalid content: row 0 has priority ** alpha inf" in log
    assert "restored 100 rows (keys 0..99)" in log and "replayed 200 rows from the write-ahead log" in log


def test_a_write_ahead_log_record_that_cannot_be_replayed_is_a_loud_counted_gap(tmp_path):
    """A record of a real shard's log rewritten with a NaN priority and its CRC recomputed: the restarted shard
    replays the rows before it, logs WRITE-AHEAD LOG GAP naming the keys lost, counts the gap in
    apexrl_replay_wal_replay_gaps_total and serves (before: one ERROR line, and no metric to alert on)."""
    from tests.support.tampered import rewrite_wal_record, with_priority

    args = ["--capacity", "10000", "--checkpoint-dir", str(tmp_path / "ck"), "--wal", str(tmp_path / "wal")]
    shard = start_shard_process(tmp_path, "first", *args)
    with ReplayClient(shard.address) as client:
        for start in range(0, 300, 100):
            client.insert(cartpole_batch(100, start))
            client.flush()  # one record per batch
    shard.process.kill()
    shard.process.wait(10)
    (segment,) = (tmp_path / "wal").glob("wal-*.log")
    rewrite_wal_record(segment, 1, lambda payload: with_priority(payload, float("nan"), row=7))
    metrics_port = free_port()
    shard = start_shard_process(tmp_path, "second", *args, "--metrics-port", str(metrics_port))
    try:
        with ReplayClient(shard.address) as client:
            assert client.info().inserted_total == 100
        metrics = scraped(metrics_port)
        assert (
            metrics["apexrl_replay_wal_replay_gaps_total"],
            metrics["apexrl_replay_wal_replayed_rows"],
        ) == (1, 100)
    finally:
        assert shard.stop(signal.SIGTERM, timeout=30) == 0
    log = (tmp_path / "second.log").read_text()
    assert f"WRITE-AHEAD LOG GAP: {segment}: the record at byte " in log
    assert "the rows from key 100 on are lost" in log and "priorities must be finite" in log

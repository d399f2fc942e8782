"""With the write-ahead log a shard acknowledges a batch only once its fsync has returned (docs/reliability.md §3).

The log's fsync is held back through its `sync` seam (the real os.fsync behind an Event), so the test sees the
moment the batch is written to its segment but not yet durable: the ack must not have gone out then, and must go
out once the fsync returns. An in-process shard (the real servicer, log and table) over a raw Insert stream, so
every ack is seen as it arrives."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator

import pytest

from apexrl.common import codec
from apexrl.common.grpc_util import make_channel
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.durability.wal import WriteAheadLog
from apexrl.replay_server.service import create_replay_server
from apexrl.replay_server.table import ReplayTable, TableConfig
from tests.conftest import cartpole_batch

# How long an ack that should not come is waited for: any ack sent early arrives within milliseconds.
_NO_ACK_SECONDS = 1.0


class HeldSync:
    """os.fsync that, once `hold()` was called, blocks until `release()`; `entered` is set when one is blocked."""

    def __init__(self) -> None:
        self._holding = False
        self.entered = threading.Event()
        self._released = threading.Event()

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        self._released.set()

    def __call__(self, fd: int) -> None:
        if self._holding:
            self.entered.set()
            assert self._released.wait(60), "the test never released the held fsync"
        os.fsync(fd)


def request(sequence: int) -> replay_pb2.InsertRequest:
    r = replay_pb2.InsertRequest(writer_id="w", sequence=sequence)
    codec.encode_batch(cartpole_batch(10, 10 * (sequence - 1)), r.batch)
    return r


@pytest.mark.timeout(120)
def test_an_insert_is_acknowledged_only_after_its_fsync_returns(tmp_path):
    table = ReplayTable(TableConfig(capacity=1000))
    sync = HeldSync()
    wal = WriteAheadLog(tmp_path / "wal", sync=sync)
    wal.open(table)
    made = create_replay_server(table, "127.0.0.1:0", wal=wal)
    server, port = made.server, made.port
    requests: queue.Queue = queue.Queue()
    acks: queue.Queue = queue.Queue()

    def stream() -> Iterator[replay_pb2.InsertRequest]:
        while (r := requests.get()) is not None:
            yield r

    channel = make_channel(f"127.0.0.1:{port}")
    call = replay_pb2_grpc.ReplayServiceStub(channel).Insert(stream(), timeout=90)
    reader = threading.Thread(target=lambda: [acks.put(a) for a in call], daemon=True)
    reader.start()
    try:
        # The first batch opens the segment (its header fsynced, unheld): after its ack, the next fsync is batch 2's.
        requests.put(request(1))
        first = acks.get(timeout=30)
        assert (first.sequence, first.first_key, first.rows, first.error_code) == (1, 0, 10, 0)
        (segment,) = (tmp_path / "wal").glob("wal-*.log")
        size_before = segment.stat().st_size

        sync.hold()
        requests.put(request(2))
        assert sync.entered.wait(30), "the log never fsynced the second batch"
        # Batch 2 is written to its segment and its fsync has not returned: no ack may have gone out.
        assert segment.stat().st_size > size_before
        assert wal.durable_key == 10, "the log reported the batch durable before its fsync returned"
        with pytest.raises(queue.Empty):
            early = acks.get(timeout=_NO_ACK_SECONDS)
            pytest.fail(f"batch 2 was acknowledged while its fsync was held: {early}")

        sync.release()
        second = acks.get(timeout=30)
        assert (second.sequence, second.first_key, second.rows, second.error_code) == (2, 10, 10, 0)
        assert wal.durable_key == 20
    finally:
        sync.release()
        requests.put(None)
        reader.join(30)
        channel.close()
        server.stop(0).wait(10)
        wal.close()

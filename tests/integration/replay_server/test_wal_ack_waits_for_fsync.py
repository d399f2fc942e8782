"""With the write-ahead log a shard acknowledges a batch only once its fsync has returned (docs/reliability.md §3).

The log's fsync is held back through its `sync` seam (the real os.fsync behind an Event), so the test sees the
moment the batch is written to its segment but not yet durable. No ack may have gone out then, and whether one
would is decided without timing luck: the test waits until either the batch's ack arrives (an early ack: the
test fails at once) or the ack is parked with the log (`when_durable` for the batch's keys, which answers only
once they are durable); and the log's answer to it must come after the held fsync returned. An in-process shard
(the real servicer, log and table) over a raw Insert stream, so every ack is seen as it arrives."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apexrl.common import codec
from apexrl.common.grpc_util import make_channel
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.wal import WriteAheadLog
from apexrl.replay_server.server.service import create_replay_server
from tests.conftest import cartpole_batch, wait_until


class HeldSync:
    """os.fsync that, once `hold()` was called, blocks until `release()`; `entered` is set when one is blocked,
    `returned` once that fsync has returned."""

    def __init__(self) -> None:
        self._holding = False
        self.entered = threading.Event()
        self.returned = threading.Event()
        self._released = threading.Event()

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        self._released.set()

    def __call__(self, fd: int) -> None:
        held = self._holding
        if held:
            self.entered.set()
            assert self._released.wait(60), "the test never released the held fsync"
        os.fsync(fd)
        if held:
            self.returned.set()


class WatchedLog(WriteAheadLog):
    """The real log, noting the keys acks wait for (`awaited`) and, for each answer it gives them, whether the held
    fsync had returned by then (`answered`: key -> bool)."""

    def __init__(self, directory: Path, sync: HeldSync) -> None:
        super().__init__(directory, sync=sync)
        self.held = sync
        self.awaited: list[int] = []
        self.answered: dict[int, bool] = {}

    def when_durable(self, key: int, callback: Callable[[BaseException | None], None]) -> None:
        def answer(error: BaseException | None) -> None:
            self.answered[key] = self.held.returned.is_set()
            callback(error)

        self.awaited.append(key)
        super().when_durable(key, answer)


def request(sequence: int) -> replay_pb2.InsertRequest:
    r = replay_pb2.InsertRequest(writer_id="w", sequence=sequence)
    codec.encode_batch(cartpole_batch(10, 10 * (sequence - 1)), r.batch)
    return r


@pytest.mark.timeout(120)
def test_an_insert_is_acknowledged_only_after_its_fsync_returns(tmp_path):
    table = ReplayTable(TableConfig(capacity=1000))
    sync = HeldSync()
    wal = WatchedLog(tmp_path / "wal", sync)
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
        # Batch 1 opens the segment, unheld; once it is durable, the next fsync can only be batch 2's.
        requests.put(request(1))
        first = acks.get(timeout=30)
        assert (first.sequence, first.first_key, first.rows, first.error_code) == (1, 0, 10, 0)
        wait_until(lambda: wal.durable_key == 10, "batch 1 is durable", timeout=30)
        (segment,) = (tmp_path / "wal").glob("wal-*.log")
        size_before = segment.stat().st_size

        sync.hold()
        requests.put(request(2))
        wait_until(
            lambda: not acks.empty() or (sync.entered.is_set() and any(k >= 20 for k in wal.awaited)),
            "batch 2's fsync is held and its ack waits for the log (or the ack arrived)",
            timeout=30,
        )
        if not acks.empty():
            pytest.fail(f"batch 2 was acknowledged while its fsync was held: {acks.get()}")
        # Batch 2 is written to its segment and its fsync has not returned; its ack is parked with the log.
        assert segment.stat().st_size > size_before
        assert wal.durable_key == 10, "the log reported the batch durable before its fsync returned"
        early = [key for key, after in wal.answered.items() if key > 10 and not after]
        assert not early, f"the log answered the acks waiting for keys {early} before their fsync returned"

        sync.release()
        second = acks.get(timeout=30)
        assert (second.sequence, second.first_key, second.rows, second.error_code) == (2, 10, 10, 0)
        assert wal.durable_key == 20
        assert wal.answered.get(20) is True, (
            f"the ack of batch 2 was not answered by the log after its fsync returned: {wal.answered}"
        )
    finally:
        sync.release()
        requests.put(None)
        reader.join(30)
        channel.close()
        server.stop(0).wait(10)
        wal.close()

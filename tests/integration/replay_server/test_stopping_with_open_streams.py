"""A shard that stops while actors and learners hold their streams open ends those streams itself, at once and
with UNAVAILABLE, instead of waiting out its grace period and letting gRPC cancel them (which logs an unhandled
CancelledError traceback for each, seen under `podman kube play` at SIGTERM)."""

from __future__ import annotations

import logging
import signal

import grpc
import numpy as np
import pytest

from apexrl.proto import replay_pb2_grpc
from apexrl.replay_server import wire
from tests.conftest import cartpole_batch


def _open_streams(address: str):
    """An Insert stream that stored one batch and a priority stream that applied one update, both left open."""
    channel = grpc.insecure_channel(address)
    stub = replay_pb2_grpc.ReplayServiceStub(channel)
    inserts, updates = _Requests(), _Requests()
    insert_call = stub.Insert(iter(inserts))
    request = wire.encode_insert(cartpole_batch(4), None, writer_id="w")
    request.sequence = 1
    inserts.send(request)
    assert next(insert_call).rows == 4
    update_call = stub.StreamUpdatePriorities(iter(updates))
    updates.send(wire.encode_update(np.arange(4), np.full(4, 2.0), 0))
    assert next(update_call).applied == 4
    return channel, [(insert_call, inserts), (update_call, updates)]


class _Requests:
    """A request iterator the test feeds; it never ends by itself (an idle actor's stream)."""

    def __init__(self) -> None:
        import queue

        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def send(self, request) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self):
        while (request := self._queue.get()) is not None:
            yield request


def test_stopping_ends_open_streams_with_unavailable_long_before_the_grace_runs_out(shard, caplog):
    channel, streams = _open_streams(shard.address)
    caplog.set_level(logging.DEBUG, logger="grpc")
    try:
        stopped = shard.server.stop(120)  # a grace no test waits for: the streams must end by themselves
        assert stopped.wait(30), "the shard waited for its open streams until the grace ran out"
        for call, _ in streams:
            with pytest.raises(grpc.RpcError) as ended:
                next(call)
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE, ended.value
            assert "shutting down" in ended.value.details()
    finally:
        for _, requests in streams:
            requests.close()
        channel.close()
    unhandled = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not unhandled, unhandled


def test_a_shard_process_stopped_by_sigterm_ends_open_streams_itself_and_logs_no_traceback(
    shard_processes, tmp_path
):
    (process,) = shard_processes(1)
    channel, streams = _open_streams(process.address)
    try:
        process.process.send_signal(signal.SIGTERM)
        for call, _ in streams:  # ended by the shard, not cancelled when its grace ran out
            with pytest.raises(grpc.RpcError) as ended:
                next(call)
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE, ended.value
            assert "replay shard is shutting down" in ended.value.details(), ended.value
        assert process.process.wait(60) == 0  # after that one SIGTERM (a second one would force the exit)
    finally:
        for _, requests in streams:
            requests.close()
        channel.close()
    log = (tmp_path / "shard0.log").read_text()
    assert "Traceback" not in log and "not handled" not in log, log

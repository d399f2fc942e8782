"""Refusals counted, not flooded (issue 31, item 4): 300 calls without a token against a real shard on loopback are
all refused, all counted in apexrl_refused_calls_total on its metrics endpoint, and audited in one line (the
window's later ones held back), while the shard keeps answering its own clients."""

from __future__ import annotations

import logging
import time
import urllib.request

import grpc
import numpy as np

from apexrl.common.metrics import serve_metrics
from apexrl.common.refusals import AUDIT_WINDOW_SECONDS, refused_counts
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import ReplayClient, ReplayTable, TableConfig
from apexrl.replay_server.server.service import create_replay_server

FLOOD = 300


def test_a_flood_of_refused_calls_is_counted_in_full_and_audited_in_one_line(caplog):
    caplog.set_level(logging.INFO, logger="apexrl.audit")
    table = ReplayTable(TableConfig(capacity=1_000))
    shard = create_replay_server(table, "127.0.0.1:0", token="the-token")
    url = serve_metrics(shard.registry, 0)
    before = refused_counts().get(("ReplayService/Sample", "UNAUTHENTICATED"), 0)
    try:
        with ReplayClient(f"127.0.0.1:{shard.port}", token="the-token", timeout=30) as honest:
            honest.insert({"x": np.zeros((8, 2), np.float32)})
            honest.flush()
            with grpc.insecure_channel(f"127.0.0.1:{shard.port}") as channel:
                stub = replay_pb2_grpc.ReplayServiceStub(channel)
                codes, started = set(), time.monotonic()
                for _ in range(FLOOD):
                    try:
                        stub.Sample(replay_pb2.SampleRequest(batch_size=4), timeout=10)
                    except grpc.RpcError as err:
                        codes.add(err.code())
            flooded = time.monotonic() - started
            assert codes == {grpc.StatusCode.UNAUTHENTICATED}
            assert len(honest.sample(4).keys) == 4  # the shard answers its own clients throughout
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        line = next(
            line
            for line in text.splitlines()
            if line.startswith("apexrl_refused_calls_total")
            and 'method="ReplayService/Sample"' in line
            and 'code="UNAUTHENTICATED"' in line
        )
        assert float(line.rsplit(" ", 1)[1]) - before == FLOOD, line
        audited = [
            r
            for r in caplog.records
            if r.name == "apexrl.audit" and "refused ReplayService/Sample" in r.getMessage()
        ]
        windows = 1 + int(
            flooded / AUDIT_WINDOW_SECONDS
        )  # one line a window per peer (a loaded machine: more)
        assert 1 <= len(audited) <= windows, [r.getMessage() for r in audited]
    finally:
        shard.server.stop(0).wait(10)

"""Many writers in one process (issue 31, item 6): 512 ReplayClient writers, each holding an open Insert stream to
one shard, and the same process still samples and reads Info. gRPC shares one connection between the channels a
process opens to an address unless told otherwise; the shard's per-connection call quota (256) then counted every
client of the process together and refused the sampler."""

from __future__ import annotations

import numpy as np

from apexrl.replay_server import ReplayClient, ReplayTable, TableConfig
from apexrl.replay_server.server.service import create_replay_server
from tests.conftest import wait_until

WRITERS = 512


def test_512_writers_with_open_insert_streams_and_a_sampler_share_one_process():
    table = ReplayTable(TableConfig(capacity=10_000))
    shard = create_replay_server(table, "127.0.0.1:0")
    address = f"127.0.0.1:{shard.port}"
    writers = [ReplayClient(address, timeout=60) for _ in range(WRITERS)]
    try:
        for i, writer in enumerate(writers):
            writer.insert({"x": np.full((2, 3), i, np.float32)})
        for writer in writers:
            writer.flush()
        open_calls = lambda: shard.registry.get_sample_value("apexrl_replay_open_calls")  # noqa: E731
        wait_until(lambda: open_calls() >= WRITERS, f"{WRITERS} Insert streams open", timeout=60)
        with ReplayClient(address, timeout=30) as sampler:
            batch = sampler.sample(32)
            info = sampler.info()
        assert len(batch.keys) == 32 and info.size == 2 * WRITERS
        assert (
            shard.registry.get_sample_value(
                "apexrl_replay_quota_refusals_total", {"limit": "calls_per_connection"}
            )
            or 0
        ) == 0
    finally:
        for writer in writers:
            writer.close()
        shard.server.stop(0).wait(30)

"""The servers' connection policy (common/connections.py) on a real shard: an idle connection is closed by the
server (the client reconnects by itself), and bad settings are refused naming the setting."""

from __future__ import annotations

import threading

import grpc
import pytest

from apexrl.common.connections import ConnectionPolicy
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server.core.table import TableConfig


def test_the_server_closes_a_connection_left_idle_and_the_client_reconnects(make_shard):
    shard = make_shard(
        TableConfig(capacity=100, seed=0), connections=ConnectionPolicy(max_connection_idle_seconds=1.0)
    )
    states: list[grpc.ChannelConnectivity] = []
    went_idle = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        states.append(state)
        if grpc.ChannelConnectivity.READY in states and state == grpc.ChannelConnectivity.IDLE:
            went_idle.set()

    with grpc.insecure_channel(shard.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        channel.subscribe(watch, try_to_connect=False)
        stub.Info(replay_pb2.InfoRequest(), timeout=30)
        assert went_idle.wait(60), f"the server never closed the idle connection: {states}"
        assert (
            stub.Info(replay_pb2.InfoRequest(), timeout=30).capacity == 100
        )  # a new connection, transparently
        channel.unsubscribe(watch)


def test_server_options_follow_the_policy():
    options = dict(
        ConnectionPolicy(
            keepalive_seconds=30, max_connection_idle_seconds=0, max_connection_age_seconds=600
        ).server_options()
    )
    assert options["grpc.keepalive_time_ms"] == 30_000 and options["grpc.max_connection_age_ms"] == 600_000
    assert "grpc.max_connection_idle_ms" not in options


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("keepalive_seconds", 0.5),
        ("keepalive_timeout_seconds", float("nan")),
        ("max_connection_idle_seconds", -1.0),
        ("max_connection_age_seconds", float("inf")),
    ],
)
def test_bad_connection_settings_are_refused_naming_the_setting(setting, value):
    with pytest.raises(ValueError, match=setting):
        ConnectionPolicy(**{setting: value})

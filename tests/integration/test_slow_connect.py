"""A client whose connection takes seconds to establish (a loaded machine, a busy server's accept loop, a slow
TLS handshake) still gets its answer: the SDK's channels give a connection attempt gRPC's own 20 s, not 100 ms.

The regression this guards: `grpc.min_reconnect_backoff_ms` is also gRPC's minimum connect timeout
(subchannel.cc ParseArgsForBackoffValues). It was set to 100 ms for quick reconnects, which made every connection
that took over ~0.1-1 s fail with UNAVAILABLE "connect() timed out" or "connection attempt timed out before
receiving SETTINGS frame": two tests failed so beside two CPU-bound processes (issue 27).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.replay_server.client.replay_client import ReplayClient

HANDSHAKE_DELAY_S = 2.5  # past the old connect timeout (at most the 1 s reconnect backoff), well inside 20 s


class SlowToConnectProxy:
    """A TCP proxy on 127.0.0.1 that holds each new connection for `delay` seconds before joining it to `target`:
    the client's connection is open but the server's HTTP/2 SETTINGS arrive only after the delay, as when the
    server's machine is too busy to answer."""

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True, name="slow-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            self._sockets.append(client)
            threading.Thread(target=self._join_later, args=(client,), daemon=True).start()

    def _join_later(self, client: socket.socket) -> None:
        time.sleep(self._delay)  # the fault this proxy injects, not a wait for a condition
        try:
            server = socket.create_connection(self._target)
        except OSError:
            client.close()
            return
        self._sockets.append(server)
        threading.Thread(target=_pipe, args=(client, server), daemon=True).start()
        threading.Thread(target=_pipe, args=(server, client), daemon=True).start()

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def slow_proxy():
    proxies: list[SlowToConnectProxy] = []

    def make(target: str) -> SlowToConnectProxy:
        proxies.append(SlowToConnectProxy(target, HANDSHAKE_DELAY_S))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def test_a_replay_client_whose_connection_takes_seconds_still_gets_its_answer(shard, slow_proxy):
    proxy = slow_proxy(shard.address)
    with ReplayClient(proxy.address, timeout=60) as client:
        started = time.monotonic()
        info = client.info()
        waited = time.monotonic() - started
    assert info.size == 0
    assert waited >= HANDSHAKE_DELAY_S  # the answer did come through the slow connection
    assert proxy.accepted == 1, (
        f"{proxy.accepted} connection attempts: the first one was given up and redialled"
    )


def test_a_parameter_client_whose_connection_takes_seconds_still_gets_its_answer(slow_proxy):
    made = create_parameter_server("127.0.0.1:0")
    try:
        proxy = slow_proxy(f"127.0.0.1:{made.port}")
        with ParameterClient(proxy.address, timeout=60) as client:
            assert client.version() == 0
        assert proxy.accepted == 1
    finally:
        made.server.stop(0)

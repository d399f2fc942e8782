"""The parameter service holds up (issue 16, item 4), over real servers on 127.0.0.1: Publish streams held open do
not stop GetVersion and Fetch, a publisher cannot make the service buffer more than max_weights_bytes or keep a
slot with a stream that sends nothing, a client never allocates what a header declares beyond its own limit, and
no version can jump beyond the window above the current one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc
import urllib.request
from concurrent import futures

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from apexrl.common.errors import ResourceExhaustedError
from apexrl.common.free_ports import pick_free_port
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.limits import PublishLimits
from apexrl.parameter_server.service import create_parameter_server
from apexrl.parameter_server.weights import MAX_VERSION, MAX_VERSION_STEP, VersionRefusedError
from apexrl.proto import parameters_pb2, parameters_pb2_grpc, tensor_pb2
from tests.conftest import wait_until

MiB = 1024 * 1024
TiB = 1 << 40
F32, U8 = tensor_pb2.FLOAT32, tensor_pb2.UINT8
WEIGHTS = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, np.float32)}


def header(total: int, version: int = 0, dtype: int = F32) -> parameters_pb2.WeightsHeader:
    """A consistent header for one tensor of `total` bytes (uint8 [2**20, total / 2**20] beyond 2**31 bytes)."""
    shape = [total // 4] if dtype == F32 else [MiB, total // MiB] if total > 2**31 else [total]
    h = parameters_pb2.WeightsHeader(version=version, total_bytes=total)
    h.tensors.add(name="w", dtype=dtype, shape=shape, offset=0, nbytes=total)
    return h


class Service:
    """An in-process parameter service (the same AioServerThread a process runs) with its registry."""

    def __init__(self, **kwargs) -> None:
        self.registry = CollectorRegistry()
        made = create_parameter_server("127.0.0.1:0", registry=self.registry, **kwargs)
        self.server, port, self.store = made.server, made.port, made.store
        self.address = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = parameters_pb2_grpc.ParameterServiceStub(self.channel)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0).wait(10)


@pytest.fixture
def service():
    started: list[Service] = []

    def start(**kwargs) -> Service:
        started.append(Service(**kwargs))
        return started[-1]

    yield start
    for s in started:
        s.close()


def held_open(stub, release: threading.Event, first: parameters_pb2.PublishRequest | None):
    """A Publish call that sends `first` (nothing when None) and then holds the stream open until `release`."""

    def requests():
        if first is not None:
            yield first
        release.wait(60)

    return stub.Publish.future(requests(), timeout=60)


def test_get_version_and_fetch_answer_while_16_idle_publish_streams_are_open(service):
    """Issue 16: with the thread-pool server, 16 idle Publish streams from one client took all 16 workers and every
    GetVersion timed out. Now they cost no thread, and beyond max_concurrent_publishes (4) they are refused."""
    s = service()
    s.store.publish(WEIGHTS)
    release = threading.Event()
    calls = []
    try:
        first = parameters_pb2.PublishRequest(header=header(16), chunk=b"\0" * 8)
        calls = [held_open(s.stub, release, first) for _ in range(16)]
        wait_until(
            lambda: sum(c.done() for c in calls) + s.metric("apexrl_params_received_bytes_total") / 8 == 16,
            "every stream was refused or delivered its first message",
            timeout=30,
        )
        with ParameterClient(s.address, timeout=10) as client:
            assert client.version() == 1
            version, weights = client.fetch(0)
        assert version == 1 and weights["w"].tolist() == WEIGHTS["w"].tolist()

        refused = [c for c in calls if c.done()]
        assert len(refused) == 12 and s.metric("apexrl_params_publishes_in_progress") == 4
        for call in refused:
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (
                "Publish calls are in progress, the most this service serves at once "
                "(max_concurrent_publishes 4)" in call.details()
            )
        assert s.metric("apexrl_params_publish_refusals_total", {"reason": "limit"}) == 12
    finally:
        release.set()
    for call in calls:  # the 4 held streams end (half-closed) 8 bytes short: refused, nothing stored
        assert call.exception(30) is not None
    wait_until(lambda: s.metric("apexrl_params_publishes_in_progress") == 0, "the held streams ended")
    with ParameterClient(s.address, timeout=10) as client:
        assert client.publish(WEIGHTS) == 2


def test_an_idle_publish_stream_is_aborted_and_gives_its_slot_back(service):
    s = service(limits=PublishLimits(max_concurrent_publishes=1, publish_idle_timeout=1.0))
    release = threading.Event()
    try:
        for first, index in (
            (parameters_pb2.PublishRequest(header=header(16), chunk=b"\0" * 8), 1),
            (None, 0),
        ):
            call = held_open(s.stub, release, first)
            assert isinstance(
                call.exception(30), grpc.RpcError
            )  # the server ended it; the client's deadline is 60 s
            assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert call.details() == (
                f"Publish message {index} did not arrive within 1 s of the previous one "
                f"(publish_idle_timeout): the stream was aborted, nothing stored"
            )
            wait_until(lambda: s.metric("apexrl_params_publishes_in_progress") == 0, "the slot is free again")
            with ParameterClient(s.address, timeout=10) as client:
                client.publish(WEIGHTS)  # the one slot serves the next publisher
    finally:
        release.set()
    assert s.metric("apexrl_params_publish_refusals_total", {"reason": "idle"}) == 2
    assert s.store.version == 2


def test_a_trickling_publish_is_aborted_at_its_total_deadline_and_gives_its_slot_back(service):
    """Issue 31: a Publish sending a byte now and then, each within the idle timeout, held its slot forever. Now a
    whole Publish has publish_max_seconds."""
    s = service(
        limits=PublishLimits(max_concurrent_publishes=1, publish_idle_timeout=5.0, publish_max_seconds=1.0)
    )
    stop = threading.Event()

    def trickle():
        yield parameters_pb2.PublishRequest(header=header(1 << 20), chunk=b"\0")
        while not stop.wait(0.1):  # far within the idle timeout, forever
            yield parameters_pb2.PublishRequest(chunk=b"\0")

    try:
        call = s.stub.Publish.future(trickle(), timeout=60)
        assert isinstance(
            call.exception(30), grpc.RpcError
        )  # the server ended it, long before the client's 60 s
        assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "Publish did not complete within 1 s (publish_max_seconds;" in call.details()
    finally:
        stop.set()
    wait_until(lambda: s.metric("apexrl_params_publishes_in_progress") == 0, "the slot is free again")
    with ParameterClient(s.address, timeout=10) as client:
        assert (
            client.publish(WEIGHTS) == 1
        )  # the one slot serves the next publisher; nothing was stored before
    assert s.metric("apexrl_params_publish_refusals_total", {"reason": "idle"}) == 1


def test_far_ahead_versions_are_refused_and_the_service_keeps_serving_the_old_weights(service):
    """Issue 16: a Publish of version 2**64 - 1 was stored, every actor fetched it, and no version was left for the
    learner's next publish. Now a version must be greater than the current one and at most 2**20 above it."""
    s = service()
    with ParameterClient(s.address, timeout=10) as client:
        assert client.publish(WEIGHTS, version=5) == 5
        window = f"the current version is 5, so the next must be in [6, {5 + MAX_VERSION_STEP}]"
        for far, why in (
            (2**64 - 1, f"above the largest version {MAX_VERSION}"),
            (2**63, f"above the largest version {MAX_VERSION}"),
            (5 + MAX_VERSION_STEP + 1, f"more than {MAX_VERSION_STEP} above the current version 5"),
        ):
            request = parameters_pb2.PublishRequest(header=header(16, version=far), chunk=b"\1" * 16)
            with pytest.raises(grpc.RpcError) as info:
                s.stub.Publish(iter([request]), timeout=10)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert info.value.details() == f"version {far} is {why}: {window}"
        with pytest.raises(VersionRefusedError, match=f"version {2**64 - 1} is above the largest version"):
            client.publish({"w": np.zeros(4, np.float32)}, version=2**64 - 1)
        with pytest.raises(
            VersionRefusedError, match=f"FAILED_PRECONDITION: version {5 + MAX_VERSION_STEP + 1} is more than"
        ):
            client.publish({"w": np.zeros(4, np.float32)}, version=5 + MAX_VERSION_STEP + 1)
        assert client.version() == 5 and s.store.published_total == 1
        version, weights = client.fetch(0)
        assert version == 5 and list(weights) == ["w", "b"] and weights["w"].tolist() == WEIGHTS["w"].tolist()
        assert client.publish(WEIGHTS) == 6  # the learner's next publish goes through
        assert (
            client.publish(WEIGHTS, version=6 + MAX_VERSION_STEP) == 6 + MAX_VERSION_STEP
        )  # the window's edge
    assert s.metric("apexrl_params_publish_refusals_total", {"reason": "version"}) == 4


# --- max_weights_bytes, server side: the boundary, then a real `apexrl params` process and its memory --------------


def test_a_publish_of_exactly_max_weights_bytes_is_stored_and_one_byte_more_is_refused(service):
    """The limit is inclusive: weights of max_weights_bytes are served; one byte more is refused before anything
    is buffered, and the version before it stays the one served."""
    limit = 64
    s = service(limits=PublishLimits(max_weights_bytes=limit))
    at_limit = bytes(range(limit))
    published = s.stub.Publish(
        iter([parameters_pb2.PublishRequest(header=header(limit, dtype=U8), chunk=at_limit)]), timeout=10
    )
    assert published.version == 1, "a Publish of exactly max_weights_bytes was not stored"
    with ParameterClient(s.address, timeout=10, max_weights_bytes=limit) as client:
        version, weights = client.fetch(0)
    assert version == 1 and weights["w"].tobytes() == at_limit

    over = parameters_pb2.PublishRequest(header=header(limit + 1, dtype=U8), chunk=b"\2" * (limit + 1))
    with pytest.raises(grpc.RpcError) as refused:
        s.stub.Publish(iter([over]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    assert refused.value.details() == (
        f"Publish declares total_bytes {limit + 1}, more than this service accepts "
        f"(max_weights_bytes {limit}); nothing was buffered"
    )
    assert s.store.version == 1 and s.store.published_total == 1, "the refused Publish was stored"
    assert s.metric("apexrl_params_publish_refusals_total", {"reason": "limit"}) == 1
    assert s.metric("apexrl_params_received_bytes_total") == limit  # the refused chunk was never read
    with ParameterClient(s.address, timeout=10) as client:
        assert client.fetch(0)[1]["w"].tobytes() == at_limit


def free_port() -> int:
    """Below the ephemeral range: no connecting socket takes it before the process that will bind it starts."""
    return pick_free_port("127.0.0.1")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def scrape(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's RSS from /proc")
@pytest.mark.timeout(120)
def test_a_publish_declaring_1_tib_is_refused_before_the_server_buffers_anything(tmp_path):
    """Issue 16: the service buffered whatever a Publish sent, whatever it declared (+260 MB RSS). Now a header
    declaring more than max_weights_bytes (1 GiB by default) is refused as it arrives; the 64 MiB sent behind it
    are not kept."""
    port_file, metrics_port = tmp_path / "params.port", free_port()
    with open(tmp_path / "params.log", "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "params",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--metrics-port",
                str(metrics_port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    release = threading.Event()
    try:
        wait_until(
            lambda: port_file.exists() and port_file.read_text().strip(),
            "the service wrote its port",
            timeout=60,
        )
        address = f"127.0.0.1:{int(port_file.read_text())}"
        with ParameterClient(address, timeout=10) as client:
            client.publish(WEIGHTS)
            client.fetch(0)
        before = rss_bytes(process.pid)

        def requests():
            yield parameters_pb2.PublishRequest(header=header(TiB, dtype=U8))
            for _ in range(64):
                yield parameters_pb2.PublishRequest(chunk=b"\1" * MiB)
            release.wait(60)

        with grpc.insecure_channel(address) as channel:
            call = parameters_pb2_grpc.ParameterServiceStub(channel).Publish.future(requests(), timeout=60)
            wait_until(
                lambda: call.done() or scrape(metrics_port, "apexrl_params_received_bytes_total") >= 64 * MiB,
                "the call ended or the server received the 64 MiB",
                timeout=60,
            )
            grown = rss_bytes(process.pid) - before
            assert grown < 16 * MiB, f"the server's RSS grew by {grown / MiB:.0f} MiB"
            assert call.done()
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert call.details() == (
                f"Publish declares total_bytes {TiB}, more than this service accepts "
                f"(max_weights_bytes {1 << 30}); nothing was buffered"
            )
        with ParameterClient(address, timeout=10) as client:
            assert client.fetch(0)[0] == 1  # the service serves its weights as before
        assert scrape(metrics_port, "apexrl_params_received_bytes_total") < 16 * MiB
    finally:
        release.set()
        process.terminate()
        process.wait(30)


# --- max_weights_bytes, client side ------------------------------------------------------------------------------


class DeclaringServicer(parameters_pb2_grpc.ParameterServiceServicer):
    """Answers every Fetch with a header declaring `total` bytes; sends them (zeros) only when `send`, otherwise
    holds the stream open until `release`."""

    def __init__(self, total: int, send: bool, release: threading.Event) -> None:
        self.total, self.send, self.release = total, send, release

    def Fetch(self, request, context):  # noqa: N802 (gRPC name)
        yield parameters_pb2.FetchResponse(header=header(self.total, version=3, dtype=U8))
        if self.send:
            for _ in range(self.total // MiB):
                yield parameters_pb2.FetchResponse(chunk=b"\0" * MiB)
        else:
            self.release.wait(30)


@pytest.fixture
def declaring_server():
    release = threading.Event()
    servers = []

    def start(total: int, send: bool = False) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        parameters_pb2_grpc.add_ParameterServiceServicer_to_server(
            DeclaringServicer(total, send, release), server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    release.set()
    for server in servers:
        server.stop(0)


def test_the_client_refuses_a_header_declaring_more_than_its_max_weights_bytes_without_allocating(
    declaring_server,
):
    """Issue 16: the client allocated bytearray(total) from the server's header before any data arrived."""
    tracemalloc.start()
    try:
        refused = (
            rf"header declares {TiB} bytes of weights, more than this client accepts \(max_weights_bytes "
            rf"{1 << 30}\)"
        )
        with (
            ParameterClient(declaring_server(TiB), timeout=10) as client,
            pytest.raises(ResourceExhaustedError, match=refused),
        ):
            client.fetch(0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MiB, f"the client allocated {peak / MiB:.0f} MiB"
    with (
        ParameterClient(declaring_server(2 * MiB), timeout=10, max_weights_bytes=MiB) as client,
        pytest.raises(
            ResourceExhaustedError, match=r"declares 2097152 bytes .*\(max_weights_bytes 1048576\)"
        ),
    ):
        client.fetch(0)
    with ParameterClient(declaring_server(MiB, send=True), timeout=10, max_weights_bytes=MiB) as client:
        version, weights = client.fetch(0)  # at the limit: taken
    assert version == 3 and weights["w"].shape == (MiB,)

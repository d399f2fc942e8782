"""The parameter service (parameter_server/service.py and client.py) over a real gRPC server on 127.0.0.1."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry

from apexrl.common.errors import (
    InvalidArgumentError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from apexrl.common.free_ports import pick_free_port
from apexrl.common.metrics import serve_metrics
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import SERVICE_NAME, create_parameter_server
from apexrl.parameter_server.weights import VersionRefusedError
from apexrl.proto import parameters_pb2, parameters_pb2_grpc, tensor_pb2
from tests.conftest import wait_until

MiB = 1024 * 1024


class Server:
    def __init__(self, **kwargs) -> None:
        self.registry = CollectorRegistry()
        made = create_parameter_server("127.0.0.1:0", registry=self.registry, **kwargs)
        self.server, self.port, self.store = made.server, made.port, made.store
        self.health = self.server
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    with ParameterClient(server.address, timeout=5.0) as c:
        yield c


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.address)  # gRPC's own defaults: 4 MiB receive limit
    yield parameters_pb2_grpc.ParameterServiceStub(channel)
    channel.close()


def small_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }


def assert_same_weights(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        expected = np.asarray(array)
        assert got[name].dtype == expected.dtype.newbyteorder("<"), name
        assert got[name].shape == expected.shape, name
        np.testing.assert_array_equal(got[name], expected, err_msg=name)


# --- round trips ---------------------------------------------------------------------------------------------------


def test_round_trip_of_every_dtype_and_shape(client):
    rng = np.random.default_rng(1)
    weights = {
        "conv.weight": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "fc.bias": rng.standard_normal(5),  # float64
        "half": rng.standard_normal((2, 2)).astype(np.float16),
        "mask": rng.random((3, 5)) > 0.5,  # bool array
        "flag": np.bool_(True),  # bool scalar
        "scale": np.float32(0.25),  # float32 scalar
        "step": np.array(7, dtype=np.int64),  # 0-d
        "empty": np.zeros((0, 3), dtype=np.float32),
        "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C-contiguous
        "big_endian": np.arange(4, dtype=">u2"),
        **{dt: np.arange(-3, 3).astype(dt) for dt in ("int8", "int16", "uint8", "uint32", "uint64")},
    }
    assert client.publish(weights) == 1
    version, got = client.fetch()
    assert version == 1
    assert_same_weights(got, weights)
    for array in got.values():
        assert array.flags.writeable and array.flags.aligned
    got["conv.weight"][0, 0, 0, 0] = 42.0  # writable, and a private copy: the server's version is unchanged
    assert client.fetch()[1]["conv.weight"][0, 0, 0, 0] == weights["conv.weight"][0, 0, 0, 0]


def test_model_larger_than_4_mib_travels_in_chunks_under_default_limits(server, client, stub):
    weights = {
        "big": np.random.default_rng(2).standard_normal(6 * MiB // 4).astype(np.float32),
        "bias": np.ones(3, np.float32),
    }
    assert client.publish(weights) == 1  # client -> server: chunks <= 1 MiB under the server's 4 MiB limit
    version, got = client.fetch(0)
    assert version == 1
    assert_same_weights(got, weights)

    # The same fetch on a bare channel with gRPC's defaults: every message is at most one chunk.
    replies = list(stub.Fetch(parameters_pb2.FetchRequest(have_version=0), timeout=5))
    assert len(replies) >= 6
    assert all(r.ByteSize() <= MiB + 64 for r in replies)
    assert [r.HasField("header") for r in replies] == [True] + [False] * (len(replies) - 1)
    assert sum(len(r.chunk) for r in replies) == replies[0].header.total_bytes == 6 * MiB + 12


def test_one_message_over_the_client_limit_would_be_refused():
    """Control for the chunking test: the 4 MiB default limit is real. A server told to send 8 MiB chunks
    makes a default client refuse the message."""
    s = Server(chunk_bytes=8 * MiB, max_message_bytes=16 * MiB)
    try:
        s.store.publish({"big": np.zeros(6 * MiB // 4, np.float32)})
        with ParameterClient(s.address, timeout=5.0) as c, pytest.raises(ResourceExhaustedError):
            c.fetch()
    finally:
        s.stop()


def test_weights_published_in_process_are_served(server, client):
    """A learner hosting the service publishes into its store directly; actors fetch over gRPC."""
    weights = small_weights()
    assert server.store.publish(weights) == 1
    assert client.version() == 1
    assert_same_weights(client.fetch()[1], weights)


# --- versions ------------------------------------------------------------------------------------------------------


def test_fetch_returns_none_at_once_when_nothing_is_newer(server, client, stub):
    assert client.version() == 0
    assert client.fetch(0) is None  # nothing published yet
    client.publish(small_weights())
    start = time.monotonic()
    assert client.fetch(have_version=1) is None
    # Generous bound, but meaningful: a Fetch that waited for something newer would run into the 5 s deadline.
    assert time.monotonic() - start < 2.5
    replies = list(stub.Fetch(parameters_pb2.FetchRequest(have_version=1), timeout=5))
    assert (
        len(replies) == 1
        and replies[0].not_newer
        and not replies[0].HasField("header")
        and not replies[0].chunk
    )
    assert client.fetch(0)[0] == 1


def test_a_caller_ahead_of_a_restarted_service_gets_its_newest_weights(server, client):
    """After a restart the service counts from its learner's checkpoint; an actor holding a higher version
    (published after that checkpoint) must not keep acting on stale weights until the numbers catch up."""
    client.publish(small_weights(), version=3)
    fetched = client.fetch(have_version=9)
    assert fetched is not None and fetched[0] == 3
    assert client.fetch(have_version=3) is None


def test_versions_strictly_increase(server, client):
    first = small_weights(0)
    assert client.publish(first) == 1
    assert client.publish(small_weights(1)) == 2
    assert client.publish(small_weights(2), version=10) == 10
    assert client.publish(small_weights(3)) == 11
    kept = small_weights(3)
    for stale in (11, 5):
        with pytest.raises(
            VersionRefusedError, match=rf"version {stale} is not greater than the current version 11"
        ):
            client.publish(small_weights(9), version=stale)
    for bad in (0, -1, True):
        with pytest.raises(InvalidArgumentError):
            client.publish(small_weights(9), version=bad)
    assert client.version() == 11
    assert_same_weights(client.fetch(0)[1], kept)


def test_client_rejects_empty_or_unsupported_weights(client):
    with pytest.raises(InvalidArgumentError, match="no tensors"):
        client.publish({})
    with pytest.raises(InvalidArgumentError, match="'names'.*unsupported dtype"):
        client.publish({"names": np.array(["a", "b"])})
    with pytest.raises(InvalidArgumentError, match="'c'.*unsupported dtype"):
        client.publish({"c": np.ones(2, np.complex64)})
    assert client.version() == 0


# --- bad Publish streams -------------------------------------------------------------------------------------------


def header(tensors, total, version=0):
    h = parameters_pb2.WeightsHeader(version=version, total_bytes=total)
    for name, dtype, shape, offset, nbytes in tensors:
        h.tensors.add(name=name, dtype=dtype, shape=shape, offset=offset, nbytes=nbytes)
    return h


F32 = tensor_pb2.FLOAT32
BAD_STREAMS = {
    "bytes missing": (
        [parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 16)], 16), chunk=b"\0" * 8)],
        r"ended after 8 of the header's total_bytes 16; missing 8 bytes",
    ),
    "bytes beyond total": (
        [
            parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 16)], 16), chunk=b"\0" * 16),
            parameters_pb2.PublishRequest(chunk=b"\0"),
        ],
        r"message 1 brings the bytes received to 17, more than the header's total_bytes 16",
    ),
    "overlap": (
        [
            parameters_pb2.PublishRequest(
                header=header([("a", F32, [4], 0, 16), ("b", F32, [4], 8, 16)], 32), chunk=b"\0" * 32
            )
        ],
        r"'a' float32\[4\] at bytes \[0, 16\) and 'b' float32\[4\] at bytes \[8, 24\) overlap",
    ),
    "offset beyond total": (
        [parameters_pb2.PublishRequest(header=header([("w", F32, [4], 100, 16)], 16), chunk=b"\0" * 16)],
        r"'w' float32\[4\] at bytes \[100, 116\): outside the 16 total bytes",
    ),
    "unknown dtype": (
        [parameters_pb2.PublishRequest(header=header([("w", 99, [4], 0, 16)], 16), chunk=b"\0" * 16)],
        r"tensor 'w': unknown or unspecified dtype 99",
    ),
    "unspecified dtype": (
        [parameters_pb2.PublishRequest(header=header([("w", 0, [4], 0, 16)], 16), chunk=b"\0" * 16)],
        r"unknown or unspecified dtype 0",
    ),
    "nbytes not matching shape": (
        [parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 12)], 12), chunk=b"\0" * 12)],
        r"tensor 'w': nbytes 12, but shape \[4\] of float32 needs 16",
    ),
    "negative dimension": (
        [parameters_pb2.PublishRequest(header=header([("w", F32, [-4], 0, 0)], 0))],
        r"dimension -4 out of range",
    ),
    "gap (total larger than the tensors)": (
        [parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 16)], 20), chunk=b"\0" * 20)],
        r"total_bytes is 20, but the tensors' nbytes sum to 16",
    ),
    "duplicate names": (
        [
            parameters_pb2.PublishRequest(
                header=header([("w", F32, [1], 0, 4), ("w", F32, [1], 4, 4)], 8), chunk=b"\0" * 8
            )
        ],
        r"duplicate tensor name 'w'",
    ),
    "bool byte other than 0 or 1": (
        [
            parameters_pb2.PublishRequest(
                header=header([("m", tensor_pb2.BOOL, [3], 0, 3)], 3), chunk=b"\1\0\2"
            )
        ],
        r"tensor 'm': bool bytes must be 0 or 1, found 2",
    ),
    "no tensors": ([parameters_pb2.PublishRequest(header=header([], 0))], r"weights have no tensors"),
    "no header": (
        [parameters_pb2.PublishRequest(chunk=b"\0" * 16)],
        r"first Publish message must carry the header",
    ),
    "empty stream": ([], r"first Publish message must carry the header"),
    "second header": (
        [
            parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 16)], 16), chunk=b"\0" * 8),
            parameters_pb2.PublishRequest(header=header([("w", F32, [4], 0, 16)], 16), chunk=b"\0" * 8),
        ],
        r"Publish message 1 carries a header; only the first may",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_bad_publish_stream_is_invalid_argument_and_keeps_the_previous_version(server, client, stub, case):
    kept = small_weights()
    client.publish(kept)
    requests, message = BAD_STREAMS[case]
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(iter(requests), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, info.value.details()), info.value.details()
    assert client.version() == 1
    assert_same_weights(client.fetch(0)[1], kept)


def test_a_stale_explicit_version_is_failed_precondition_and_keeps_the_previous_version(server, client, stub):
    kept = small_weights()
    client.publish(kept)
    request = parameters_pb2.PublishRequest(
        header=header([("w", F32, [4], 0, 16)], 16, version=1), chunk=b"\0" * 16
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(iter([request]), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == "version 1 is not greater than the current version 1"
    assert client.version() == 1
    assert_same_weights(client.fetch(0)[1], kept)


def _cancel_open_publish(server, stub, chunk: bytes, total: int) -> None:
    """Send one Publish message, keep the stream open (no half-close), cancel it, and wait for the server to end it."""
    calls = lambda: server.registry.get_sample_value(  # noqa: E731 (Publish calls the server has finished)
        "apexrl_params_request_duration_seconds_count", {"method": "Publish"}
    )
    received = lambda: server.registry.get_sample_value("apexrl_params_received_bytes_total")  # noqa: E731
    calls_before, received_before = calls(), received()
    release = threading.Event()

    def requests():
        yield parameters_pb2.PublishRequest(
            header=header([("w", F32, [total // 4], 0, total)], total), chunk=chunk
        )
        release.wait(10)

    future = stub.Publish.future(requests(), timeout=10)
    try:
        wait_until(lambda: received() == received_before + len(chunk), "the server holds the sent bytes")
        assert future.cancel()
        # The server observed the end of the call: its Publish handler finished (it is timed however it ends).
        wait_until(lambda: calls() == calls_before + 1, "the server ended the cancelled Publish")
    finally:
        release.set()
    with pytest.raises(grpc.FutureCancelledError):
        future.result()


def test_a_publish_cancelled_before_its_last_byte_stores_nothing(server, client, stub):
    kept = small_weights()
    client.publish(kept)
    _cancel_open_publish(server, stub, chunk=b"\1" * 8, total=16)
    assert client.version() == 1 and server.store.published_total == 1
    assert_same_weights(client.fetch(0)[1], kept)


def test_a_publish_cancelled_after_its_last_byte_stores_all_of_it_or_nothing(server, client, stub):
    """gRPC's Python server cannot always tell a cancellation from a half-close arriving at the same moment (the
    proto says so): such a version is stored whole or not at all, never in part, and the service stays usable."""
    client.publish(small_weights())
    _cancel_open_publish(server, stub, chunk=b"\1" * 16, total=16)
    version, weights = client.fetch(0)
    assert version == server.store.published_total and version in (1, 2)
    if version == 2:
        assert list(weights) == ["w"] and weights["w"].tobytes() == b"\1" * 16
    assert client.publish(small_weights()) == version + 1


# --- failures, health, metrics, auth -------------------------------------------------------------------------------


def free_port() -> int:
    """Below the ephemeral range: no connecting socket takes it before the process that will bind it starts."""
    return pick_free_port("127.0.0.1")


def test_dead_address_raises_unavailable_within_the_deadline():
    with ParameterClient(f"127.0.0.1:{free_port()}", timeout=2.0) as c:
        start = time.monotonic()
        with pytest.raises(UnavailableError, match="Fetch"):
            c.fetch(3)
        with pytest.raises(UnavailableError):
            c.version()
        with pytest.raises(UnavailableError):
            c.publish(small_weights())
        assert time.monotonic() - start < 3 * 2.0 + 1.0


def test_health_serving_and_reflection_lists_the_service(server):
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
        )
        names = {s.name for s in replies[0].list_services_response.service}
        assert SERVICE_NAME == "apexrl.v1.ParameterService"
        assert SERVICE_NAME in names


def test_metrics_endpoint_serves_params_metrics(server, client):
    client.publish(small_weights())
    client.fetch(0)
    client.fetch(1)
    url = serve_metrics(server.registry, 0, "127.0.0.1")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("apexrl_params_")
        }

    # A streamed call's duration is recorded when its handler ends, which may be just after the client has read
    # the last message: wait for the second Fetch to be counted.
    fetches = 'apexrl_params_request_duration_seconds_count{method="Fetch"}'
    wait_until(lambda: scrape().get(fetches) == 2, "both Fetch calls are counted", timeout=60)
    values = scrape()
    assert values["apexrl_params_published_versions_total"] == 1
    assert values["apexrl_params_current_version"] == 1
    assert values["apexrl_params_current_weights_bytes"] == 60
    assert values["apexrl_params_served_bytes_total"] == 60
    assert values["apexrl_params_received_bytes_total"] == 60
    assert values['apexrl_params_fetches_total{result="newer"}'] == 1
    assert values['apexrl_params_fetches_total{result="not_newer"}'] == 1
    assert values['apexrl_params_request_duration_seconds_count{method="Fetch"}'] == 2
    assert values['apexrl_params_request_duration_seconds_count{method="Publish"}'] == 1


def test_token_is_required_when_set():
    s = Server(token="s3cret")
    try:
        with ParameterClient(s.address, timeout=5.0) as anonymous, pytest.raises(UnauthenticatedError):
            anonymous.fetch()
        with ParameterClient(s.address, timeout=5.0, token="s3cret") as c:
            assert c.publish(small_weights()) == 1
            assert c.fetch()[0] == 1
    finally:
        s.stop()

"""ParameterClient: the SDK's client of the parameter service (numpy in, numpy out; no torch).

Actors poll `fetch(have_version)` every K steps: it moves no weights when nothing is newer, and raises
UnavailableError when the service cannot be reached, so an actor can keep acting with the weights it has.
The learner (or any trainer) calls `publish(weights)`. Weights of any size travel in chunks of at most 1 MiB, so
gRPC's default 4 MiB message limit is enough on both sides; the client takes weights of at most
`max_weights_bytes`, and refuses a larger Fetch from its header, before allocating anything.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import grpc
import numpy as np

from apexrl.common.errors import (
    ApexError,
    ErrorCode,
    InvalidArgumentError,
    ResourceExhaustedError,
    from_rpc_error,
)
from apexrl.common.grpc_util import make_channel
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.limits import DEFAULT_MAX_WEIGHTS_BYTES, check_max_weights_bytes
from apexrl.parameter_server.weights import (
    VersionRefusedError,
    check_version_in_window,
    check_version_number,
    pack,
    unpack,
)
from apexrl.parameter_server.wire import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    header_to_proto,
    iter_chunks,
    layout_from_proto,
)
from apexrl.proto import parameters_pb2, parameters_pb2_grpc


class ParameterClient:
    """Client of one parameter service. Thread-safe (one gRPC channel); every call has a deadline of `timeout`
    seconds and raises an apexrl error (UnavailableError, InvalidArgumentError, DeadlineExceededError, ...) on
    failure, never grpc.RpcError. `tls`: the service serves TLS (its CA; with mutual TLS also this client's
    certificate and key). `max_weights_bytes`: the largest weights `fetch` accepts."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        token: str | None = None,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_weights_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout ({timeout}) must be a positive number of seconds")
        self.address = address
        self.timeout = timeout
        self.max_weights_bytes = check_max_weights_bytes(max_weights_bytes)
        self._channel = make_channel(
            address, max_message_bytes=max_message_bytes, token=token, tls=tls, what="ParameterClient address"
        )
        self._stub = parameters_pb2_grpc.ParameterServiceStub(self._channel)

    def fetch(self, have_version: int = 0) -> tuple[int, dict[str, np.ndarray]] | None:
        """The newest (version, weights) when it is not `have_version`, else None (nothing moved). A version below
        `have_version` means the service restarted and counts again from its learner's checkpoint: take it.

        The arrays are writable and share one freshly received buffer (a tensor whose byte offset is not a
        multiple of its itemsize is copied to be aligned); they are ordered as published. ResourceExhaustedError
        when the weights are larger than `max_weights_bytes` (nothing is allocated for them).
        """
        if have_version < 0:
            raise InvalidArgumentError(f"have_version must be >= 0, got {have_version}")
        what = f"Fetch(have_version={have_version}) from {self.address}"
        responses = self._stub.Fetch(
            parameters_pb2.FetchRequest(have_version=have_version), timeout=self.timeout
        )
        try:
            first = next(responses, None)
            if first is None:
                raise ApexError(f"{what}: the server closed the stream without an answer")
            if first.not_newer:
                return None
            if not first.HasField("header"):
                raise ApexError(f"{what}: the server's first message has no header")
            if first.header.total_bytes > self.max_weights_bytes:
                raise ResourceExhaustedError(
                    f"{what}: the server's header declares {first.header.total_bytes} "
                    f"bytes of weights, more than this client accepts (max_weights_bytes "
                    f"{self.max_weights_bytes})"
                )
            try:
                version, layout, total = layout_from_proto(first.header)
            except InvalidArgumentError as err:
                raise ApexError(f"{what}: the server sent an inconsistent layout: {err}") from None
            payload = bytearray(total)  # checked above; filled in place: no regrowth copies for large models
            received = 0
            for chunk in itertools.chain([first.chunk], (r.chunk for r in responses)):
                if received + len(chunk) > total:
                    raise ApexError(f"{what}: the server sent more than the header's total_bytes {total}")
                payload[received : received + len(chunk)] = chunk
                received += len(chunk)
        except grpc.RpcError as err:
            raise from_rpc_error(err, what) from None
        except ApexError:
            responses.cancel()  # stop the server streaming the rest of a reply we refuse
            raise
        if received != total:
            raise ApexError(f"{what}: the stream ended after {received} of {total} bytes")
        if version == have_version:
            raise ApexError(f"{what}: the server sent the version the caller already holds")
        return version, unpack(layout, payload)

    def publish(self, weights: Mapping[str, np.ndarray], version: int | None = None) -> int:
        """Publish `weights` (name -> array of a supported dtype) as a new version; return its number.

        `version` None lets the server assign the previous version + 1. An explicit version must be greater than
        the service's current one and at most weights.MAX_VERSION_STEP above it: VersionRefusedError otherwise
        (also for one above weights.MAX_VERSION, refused here); read `version()` and publish above it.
        InvalidArgumentError for a version that is not a positive integer.
        """
        version = check_version_number(version)
        what = f"Publish(version={version}) to {self.address}"
        if version is not None:
            try:
                check_version_in_window(version)  # the top; the service checks the window above its version
            except VersionRefusedError as err:
                raise VersionRefusedError(f"{what}: {err}") from None
        layout, payload = pack(weights)
        header = header_to_proto(int(version or 0), layout, payload.nbytes)
        try:
            reply = self._stub.Publish(_publish_requests(header, payload), timeout=self.timeout)
        except grpc.RpcError as err:
            error = from_rpc_error(err, what)
            if error.code is ErrorCode.FAILED_PRECONDITION:  # the service's only one: the version's window
                raise VersionRefusedError(str(error)) from None
            raise error from None
        return int(reply.version)

    def version(self) -> int:
        """The newest version the service holds (0 when none), without moving any weights."""
        try:
            reply = self._stub.GetVersion(parameters_pb2.GetVersionRequest(), timeout=self.timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err, f"GetVersion from {self.address}") from None
        return int(reply.version)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ParameterClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ParameterClient({self.address!r}, timeout={self.timeout})"


def _publish_requests(
    header: parameters_pb2.WeightsHeader, payload: memoryview
) -> Iterator[parameters_pb2.PublishRequest]:
    first_chunk = max(0, DEFAULT_CHUNK_BYTES - header.ByteSize())
    for index, piece in enumerate(iter_chunks(payload, DEFAULT_CHUNK_BYTES, first_chunk)):
        request = parameters_pb2.PublishRequest(chunk=bytes(piece))
        if index == 0:
            request.header.CopyFrom(header)
        yield request

"""ParameterService servicer: reassembles published chunks, streams the newest weights in chunks, maps errors to
gRPC status codes. No versioning logic lives here; see weights.py and store.py.

Every message stays under gRPC's default 4 MiB limit whatever the model size: weights travel as the header (the
layout of every tensor) followed by chunks of at most `chunk_bytes` of the concatenated tensor bytes.

The service runs on the same asyncio runtime as the replay shards (common/aio_grpc.py): an open stream costs a
coroutine, not a thread, so Publish streams held open never stop Fetch and GetVersion. What publishers may make
it hold is bounded by `PublishLimits` (limits.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import NoReturn

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from apexrl.common.access import AccessPolicy
from apexrl.common.aio_grpc import AioServerThread, abort
from apexrl.common.call_limits import CallLimits, CallLimitSettings
from apexrl.common.connections import ConnectionPolicy
from apexrl.common.errors import (
    ApexError,
    CancelledError,
    DeadlineExceededError,
    InvalidArgumentError,
    ResourceExhaustedError,
)
from apexrl.common.metrics import RpcMetrics
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.limits import DEFAULT_MAX_REQUEST_BYTES, PublishLimits
from apexrl.parameter_server.store import Snapshot, WeightStore
from apexrl.parameter_server.weights import VersionRefusedError
from apexrl.parameter_server.wire import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    header_to_proto,
    iter_chunks,
    layout_from_proto,
)
from apexrl.proto import parameters_pb2, parameters_pb2_grpc

log = logging.getLogger(__name__)
# Why a Publish was refused, as the metric's label: the service was busy, the stream idle, the weights too large,
# or their version outside the window above the current one.
_REFUSALS = {ResourceExhaustedError: "limit", DeadlineExceededError: "idle", VersionRefusedError: "version"}


class ParameterServicer(parameters_pb2_grpc.ParameterServiceServicer):
    """Async servicer on one event loop (common/aio_grpc.py). Every call runs on the loop: store reads take no
    lock, and a publish takes the store's lock only to swap in the new version."""

    def __init__(
        self,
        store: WeightStore,
        rpc_metrics: RpcMetrics,
        registry: CollectorRegistry,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        limits: PublishLimits | None = None,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes ({chunk_bytes}) must be a positive number of bytes")
        self.store = store
        self.chunk_bytes = chunk_bytes
        self.limits = limits if limits is not None else PublishLimits()
        self._metrics = rpc_metrics
        self._publishing = 0  # Publish calls in progress (only the loop's thread touches it)
        self._served_bytes = Counter(
            "apexrl_params_served_bytes", "Weight bytes sent by Fetch", registry=registry
        )
        self._received_bytes = Counter(
            "apexrl_params_received_bytes",
            "Weight bytes received by Publish (rejected streams included)",
            registry=registry,
        )
        self._fetches = Counter(
            "apexrl_params_fetches",
            "Fetch calls by result (newer: weights sent; not_newer: the caller holds the newest)",
            ["result"],
            registry=registry,
        )
        for result in ("newer", "not_newer"):
            self._fetches.labels(result)
        Gauge(
            "apexrl_params_publishes_in_progress",
            "Publish calls being received (at most the setting max_concurrent_publishes)",
            registry=registry,
        ).set_function(lambda: self._publishing)
        self._refused = Counter(
            "apexrl_params_publish_refusals",
            "Publish calls refused by the service's bounds, by reason (limit: "
            "max_concurrent_publishes or max_weights_bytes; idle: publish_idle_timeout; version: outside the window "
            "above the current version)",
            ["reason"],
            registry=registry,
        )
        for reason in _REFUSALS.values():
            self._refused.labels(reason)

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, err: ApexError) -> NoReturn:
        """End the call with `err`'s status and message (context.abort raises)."""
        self._metrics.errors.labels(method, err.code.name).inc()
        log.debug("%s rejected: %s", method, err)
        await abort(context, err)

    async def Publish(self, request_iterator, context) -> parameters_pb2.PublishResponse:  # noqa: N802 (gRPC name)
        if self._publishing >= self.limits.max_concurrent_publishes:
            self._refused.labels("limit").inc()
            await self._abort(
                context,
                "Publish",
                ResourceExhaustedError(
                    f"{self._publishing} Publish calls are in progress, the most this service serves at once "
                    f"(max_concurrent_publishes {self.limits.max_concurrent_publishes}); retry later"
                ),
            )
        self._publishing += 1
        try:
            with self._metrics.time("Publish"):
                try:
                    deadline = asyncio.get_running_loop().time() + self.limits.publish_max_seconds
                    version = await self._receive(aiter(request_iterator), context, deadline)
                except ApexError as err:
                    reason = _REFUSALS.get(type(err))
                    if reason is not None:
                        self._refused.labels(reason).inc()
                    await self._abort(context, "Publish", err)
        finally:
            self._publishing -= 1
        log.debug("published version %d", version)
        return parameters_pb2.PublishResponse(version=version)

    async def _receive(
        self,
        requests: AsyncIterator[parameters_pb2.PublishRequest],
        context: grpc.aio.ServicerContext,
        deadline: float,
    ) -> int:
        """Reassemble one Publish stream and store it; nothing is stored unless every check passes. The declared
        size and the version are checked when the header arrives, before any byte is buffered. The whole stream
        must arrive before `deadline` (the event loop's clock)."""
        first = await self._next(requests, 0, deadline)
        if first is None or not first.HasField("header"):
            raise InvalidArgumentError("the first Publish message must carry the header")
        limit = self.limits.max_weights_bytes
        if first.header.total_bytes > limit:
            raise ResourceExhaustedError(
                f"Publish declares total_bytes {first.header.total_bytes}, more than this "
                f"service accepts (max_weights_bytes {limit}); nothing was buffered"
            )
        version, layout, total = layout_from_proto(first.header)
        requested = version or None  # 0: the store assigns previous + 1
        if requested is not None:
            self.store.check_version(requested)  # fail before receiving megabytes that would be refused
        payload = bytearray()  # grows with the bytes that arrive, not with what the header declares
        index, request = 0, first
        while request is not None:
            if index > 0 and request.HasField("header"):
                raise InvalidArgumentError(f"Publish message {index} carries a header; only the first may")
            self._received_bytes.inc(len(request.chunk))
            if len(payload) + len(request.chunk) > total:
                raise InvalidArgumentError(
                    f"Publish message {index} brings the bytes received to {len(payload) + len(request.chunk)}, "
                    f"more than the header's total_bytes {total}"
                )
            payload += request.chunk
            index += 1
            request = await self._next(requests, index, deadline)
        if len(payload) != total:
            raise InvalidArgumentError(
                f"Publish stream ended after {len(payload)} of the header's total_bytes {total}; "
                f"missing {total - len(payload)} bytes"
            )
        # A cancellation cancels this coroutine; one whose notice arrives with the end of the stream may still be
        # seen here as the end (parameters.proto: such a version is stored whole or not at all).
        if context.cancelled():
            raise CancelledError("the Publish call was cancelled before it ended; nothing stored")
        return self.store.publish_packed(layout, payload, requested)

    async def _next(
        self, requests: AsyncIterator[parameters_pb2.PublishRequest], index: int, deadline: float
    ) -> parameters_pb2.PublishRequest | None:
        """The stream's next message, None at its end; DeadlineExceededError when none comes within the idle
        timeout, or the whole Publish is past its deadline (a publisher that stopped sending, or trickles, gives
        its slot and its buffered bytes back)."""
        idle = self.limits.publish_idle_timeout
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(anext(requests, None), max(0.0, min(idle, left)))
        except asyncio.TimeoutError:  # an alias of TimeoutError from Python 3.11
            if left < idle:
                raise DeadlineExceededError(
                    f"Publish did not complete within {self.limits.publish_max_seconds:g} s "
                    f"(publish_max_seconds; {index} messages received): the stream was aborted, nothing stored"
                ) from None
            raise DeadlineExceededError(
                f"Publish message {index} did not arrive within {idle:g} s of the previous one "
                f"(publish_idle_timeout): the stream was aborted, nothing stored"
            ) from None

    async def Fetch(self, request, context) -> AsyncIterator[parameters_pb2.FetchResponse]:  # noqa: N802 (gRPC name)
        with self._metrics.time("Fetch"):
            snapshot = self.store.latest()
            # A caller holding a version above the newest one saw a service that has since restarted (and counts
            # from its learner's checkpoint again): it gets the newest weights, or it would act on stale ones until
            # the numbers caught up.
            if snapshot is None or snapshot.version == request.have_version:
                self._fetches.labels("not_newer").inc()
                yield parameters_pb2.FetchResponse(not_newer=True)
                return
            self._fetches.labels("newer").inc()
            for response, size in self._stream(snapshot):
                yield response
                self._served_bytes.inc(size)

    def _stream(self, snapshot: Snapshot) -> Iterator[tuple[parameters_pb2.FetchResponse, int]]:
        """The messages of one Fetch answer, each with the number of weight bytes it carries."""
        header = header_to_proto(snapshot.version, snapshot.layout, snapshot.total_bytes)
        # The first message carries the header and as many bytes as fit in chunk_bytes beside it.
        first_chunk = max(0, self.chunk_bytes - header.ByteSize())
        for index, piece in enumerate(iter_chunks(snapshot.payload, self.chunk_bytes, first_chunk)):
            # upb protobuf accepts only bytes: this is the one copy per chunk, into the outgoing message.
            response = parameters_pb2.FetchResponse(chunk=bytes(piece))
            if index == 0:
                response.header.CopyFrom(header)
            yield response, piece.nbytes

    async def GetVersion(self, request, context) -> parameters_pb2.GetVersionResponse:  # noqa: N802 (gRPC name)
        with self._metrics.time("GetVersion"):
            return parameters_pb2.GetVersionResponse(version=self.store.version)


class StoreCollector(Collector):
    """Reads the store at scrape time, so versions published in-process (a learner hosting the service) count too."""

    def __init__(self, store: WeightStore) -> None:
        self._store = store

    def collect(self):
        latest = self._store.latest()
        yield CounterMetricFamily(
            "apexrl_params_published_versions",
            "Versions published (over gRPC or in-process)",
            value=self._store.published_total,
        )
        yield GaugeMetricFamily(
            "apexrl_params_current_version",
            "Newest version number (0: none yet)",
            value=latest.version if latest else 0,
        )
        yield GaugeMetricFamily(
            "apexrl_params_current_weights_bytes",
            "Size of the newest version's tensor bytes",
            value=latest.total_bytes if latest else 0,
        )


@dataclass(frozen=True)
class ParameterServer:
    """A started parameter service: the server (stop, health: `enter_graceful_shutdown`), the port it bound and
    the store it serves (a host publishes into it)."""

    server: AioServerThread
    port: int
    store: WeightStore


def create_parameter_server(
    address: str,
    *,
    store: WeightStore | None = None,
    registry: CollectorRegistry | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    limits: PublishLimits | None = None,
    token: str | None = None,
    access: AccessPolicy | None = None,
    connections: ConnectionPolicy | None = None,
    call_limits: CallLimitSettings | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    tls: TlsFiles | None = None,
    health_address: str | None = None,
) -> ParameterServer:
    """Build, bind and start a parameter server serving `store` (a new empty one when None); return it with its
    port and store (ParameterServer).

    A learner hosts the service by passing its own store and publishing into it directly (`store.publish`);
    actors then Fetch over gRPC. Metrics (`apexrl_params_*`) go into `registry` when given. `chunk_bytes` bounds
    each Fetch message; it must not exceed `max_message_bytes`, nor the receive limit of the clients (4 MiB by
    default). `limits` bound what Publish calls may make the service hold (PublishLimits' defaults when None).
    `access` decides who may call what (common/access.py: a single-token policy for `token`; neither: open),
    `connections` keepalive and connection lifetimes (common/connections.py), `call_limits` the calls and request
    bytes any peer may make it hold (common/call_limits.py; every request at most `max_request_bytes`, refused by
    gRPC from its length prefix). With `tls` it serves TLS (mutual with a CA); with `health_address` it also serves the health service alone,
    in plaintext, there (`server.health_port`). `server.stop(grace)` returns an event set once it has stopped;
    `server.enter_graceful_shutdown()` reports NOT_SERVING. Raises ValueError for bad sizes and OSError when an
    address cannot be bound.
    """
    if not 1 <= chunk_bytes <= max_message_bytes:
        raise ValueError(
            f"chunk_bytes ({chunk_bytes}) must be in [1, max_message_bytes ({max_message_bytes})]"
        )
    store = store if store is not None else WeightStore()
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(StoreCollector(store))
    servicer = ParameterServicer(
        store, RpcMetrics(registry, "params"), registry, chunk_bytes=chunk_bytes, limits=limits
    )
    server = AioServerThread(
        lambda s: parameters_pb2_grpc.add_ParameterServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
        max_message_bytes=max_message_bytes,
        token=token,
        access=access,
        options=(connections or ConnectionPolicy()).server_options(),
        tls=tls,
        health_address=health_address,
        limits=CallLimits.of(call_limits or CallLimitSettings(), max_request_bytes),
    )
    port = server.start(address)
    return ParameterServer(server, port, store)

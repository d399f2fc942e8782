"""ParameterService servicer: reassembles published chunks, streams the newest weights in chunks, maps errors to
gRPC status codes. No versioning logic lives here; see store.py.

Every message stays under gRPC's default 4 MiB limit whatever the model size: weights travel as the header (the
layout of every tensor) followed by chunks of at most `chunk_bytes` of the concatenated tensor bytes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import grpc
from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from apexrl.common import grpc_util
from apexrl.common.errors import ApexError, CancelledError, InvalidArgumentError
from apexrl.common.metrics import RpcMetrics
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.store import Snapshot, WeightStore
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

class ParameterServicer(parameters_pb2_grpc.ParameterServiceServicer):
    def __init__(
        self,
        store: WeightStore,
        rpc_metrics: RpcMetrics,
        registry: CollectorRegistry,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes ({chunk_bytes}) must be a positive number of bytes")
        self.store = store
        self.chunk_bytes = chunk_bytes
        self._metrics = rpc_metrics
        self._served_bytes = Counter(
            "apexrl_params_served_bytes", "Weight bytes sent by Fetch", registry=registry
        )
        self._received_bytes = Counter(
            "apexrl_params_received_bytes", "Weight bytes received by Publish (rejected streams included)",
            registry=registry,
        )
        self._fetches = Counter(
            "apexrl_params_fetches", "Fetch calls by result (newer: weights sent; not_newer: the caller holds the newest)",
            ["result"], registry=registry,
        )
        for result in ("newer", "not_newer"):
            self._fetches.labels(result)

    def _abort(self, context: grpc.ServicerContext, method: str, err: ApexError) -> None:
        self._metrics.errors.labels(method, err.code.name).inc()
        log.debug("%s rejected: %s", method, err)
        context.abort(err.code, str(err))

    def Publish(self, request_iterator, context) -> parameters_pb2.PublishResponse:  # noqa: N802 (gRPC name)
        with self._metrics.time("Publish"):
            try:
                version = self._receive(request_iterator, context)
            except ApexError as err:
                self._abort(context, "Publish", err)  # raises
                raise
            log.debug("published version %d", version)
            return parameters_pb2.PublishResponse(version=version)

    def _receive(self, request_iterator, context: grpc.ServicerContext) -> int:
        """Reassemble one Publish stream and store it; nothing is stored unless every check passes."""
        requests = iter(request_iterator)
        first = next(requests, None)
        if first is None or not first.HasField("header"):
            raise InvalidArgumentError("the first Publish message must carry the header")
        version, layout, total = layout_from_proto(first.header)
        requested = version or None  # 0: the store assigns previous + 1
        if requested is not None:
            self.store.check_version(requested)  # fail before receiving megabytes that would be refused
        payload = bytearray()
        for index, request in enumerate(itertools.chain([first], requests)):
            if index > 0 and request.HasField("header"):
                raise InvalidArgumentError(f"Publish message {index} carries a header; only the first may")
            self._received_bytes.inc(len(request.chunk))
            if len(payload) + len(request.chunk) > total:
                raise InvalidArgumentError(
                    f"Publish message {index} brings the bytes received to {len(payload) + len(request.chunk)}, "
                    f"more than the header's total_bytes {total}"
                )
            payload += request.chunk
        if len(payload) != total:
            raise InvalidArgumentError(
                f"Publish stream ended after {len(payload)} of the header's total_bytes {total}; "
                f"missing {total - len(payload)} bytes"
            )
        # gRPC's Python server ends the request iterator the same way for a half-close and for a cancellation whose
        # notice has not been processed yet; asking the context again narrows that window to the notice's delivery.
        if not context.is_active():
            raise CancelledError("the Publish call was cancelled before it ended; nothing stored")
        return self.store.publish_packed(layout, payload, requested)

    def Fetch(self, request, context) -> Iterator[parameters_pb2.FetchResponse]:  # noqa: N802 (gRPC name)
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
            yield from self._stream(snapshot)

    def _stream(self, snapshot: Snapshot) -> Iterator[parameters_pb2.FetchResponse]:
        header = header_to_proto(snapshot.version, snapshot.layout, snapshot.total_bytes)
        # The first message carries the header and as many bytes as fit in chunk_bytes beside it.
        first_chunk = max(0, self.chunk_bytes - header.ByteSize())
        for index, piece in enumerate(iter_chunks(snapshot.payload, self.chunk_bytes, first_chunk)):
            # upb protobuf accepts only bytes: this is the one copy per chunk, into the outgoing message.
            response = parameters_pb2.FetchResponse(chunk=bytes(piece))
            if index == 0:
                response.header.CopyFrom(header)
            yield response
            self._served_bytes.inc(piece.nbytes)

    def GetVersion(self, request, context) -> parameters_pb2.GetVersionResponse:  # noqa: N802 (gRPC name)
        with self._metrics.time("GetVersion"):
            return parameters_pb2.GetVersionResponse(version=self.store.version)


class StoreCollector(Collector):
    """Reads the store at scrape time, so versions published in-process (a learner hosting the service) count too."""

    def __init__(self, store: WeightStore) -> None:
        self._store = store

    def collect(self):
        latest = self._store.latest()
        yield CounterMetricFamily(
            "apexrl_params_published_versions", "Versions published (over gRPC or in-process)",
            value=self._store.published_total,
        )
        yield GaugeMetricFamily(
            "apexrl_params_current_version", "Newest version number (0: none yet)",
            value=latest.version if latest else 0,
        )
        yield GaugeMetricFamily(
            "apexrl_params_current_weights_bytes", "Size of the newest version's tensor bytes",
            value=latest.total_bytes if latest else 0,
        )


def create_parameter_server(
    address: str,
    *,
    store: WeightStore | None = None,
    registry: CollectorRegistry | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
    tls: TlsFiles | None = None,
    health_address: str | None = None,
    max_workers: int = 16,
) -> tuple[grpc.Server, int, WeightStore, HealthServicer]:
    """Build, bind and start a parameter server serving `store` (a new empty one when None); return
    (server, port, store, health_servicer).

    A learner hosts the service by passing its own store and publishing into it directly (`store.publish`);
    actors then Fetch over gRPC. Metrics (`apexrl_params_*`) go into `registry` when given. `chunk_bytes` bounds
    each Fetch message; it must not exceed `max_message_bytes`, nor the receive limit of the clients (4 MiB by
    default). With `tls` it serves TLS (mutual with a CA); with `health_address` it also serves the health
    service alone, in plaintext, there (the server is then a grpc_util.WithHealthPort: `server.health_port`).
    Raises ValueError for bad sizes and OSError when an address cannot be bound.
    """
    if not 1 <= chunk_bytes <= max_message_bytes:
        raise ValueError(f"chunk_bytes ({chunk_bytes}) must be in [1, max_message_bytes ({max_message_bytes})]")
    store = store if store is not None else WeightStore()
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(StoreCollector(store))
    servicer = ParameterServicer(store, RpcMetrics(registry, "params"), registry, chunk_bytes=chunk_bytes)
    server = grpc_util.create_server(max_workers=max_workers, max_message_bytes=max_message_bytes, token=token)
    parameters_pb2_grpc.add_ParameterServiceServicer_to_server(servicer, server)
    health = grpc_util.add_health_and_reflection(server, [SERVICE_NAME])
    port = grpc_util.bind(server, address, tls=tls)
    grpc_util.warn_if_token_in_clear(address, port, token, tls)
    if health_address is not None:
        server = grpc_util.WithHealthPort(server, health, health_address)
    server.start()
    return server, port, store, health

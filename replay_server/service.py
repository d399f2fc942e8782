"""ReplayService servicer: decodes requests, calls the table, encodes answers, maps errors to gRPC status codes.

No replay logic lives here; see table.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from apexrl.common import grpc_util
from apexrl.common.errors import ApexError, InvalidArgumentError
from apexrl.common.metrics import RpcMetrics
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.table import ReplayTable

log = logging.getLogger(__name__)


class ReplayServicer(replay_pb2_grpc.ReplayServiceServicer):
    def __init__(self, table: ReplayTable, rpc_metrics: RpcMetrics) -> None:
        self.table = table
        self._metrics = rpc_metrics

    def _abort(self, context: grpc.ServicerContext, method: str, err: ApexError) -> None:
        self._metrics.errors.labels(method, err.code.name).inc()
        context.abort(err.code, str(err))

    def Insert(self, request_iterator, context) -> Iterator[replay_pb2.InsertAck]:  # noqa: N802 (gRPC name)
        for request in request_iterator:
            with self._metrics.time("Insert"):
                ack = self._insert_one(request, context)
            yield ack

    def _insert_one(self, request: replay_pb2.InsertRequest, context) -> replay_pb2.InsertAck:
        try:
            columns, priorities = wire.decode_insert(request)
            result = self.table.insert(
                columns,
                priorities,
                writer_id=request.writer_id,
                sequence=request.sequence,
                timeout=context.time_remaining(),
                is_active=context.is_active,
            )
        except ApexError as err:
            self._metrics.errors.labels("Insert", err.code.name).inc()
            log.debug("rejected batch %s/%d: %s", request.writer_id, request.sequence, err)
            return wire.encode_ack(request.sequence, self.table.incarnation, error_code=err.code.value[0],
                                   error_message=str(err))
        return wire.encode_ack(request.sequence, self.table.incarnation, result)

    def Sample(self, request, context) -> replay_pb2.SampleResponse:  # noqa: N802
        with self._metrics.time("Sample"):
            try:
                result = self.table.sample(
                    request.batch_size,
                    wait=not request.no_wait,
                    timeout=context.time_remaining(),
                    is_active=context.is_active,
                )
            except ApexError as err:
                self._abort(context, "Sample", err)
            return wire.encode_sample(result)

    def _update(self, request: replay_pb2.UpdatePrioritiesRequest) -> replay_pb2.UpdatePrioritiesResponse:
        keys, priorities, incarnation = wire.decode_update(request)
        if keys.shape != priorities.shape:
            raise InvalidArgumentError(
                f"keys {list(keys.shape)} and priorities {list(priorities.shape)} must have the same shape [n]"
            )
        return wire.encode_update_result(self.table.update_priorities(keys, priorities, incarnation))

    def UpdatePriorities(self, request, context) -> replay_pb2.UpdatePrioritiesResponse:  # noqa: N802
        with self._metrics.time("UpdatePriorities"):
            try:
                return self._update(request)
            except ApexError as err:
                self._abort(context, "UpdatePriorities", err)

    def StreamUpdatePriorities(self, request_iterator, context):  # noqa: N802
        for request in request_iterator:
            with self._metrics.time("StreamUpdatePriorities"):
                try:
                    response = self._update(request)
                except ApexError as err:
                    self._abort(context, "StreamUpdatePriorities", err)
            yield response

    def Info(self, request, context) -> replay_pb2.InfoResponse:  # noqa: N802
        return wire.encode_info(self.table.info())


class TableCollector:
    """Exports the table's own counters at scrape time, so the hot path keeps a single set of counters."""

    def __init__(self, table: ReplayTable) -> None:
        self._table = table

    def describe(self):
        return []

    def collect(self):
        info = self._table.info()
        for name, doc, value in (
            ("inserted_rows", "Rows stored (resent duplicates not counted)", info.inserted_total),
            ("inserted_bytes", "Bytes of row data stored", info.inserted_bytes_total),
            ("evicted_rows", "Rows overwritten by FIFO eviction", info.evicted_total),
            ("sampled_rows", "Rows returned by Sample", info.sampled_total),
            ("priority_updates", "Priority updates applied", info.updated_total),
            ("stale_priority_updates", "Priority updates ignored: key evicted, unknown or of another incarnation",
             info.stale_updates_total),
            ("duplicate_batches", "Resent batches acknowledged without storing", info.duplicate_batches_total),
        ):
            yield CounterMetricFamily(f"apexrl_replay_{name}", doc, value=value)
        for name, doc, value in (
            ("size_rows", "Rows held", info.size),
            ("capacity_rows", "Rows the table can hold", info.capacity),
            ("total_priority", "Sum of stored priorities (p**alpha)", info.total_priority),
            ("min_priority", "Smallest positive stored priority (p**alpha)", info.min_priority),
            ("max_priority", "Largest raw priority seen", info.max_priority),
        ):
            yield GaugeMetricFamily(f"apexrl_replay_{name}", doc, value=value)


def create_replay_server(
    table: ReplayTable,
    address: str = "127.0.0.1:0",
    *,
    registry: CollectorRegistry | None = None,
    max_message_bytes: int = grpc_util.DEFAULT_MAX_MESSAGE_BYTES,
    max_workers: int = 16,
    token: str | None = None,
):
    """Build and start a replay shard server for `table`; return (server, port, health_servicer, registry)."""
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(TableCollector(table))
    server = grpc_util.create_server(max_workers=max_workers, max_message_bytes=max_message_bytes, token=token)
    replay_pb2_grpc.add_ReplayServiceServicer_to_server(ReplayServicer(table, RpcMetrics(registry, "replay")), server)
    health = grpc_util.add_health_and_reflection(server, [wire.SERVICE_NAME])
    port = grpc_util.bind(server, address)
    server.start()
    return server, port, health, registry

"""ReplayService servicer: decodes requests, calls the table, encodes answers, maps errors to gRPC status codes;
`create_replay_server` builds and starts one.

No replay logic lives here; see table.py. The Insert stream's work is inserts.py's, waiting for the table waits.py's,
the table's metrics metrics.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import grpc
from prometheus_client import CollectorRegistry, Gauge

from apexrl.common import grpc_util
from apexrl.common.access import AccessPolicy
from apexrl.common.aio_grpc import AioServerThread, Lane, abort
from apexrl.common.call_limits import CallLimits, CallLimitSettings
from apexrl.common.connections import ConnectionPolicy
from apexrl.common.errors import (
    ApexError,
    FailedPreconditionError,
    InternalError,
)
from apexrl.common.metrics import RpcMetrics
from apexrl.common.request_streams import RequestStreams
from apexrl.common.tls import TlsFiles
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.core.admission import NotReadyError
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.updates import check_update
from apexrl.replay_server.server.inserts import InsertPath
from apexrl.replay_server.server.metrics import TableCollector
from apexrl.replay_server.server.quotas import Quotas, QuotaSettings
from apexrl.replay_server.server.waits import Waits
from apexrl.replay_server.server.writer_identity import Writer

if TYPE_CHECKING:
    from apexrl.replay_server.durability.checkpointer import Checkpointer
    from apexrl.replay_server.durability.wal import WriteAheadLog

log = logging.getLogger(__name__)
# The one method whose requests may be as large as max_message_bytes; every other one: max_request_bytes.
LARGE_METHODS = (f"/{wire.SERVICE_NAME}/Insert",)
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


class ReplayServicer(replay_pb2_grpc.ReplayServiceServicer):
    """Async servicer on one event loop (common/aio_grpc.py): every open stream costs a coroutine, not a thread.

    Table calls never block the loop: the table answers at once, and a call the rate limiter or the minimum
    size holds back (NotReadyError) waits on `Changes` (woken by every insert, sample and update) until it can go on or its
    deadline passes, so waiting writers and samplers cost nothing while they wait. Inserts take turns in a `Lane`,
    so Sample, Info and priority updates are answered between two slices of inserts however many writers are
    connected."""

    def __init__(
        self,
        table: ReplayTable,
        rpc_metrics: RpcMetrics,
        registry: CollectorRegistry,
        access: AccessPolicy | None = None,
        quotas: QuotaSettings | None = None,
        checkpointer: Checkpointer | None = None,
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.table = table
        self.access = access if access is not None else AccessPolicy()
        self.quotas = Quotas(quotas if quotas is not None else QuotaSettings(), registry)
        self.checkpointer = checkpointer  # the Checkpoint RPC's, when the shard has a checkpoint directory
        self._metrics = rpc_metrics
        self.insert_lane = Lane()
        Gauge(
            "apexrl_replay_insert_queue_batches",
            "Insert batches received and waiting for their turn in the insert lane",
            registry=registry,
        ).set_function(lambda: len(self.insert_lane))
        self.waits = Waits(table, self.quotas, registry)
        self.inserts = InsertPath(table, self.waits, rpc_metrics, self.insert_lane, wal)
        # Insert and priority streams never end on their own: close() ends them before the server's grace runs out.
        self.streams = RequestStreams("replay shard is shutting down")

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, err: ApexError) -> NoReturn:
        """Count the refusal and end the call with `err`'s status (raises)."""
        self._metrics.errors.labels(method, err.code.name).inc()
        await abort(context, err)

    def _writer(self, context) -> Writer:
        """Who writes on this Insert stream (the access interceptor has let it in)."""
        return Writer(self.access.identify(context.invocation_metadata(), context.auth_context))

    async def Insert(self, request_iterator, context) -> AsyncIterator[replay_pb2.InsertAck]:  # noqa: N802
        try:
            with self.quotas.call(context.peer()):
                requests = self.streams.each(request_iterator)
                async with contextlib.aclosing(
                    self.inserts.acks(requests, self._writer(context), context)
                ) as acks:
                    async for ack in acks:
                        yield ack
        except (
            ApexError
        ) as err:  # the connection's quota, or the shard stopping (batches are answered in acks)
            await self._abort(context, "Insert", err)

    async def Sample(self, request, context) -> replay_pb2.SampleResponse:  # noqa: N802
        with self._metrics.time("Sample"):
            try:
                with self.quotas.call(context.peer()):
                    result = await self._sample(request, context)
            except ApexError as err:
                await self._abort(context, "Sample", err)
            self.waits.notify()
            return wire.encode_sample(result)

    async def _sample(self, request, context):
        size, rows = request.batch_size, request.batch_rows
        if request.no_wait:
            try:
                return self.table.sample(size, batch_rows=rows)
            except NotReadyError as err:
                raise FailedPreconditionError(err.reason) from None
        return await self.waits.when_ready(
            lambda: self.table.sample(size, batch_rows=rows), context, "sample"
        )

    def _update(self, request: replay_pb2.UpdatePrioritiesRequest) -> replay_pb2.UpdatePrioritiesResponse:
        keys, priorities, incarnation = wire.decode_update(request)
        result = self.table.update_priorities(keys, priorities, incarnation)
        self.waits.notify()
        return wire.encode_update_result(result)

    async def UpdatePriorities(self, request, context) -> replay_pb2.UpdatePrioritiesResponse:  # noqa: N802
        with self._metrics.time("UpdatePriorities"):
            try:
                return self._update(request)
            except ApexError as err:
                await self._abort(context, "UpdatePriorities", err)

    async def StreamUpdatePriorities(self, request_iterator, context):  # noqa: N802
        try:
            with self.quotas.call(context.peer()):
                async with contextlib.aclosing(self.streams.steps(request_iterator)) as steps:
                    async for requests in steps:
                        start = time.perf_counter()
                        responses, error = self._update_together(requests)
                        each = (time.perf_counter() - start) / len(requests)
                        latency = self._metrics.latency.labels("StreamUpdatePriorities")
                        for _ in requests:  # one observation per message, as for every stream
                            latency.observe(each)
                        for response in responses:
                            yield response
                        if error is not None:
                            raise error
        except ApexError as err:
            await self._abort(context, "StreamUpdatePriorities", err)

    def _update_together(
        self, requests: list[replay_pb2.UpdatePrioritiesRequest]
    ) -> tuple[list[replay_pb2.UpdatePrioritiesResponse], ApexError | None]:
        """The responses to the requests before the first bad one, applied in one table call, and that one's
        error (None when all were good)."""
        checked, error = [], None
        for request in requests:
            try:
                checked.append(check_update(*wire.decode_update(request)))
            except ApexError as err:
                error = err
                break
        results = self.table.apply_updates(checked) if checked else []
        if results:
            self.waits.notify()
        return [wire.encode_update_result(result) for result in results], error

    async def Info(self, request, context) -> replay_pb2.InfoResponse:  # noqa: N802
        return wire.encode_info(self.table.info())

    async def Checkpoint(self, request, context) -> replay_pb2.CheckpointResponse:  # noqa: N802
        with self._metrics.time("Checkpoint"):
            try:
                if self.checkpointer is None:
                    raise FailedPreconditionError(
                        "this shard has no checkpoint directory (setting checkpoint_dir)"
                    )
                result = await asyncio.wrap_future(self.checkpointer.request())
            except ApexError as err:
                await self._abort(context, "Checkpoint", err)
            except OSError as err:
                await self._abort(
                    context, "Checkpoint", InternalError(f"checkpoint could not be written: {err}")
                )
            return wire.encode_checkpoint(result)

    def close(self) -> None:
        """The server is stopping: every waiting call and open stream answers UNAVAILABLE (the table itself stays
        usable, so a new server can serve it)."""
        self.waits.close()
        self.streams.close()


def _not_serving_once_the_log_fails(server: AioServerThread):
    """The write-ahead log's failure callback: the log refuses every insert from now on, so the shard leaves the
    load balancers' rotation (health NOT_SERVING) until a restart. It runs under the table lock, maybe on the
    server's own loop, and reporting waits on that loop: hence a thread."""

    def not_serving(error: BaseException) -> None:
        log.error("the write-ahead log failed (%s): health NOT_SERVING until the shard restarts", error)
        threading.Thread(target=server.enter_graceful_shutdown, name="apexrl-wal-failed", daemon=True).start()

    return not_serving


@dataclass(frozen=True)
class ReplayServer:
    """A started replay shard: the server (stop, health: `enter_graceful_shutdown`, `set_serving`), the port it
    bound and the registry its metrics are in."""

    server: AioServerThread
    port: int
    registry: CollectorRegistry


def create_replay_server(
    table: ReplayTable,
    address: str = "127.0.0.1:0",
    *,
    registry: CollectorRegistry | None = None,
    max_message_bytes: int = grpc_util.DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
    access: AccessPolicy | None = None,
    quotas: QuotaSettings | None = None,
    connections: ConnectionPolicy | None = None,
    limits: CallLimitSettings | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    tls: TlsFiles | None = None,
    health_address: str | None = None,
    serving: bool = True,
    checkpointer: Checkpointer | None = None,
    wal: WriteAheadLog | None = None,
) -> ReplayServer:
    """Build and start a replay shard server for `table`; return it with its port and registry (ReplayServer).

    The server runs on its own event-loop thread; `server.stop(grace)` closes the table first (waiting calls
    answer UNAVAILABLE) and returns an event set once it has stopped; `server.enter_graceful_shutdown()` reports
    NOT_SERVING. `access` decides who may call what (common/access.py; a
    single-token policy for `token`; neither: open), `quotas` what callers may hold open (replay_server/server/quotas.py),
    `connections` keepalive and connection lifetimes (common/connections.py), `limits` the calls and request
    bytes any peer may make it hold (common/call_limits.py: Insert messages up to `max_message_bytes`, every other
    request up to `max_request_bytes`). With `tls` it serves TLS (mutual with a CA); with
    `health_address` it also serves the health service alone, in plaintext, there (`server.health_port`). With
    `serving` false health reports NOT_SERVING until `server.set_serving()` (the shard is restoring); with a
    `checkpointer` the Checkpoint RPC writes checkpoints; with a `wal` every insert is acknowledged only once
    it is in the write-ahead log, and once the log fails inserts answer UNAVAILABLE and health NOT_SERVING.
    Raises OSError when an address cannot be bound."""
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(TableCollector(table))  # metrics.py
    access = access if access is not None else AccessPolicy.single_token(token) if token else AccessPolicy()
    servicer = ReplayServicer(
        table, RpcMetrics(registry, "replay"), registry, access, quotas, checkpointer=checkpointer, wal=wal
    )

    async def close() -> None:
        servicer.close()

    server = AioServerThread(
        lambda s: replay_pb2_grpc.add_ReplayServiceServicer_to_server(servicer, s),
        [wire.SERVICE_NAME],
        max_message_bytes=max_message_bytes,
        access=access,
        options=(connections or ConnectionPolicy()).server_options(),
        tls=tls,
        health_address=health_address,
        serving=serving,
        on_stop=close,
        limits=CallLimits.of(limits or CallLimitSettings(), max_request_bytes, LARGE_METHODS),
    )
    port = server.start(address)
    if wal is not None:
        wal.on_failure(_not_serving_once_the_log_fails(server))
    return ReplayServer(server, port, registry)

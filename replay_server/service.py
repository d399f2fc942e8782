"""ReplayService servicer: decodes requests, calls the table, encodes answers, maps errors to gRPC status codes.

No replay logic lives here; see table.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

import grpc
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from apexrl.common import grpc_util
from apexrl.common.access import AccessPolicy
from apexrl.common.aio_grpc import AioServerThread, Changes, Lane, abort
from apexrl.common.compression import take_rows
from apexrl.common.connections import ConnectionPolicy
from apexrl.common.errors import (
    ApexError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    ResourceExhaustedError,
    UnavailableError,
)
from apexrl.common.metrics import RpcMetrics
from apexrl.common.tls import TlsFiles
from apexrl.proto import replay_pb2, replay_pb2_grpc
from apexrl.replay_server import wire
from apexrl.replay_server.drain import drain_requests
from apexrl.replay_server.quotas import Quotas, QuotaSettings
from apexrl.replay_server.table import ReplayTable
from apexrl.replay_server.types import InsertResult
from apexrl.replay_server.updates import check_update
from apexrl.replay_server.writers import Writer

if TYPE_CHECKING:
    from apexrl.replay_server.durability.checkpointer import Checkpointer
    from apexrl.replay_server.durability.wal import WriteAheadLog

log = logging.getLogger(__name__)
T = TypeVar("T")
# How often a waiting call re-checks its deadline and its caller when nothing changes.
_WAIT_SLICE_SECONDS = 0.25


def batch_nbytes(decoded: tuple | None) -> int:
    """Bytes of a decoded insert (columns, priorities): what a waiting insert holds in memory."""
    if decoded is None:
        return 0
    columns, priorities = decoded
    return sum(column.nbytes for column in columns.values()) + (
        0 if priorities is None else priorities.nbytes
    )


class ReplayServicer(replay_pb2_grpc.ReplayServiceServicer):
    """Async servicer on one event loop (common/aio_grpc.py): every open stream costs a coroutine, not a thread.

    Table calls never block the loop: they are made with timeout 0, and a call the rate limiter or the minimum
    size holds back waits on `Changes` (woken by every insert, sample and update) until it can go on or its
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
    ) -> None:
        self.table = table
        self.access = access if access is not None else AccessPolicy()
        self.quotas = Quotas(quotas if quotas is not None else QuotaSettings(), registry)
        self.checkpointer: Checkpointer | None = None  # set when the shard has a checkpoint directory
        self.wal: WriteAheadLog | None = None  # set when the shard has a write-ahead log
        self._metrics = rpc_metrics
        self._changes = Changes()
        self._closing = False
        self.insert_lane = Lane()
        Gauge(
            "apexrl_replay_insert_queue_batches",
            "Insert batches received and waiting for their turn in the insert lane",
            registry=registry,
        ).set_function(lambda: len(self.insert_lane))
        self._waiting = Gauge(
            "apexrl_replay_waiting_calls",
            "Calls held back by the rate limiter or the minimum size, waiting for the table to change",
            ["call"],
            registry=registry,
        )
        for call in ("insert", "sample"):
            self._waiting.labels(call)

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, err: ApexError) -> NoReturn:
        """Count the refusal and end the call with `err`'s status (raises)."""
        self._metrics.errors.labels(method, err.code.name).inc()
        await abort(context, err)

    async def _when_ready(
        self,
        attempt: Callable[[], T],
        context: grpc.aio.ServicerContext,
        what: str,
        lane: Lane | None = None,
        held_bytes: Callable[[], int] = lambda: 0,
    ) -> T:
        """attempt() (in `lane`'s turn when given) until it does not raise DeadlineExceededError (not ready yet),
        waiting for table changes in between, up to the call's deadline or the shard's max_wait_seconds, whichever
        comes first; then DeadlineExceededError naming what held it back. While it waits the call counts against
        the waiting quotas (with the `held_bytes()` of decoded data it keeps): ResourceExhaustedError when full."""
        try:
            return attempt() if lane is None else await lane.run(attempt)
        except DeadlineExceededError:
            pass
        with self.quotas.waiting_call(held_bytes()):
            return await self._wait_until_ready(attempt, context, what, lane)

    async def _wait_until_ready(
        self, attempt: Callable[[], T], context: grpc.aio.ServicerContext, what: str, lane: Lane | None
    ) -> T:
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        longest = self.quotas.settings.max_wait_seconds
        deadline = loop.time() + (longest if remaining is None else min(remaining, longest))
        while True:
            if self._closing:
                raise UnavailableError("replay shard is shutting down")
            if loop.time() >= deadline:
                raise DeadlineExceededError(
                    f"{what} waited until its deadline (at most max_wait_seconds "
                    f"{longest:g}): {self.table.not_ready_reason()}"
                )
            if context.done():
                raise DeadlineExceededError(f"{what} abandoned: the caller went away")
            with self._waiting.labels(what).track_inprogress():
                await self._changes.wait(max(0.0, min(_WAIT_SLICE_SECONDS, deadline - loop.time())))
            try:
                return attempt() if lane is None else await lane.run(attempt)
            except DeadlineExceededError:
                continue

    def _writer(self, context) -> Writer:
        """Who writes on this Insert stream (the access interceptor has let it in)."""
        return Writer(self.access.identify(context.invocation_metadata(), context.auth_context))

    async def Insert(self, request_iterator, context) -> AsyncIterator[replay_pb2.InsertAck]:  # noqa: N802
        try:
            with self.quotas.call(context.peer()):
                async with contextlib.aclosing(self._insert_stream(request_iterator, context)) as acks:
                    async for ack in acks:
                        yield ack
        except (
            ResourceExhaustedError
        ) as err:  # the connection's quota: batches are answered one by one in acks
            await self._abort(context, "Insert", err)

    async def _insert_stream(self, request_iterator, context) -> AsyncIterator[replay_pb2.InsertAck]:
        writer = self._writer(context)
        if self.wal is None:
            async for request in request_iterator:
                with self._metrics.time("Insert"):
                    acks = await self._insert_request(request, writer, context)
                for ack in acks:
                    yield ack
            return
        # With the write-ahead log, each ack waits until its batches are durable, while the stream's next batches
        # are already stored: a stream's batches share fsyncs (group commit) instead of waiting one by one.
        stored: asyncio.Queue = asyncio.Queue(maxsize=1024)

        async def store() -> None:
            try:
                async for request in request_iterator:
                    with self._metrics.time("Insert"):
                        acks = await self._insert_request(request, writer, context)
                    for ack in acks:
                        # A duplicate may have been stored by a stream whose ack is still waiting: wait for all.
                        key = (
                            ack.first_key + ack.rows
                            if ack.rows
                            else self.table.next_key
                            if ack.duplicate
                            else 0
                        )
                        await stored.put((ack, key))
            except asyncio.CancelledError:  # the stream is over: nobody reads the queue any more
                raise
            except BaseException:
                await stored.put(None)  # the acks before it still go out, then the error ends the stream
                raise
            await stored.put(None)

        storing = asyncio.ensure_future(store())
        try:
            while (item := await stored.get()) is not None:
                ack, key = item
                yield await self._when_durable(ack, key)
            await storing  # its exception, if any, ends the stream with its status
        finally:
            storing.cancel()

    async def _when_durable(self, ack: replay_pb2.InsertAck, key: int) -> replay_pb2.InsertAck:
        """`ack` once every key below `key` is in the write-ahead log; an UNAVAILABLE ack if the log failed."""
        if not key or self.wal.durable_key >= key:
            return ack
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not future.done():
                future.set_result(error)

        self.wal.when_durable(key, lambda error: loop.call_soon_threadsafe(settle, error))
        error = await future
        if error is None:
            return ack
        self._metrics.errors.labels("Insert", "UNAVAILABLE").inc()
        return wire.encode_ack(
            ack.sequence,
            ack.incarnation,
            error_code=UnavailableError.code.number,
            error_message=f"the write-ahead log failed ({error}): not acknowledged",
            batches=ack.batches,
        )

    async def _insert_request(
        self, request: replay_pb2.InsertRequest, writer: Writer, context
    ) -> list[replay_pb2.InsertAck]:
        """The acks of one InsertRequest: one for a one-batch request, one per run of same-outcome batches for a
        merged one (replay.proto, InsertRequest.batch_rows)."""
        if not request.batch_rows:
            return [await self._insert_one(request, writer, context)]
        return await self._insert_merged(request, writer, context)

    def _rejected(
        self, request: replay_pb2.InsertRequest, sequence: int, err: ApexError, batches: int = 1
    ) -> replay_pb2.InsertAck:
        self._metrics.errors.labels("Insert", err.code.name).inc()
        log.debug("rejected batch %s/%d: %s", request.writer_id, sequence, err)
        return wire.encode_ack(
            sequence,
            self.table.incarnation,
            error_code=err.code.number,
            error_message=str(err),
            batches=batches,
        )

    async def _insert_one(
        self, request: replay_pb2.InsertRequest, writer: Writer, context
    ) -> replay_pb2.InsertAck:
        decoded: tuple | None = None

        def attempt():
            nonlocal decoded
            if decoded is None:  # decoding is work too: it takes its turn in the lane
                decoded = wire.decode_insert(request)
            columns, priorities = decoded
            writer.check_may_fix_signature(self.table)
            return self.table.insert(
                columns,
                priorities,
                writer_id=writer.qualified(request.writer_id),
                sequence=request.sequence,
                timeout=0,
            )

        try:
            result = await self._when_ready(
                attempt, context, "insert", self.insert_lane, held_bytes=lambda: batch_nbytes(decoded)
            )
        except ApexError as err:
            return self._rejected(request, request.sequence, err)
        if not result.duplicate:
            self._changes.notify()
        return wire.encode_ack(request.sequence, self.table.incarnation, result)

    async def _insert_merged(
        self, request: replay_pb2.InsertRequest, writer: Writer, context
    ) -> list[replay_pb2.InsertAck]:
        """Store the batches of a merged request as if each had come alone, in order, in as few table calls as
        exactly-once allows.

        The table remembers one number per writer, its last stored sequence L, and stores a call numbered s only
        when s > L. Batch i is therefore stored alone first (numbered sequence + i): if that stores it, L was below
        it, so every later batch of the request is above L and all of them are stored by one more call, numbered
        with the last one's sequence, which leaves L where storing them one by one would. When batch i comes back
        as a duplicate (a resend after a broken stream), the next batch is tried alone the same way; when the
        call for the others fails (one of them is bad, or the table ran out of room), they are stored one by one,
        so exactly the bad batch is refused."""
        try:
            columns, priorities = await self.insert_lane.run(lambda: wire.decode_insert(request))
            offsets = wire.merged_batch_offsets(request, columns, priorities)
        except ApexError as err:  # the request as a whole does not decode: every batch of it is refused
            batches = len(request.batch_rows)
            return [self._rejected(request, min(request.sequence + batches - 1, (1 << 64) - 1), err, batches)]
        batches, acks, merge, i = len(offsets) - 1, [], True, 0
        writer_id = writer.qualified(request.writer_id)
        held = batch_nbytes((columns, priorities))

        def store(first: int, end: int) -> InsertResult:
            """One table call for batches first .. end - 1, numbered with the last one's sequence."""
            lo, hi = offsets[first], offsets[end]
            writer.check_may_fix_signature(self.table)
            return self.table.insert(
                {name: take_rows(column, slice(lo, hi)) for name, column in columns.items()},
                None if priorities is None else priorities[lo:hi],
                writer_id=writer_id,
                sequence=request.sequence + end - 1,
                timeout=0,
            )

        while i < batches:
            alone, rest = await self._store_alone_then_rest(
                store, i, batches if merge else i + 1, held, context
            )
            if isinstance(alone, ApexError):
                acks.append(self._rejected(request, request.sequence + i, alone))
                i += 1
                continue
            self._add_result(acks, request.sequence + i, 1, alone)
            i += 1
            if isinstance(rest, ApexError):
                merge = False  # one of the others is bad: one by one from here, to refuse exactly that one
            elif rest is not None:
                self._add_result(acks, request.sequence + batches - 1, batches - i, rest)
                i = batches
        if any(not ack.error_code and ack.rows for ack in acks):
            self._changes.notify()
        return acks

    async def _store_alone_then_rest(
        self,
        store: Callable[[int, int], InsertResult],
        i: int,
        end: int,
        held: int,
        context,
    ) -> tuple[InsertResult | ApexError, InsertResult | ApexError | None]:
        """Batch i alone, then, if that stored it, batches i + 1 .. end - 1 in one call (none when end <= i + 1),
        in one turn of the insert lane unless the rate limiter holds the second call back. Failures come back as
        the ApexError of the call that failed."""
        alone: InsertResult | None = None
        rest: InsertResult | None = None

        def attempt() -> None:
            nonlocal alone, rest
            if alone is None:
                alone = store(i, i + 1)
            if not alone.duplicate and i + 1 < end:
                rest = store(i + 1, end)

        try:
            await self._when_ready(attempt, context, "insert", self.insert_lane, held_bytes=lambda: held)
        except ApexError as err:
            return (err, None) if alone is None else (alone, err)
        return alone, rest

    def _add_result(
        self, acks: list[replay_pb2.InsertAck], sequence: int, batches: int, result: InsertResult
    ) -> None:
        """Answer `batches` batches ending with `sequence` that had `result`: by extending the last ack when it
        answered the batches just before with the same outcome (stored right before these rows, or duplicates)."""
        last = acks[-1] if acks else None
        if (
            last is not None
            and not last.error_code
            and last.duplicate == result.duplicate
            and (result.duplicate or last.first_key + last.rows == result.first_key)
        ):
            last.sequence, last.batches, last.rows = sequence, last.batches + batches, last.rows + result.rows
        else:
            acks.append(wire.encode_ack(sequence, self.table.incarnation, result, batches=batches))

    async def Sample(self, request, context) -> replay_pb2.SampleResponse:  # noqa: N802
        with self._metrics.time("Sample"):
            try:
                with self.quotas.call(context.peer()):
                    result = await self._sample(request, context)
            except ApexError as err:
                await self._abort(context, "Sample", err)
            self._changes.notify()
            return wire.encode_sample(result)

    async def _sample(self, request, context):
        size, rows = request.batch_size, request.batch_rows
        if request.no_wait:
            return self.table.sample(size, wait=False, batch_rows=rows)
        return await self._when_ready(
            lambda: self.table.sample(size, timeout=0, batch_rows=rows), context, "sample"
        )

    def _update(self, request: replay_pb2.UpdatePrioritiesRequest) -> replay_pb2.UpdatePrioritiesResponse:
        keys, priorities, incarnation = wire.decode_update(request)
        result = self.table.update_priorities(keys, priorities, incarnation)
        self._changes.notify()
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
                async with contextlib.aclosing(drain_requests(request_iterator)) as steps:
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
            self._changes.notify()
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
        """The server is stopping: every waiting call answers UNAVAILABLE (the table itself stays usable, so a
        new server can serve it)."""
        self._closing = True
        self._changes.notify()


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
            (
                "inserted_bytes",
                "Bytes of row data stored (compressed fields as their frames)",
                info.inserted_bytes_total,
            ),
            ("evicted_rows", "Rows overwritten by FIFO eviction", info.evicted_total),
            ("sampled_rows", "Rows returned by Sample", info.sampled_total),
            ("priority_updates", "Priority updates applied", info.updated_total),
            (
                "stale_priority_updates",
                "Priority updates ignored: key evicted, unknown or of another incarnation",
                info.stale_updates_total,
            ),
            (
                "duplicate_batches",
                "Resent batches acknowledged without storing",
                info.duplicate_batches_total,
            ),
        ):
            yield CounterMetricFamily(f"apexrl_replay_{name}", doc, value=value)
        for name, doc, value in (
            ("size_rows", "Rows held", info.size),
            ("capacity_rows", "Rows the table can hold", info.capacity),
            (
                "stored_bytes",
                "Bytes of row data held, compressed fields as stored (divided by size_rows: bytes per "
                "stored row)",
                info.stored_bytes,
            ),
            (
                "max_bytes",
                "Bytes of row data the table holds at most (setting max_bytes; 0: no limit but the "
                "capacity in rows)",
                info.max_bytes,
            ),
            ("total_priority", "Sum of stored priorities (p**alpha)", info.total_priority),
            ("min_priority", "Smallest positive stored priority (p**alpha)", info.min_priority),
            ("max_priority", "Largest raw priority seen", info.max_priority),
        ):
            yield GaugeMetricFamily(f"apexrl_replay_{name}", doc, value=value)


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
    single-token policy for `token`; neither: open), `quotas` what callers may hold open (replay_server/quotas.py),
    `connections` keepalive and connection lifetimes (common/connections.py).
    With `tls` it serves TLS (mutual with a CA); with
    `health_address` it also serves the health service alone, in plaintext, there (`server.health_port`). With
    `serving` false health reports NOT_SERVING until `server.set_serving()` (the shard is restoring); with a
    `checkpointer` the Checkpoint RPC writes checkpoints; with a `wal` every insert is acknowledged only once
    it is in the write-ahead log, and once the log fails inserts answer UNAVAILABLE and health NOT_SERVING.
    Raises OSError when an address cannot be bound."""
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(TableCollector(table))
    access = access if access is not None else AccessPolicy.single_token(token) if token else AccessPolicy()
    servicer = ReplayServicer(table, RpcMetrics(registry, "replay"), registry, access, quotas)
    servicer.checkpointer, servicer.wal = checkpointer, wal

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
    )
    port = server.start(address)
    if wal is not None:

        def not_serving(error: BaseException) -> None:
            # The log refuses every insert from now on: leave the load balancers' rotation until a restart. This
            # runs under the table lock, maybe on the server's own loop, and reporting waits on that loop.
            log.error("the write-ahead log failed (%s): health NOT_SERVING until the shard restarts", error)
            threading.Thread(
                target=server.enter_graceful_shutdown, name="apexrl-wal-failed", daemon=True
            ).start()

        wal.on_failure(not_serving)
    return ReplayServer(server, port, registry)

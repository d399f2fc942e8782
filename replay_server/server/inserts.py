"""The Insert stream's work: each request decoded and stored in its turn of the insert lane, merged requests
stored exactly once in as few table calls as that allows (merged_batches.py), and acks held until the write-ahead
log has the batches (group commit). The servicer (service.py) hands it the stream and its writer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from apexrl.common.aio_grpc import Lane
from apexrl.common.errors import ApexError, UnavailableError
from apexrl.common.metrics import RpcMetrics
from apexrl.proto import replay_pb2
from apexrl.replay_server import wire
from apexrl.replay_server.core.merged_batches import MergedBatches
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.types import InsertResult
from apexrl.replay_server.server.waits import Waits
from apexrl.replay_server.server.writer_identity import Writer

if TYPE_CHECKING:
    from apexrl.replay_server.durability.wal import WriteAheadLog

log = logging.getLogger("apexrl.replay_server.server.service")  # the servicer's log


def batch_nbytes(decoded: tuple | None) -> int:
    """Bytes of a decoded insert (columns, priorities): its arrays, copied out of the request."""
    if decoded is None:
        return 0
    columns, priorities = decoded
    return sum(column.nbytes for column in columns.values()) + (
        0 if priorities is None else priorities.nbytes
    )


def held_nbytes(request: replay_pb2.InsertRequest, decoded: tuple | None) -> int:
    """What a waiting insert holds in memory: its request message (kept until it is answered) and the arrays
    decoded from it. Counting the arrays alone let waiting inserts hold 2.6x max_waiting_insert_bytes."""
    return request.ByteSize() + batch_nbytes(decoded)


class InsertPath:
    """Stores what Insert streams send (see the module docstring); one per servicer, shared by its streams."""

    def __init__(
        self,
        table: ReplayTable,
        waits: Waits,
        rpc_metrics: RpcMetrics,
        lane: Lane,
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.table = table
        self.waits = waits
        self.lane = lane
        self.wal = wal  # acks wait for it, when the shard has a write-ahead log
        self._metrics = rpc_metrics

    async def acks(
        self, request_iterator: AsyncIterator[replay_pb2.InsertRequest], writer: Writer, context
    ) -> AsyncIterator[replay_pb2.InsertAck]:
        """The acks of an Insert stream's requests, in order (each once durable, with the write-ahead log)."""
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
        items = None  # a sequence table's items (wire.decode_items)

        def attempt():
            nonlocal decoded, items
            if decoded is None:  # decoding is work too: it takes its turn in the lane
                items = wire.decode_items(request)
                decoded = wire.decode_insert(request)
            columns, priorities = decoded
            writer.check_may_fix_signature(self.table)
            return self.table.insert(
                columns,
                priorities,
                writer_id=writer.qualified(request.writer_id),
                sequence=request.sequence,
                items=items,
                trajectory=request.trajectory,
            )

        try:
            result = await self.waits.when_ready(
                attempt, context, "insert", self.lane, held_bytes=lambda: held_nbytes(request, decoded)
            )
        except ApexError as err:
            return self._rejected(request, request.sequence, err)
        if not result.duplicate:
            self.waits.notify()
        return wire.encode_ack(request.sequence, self.table.incarnation, result)

    async def _insert_merged(
        self, request: replay_pb2.InsertRequest, writer: Writer, context
    ) -> list[replay_pb2.InsertAck]:
        """Store the batches of a merged request exactly once, as if each had come alone, in order
        (merged_batches.py decides the table calls); each step takes a turn of the insert lane and waits while the
        rate limiter holds it back."""
        try:
            columns, priorities = await self.lane.run(lambda: wire.decode_insert(request))
            offsets = wire.merged_batch_offsets(request, columns, priorities)
            wire.decode_items(request)  # items are never merged: this refuses the request whole
        except ApexError as err:  # the request as a whole does not decode: every batch of it is refused
            batches = len(request.batch_rows)
            return [self._rejected(request, min(request.sequence + batches - 1, (1 << 64) - 1), err, batches)]
        merged = MergedBatches(columns, priorities, offsets, request.sequence)
        writer_id, held = writer.qualified(request.writer_id), held_nbytes(request, (columns, priorities))

        def insert(rows, raw_priorities, sequence: int) -> InsertResult:
            writer.check_may_fix_signature(self.table)
            return self.table.insert(
                rows, raw_priorities, writer_id=writer_id, sequence=sequence, trajectory=request.trajectory
            )

        acks: list[replay_pb2.InsertAck] = []
        while not merged.done:
            error = None
            try:
                await self.waits.when_ready(
                    lambda: merged.step(insert), context, "insert", self.lane, held_bytes=lambda: held
                )
            except ApexError as err:
                error = err
            for outcome in merged.settle(error):
                if isinstance(outcome.result, ApexError):
                    acks.append(self._rejected(request, outcome.last_sequence, outcome.result))
                else:
                    self._add_result(acks, outcome.last_sequence, outcome.batches, outcome.result)
        if any(not ack.error_code and ack.rows for ack in acks):
            self.waits.notify()
        return acks

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

"""The write-ahead log of a replay shard (`apexrl replay --wal DIR`): every stored insert batch is appended and
fsynced before its ack goes out, and replayed at start after the newest checkpoint, so a SIGKILL loses no
acknowledged row.

Group commit: the table hands each batch to `storing` (the log is its listener) before it stores it (under its
lock, in key order); one thread writes everything appended since its last fsync and fsyncs once, then reports the
keys durable; acks wait for that (`when_durable`). While one fsync runs the next group gathers, so the cost per batch falls as the load
rises.

Failure: once a write or fsync fails (a full disk), or an append raises, the log is failed for good: every later
append raises UnavailableError, so the table stores nothing more (nothing unlogged is ever stored, sampled or
acknowledged), acks still waiting answer UNAVAILABLE, `stats.wal_failed` is 1 and the `on_failure` callbacks run
once (the server reports NOT_SERVING). Only a restart, which replays the log, brings the shard back.

Files: segments `wal-<first key, 20 digits>.log` (mode 0600), a new one at start and after each checkpoint,
deleted once every kept checkpoint covers them. A segment is a header, then one record per batch with its CRC32
(the layout byte by byte in `wal_format.py`). Replay stops at the first torn or corrupt record of a segment (a
SIGKILL leaves at most the batches whose fsync had not ended, none acknowledged), and goes on with the next
segment if it starts right there. Segments of another lineage (a resharded shard, a wiped checkpoint directory)
are never replayed: they are renamed `*.orphan` and named in the log.

A gap is loud: when a segment starts after the rows replayed so far (a segment lost, or one that stopped early at a
corrupt record), or a record whose checksum holds cannot be replayed (it does not parse, or the table refuses it:
NaN priorities, a key that does not follow), the rows from there on are lost. Replay logs an ERROR naming the
keys, counts the gap (`stats.wal_replay_gaps`, alert ApexrlReplayWriteAheadLogGap) and keeps every later byte
aside, never replayed: the segment is cut at the bad record (its rest saved as `NAME.from-byte-N.orphan`) and the
later segments are renamed `*.orphan`, so the keys the restarted shard hands out again never meet old rows.

Not logged: priority updates (those since the last checkpoint are lost with the process) and Sample counters.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from apexrl.common.errors import ApexError, InvalidArgumentError, UnavailableError
from apexrl.common.files import PRIVATE, open_private
from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.table_state import TableListener
from apexrl.replay_server.durability.checkpoint import fsync_directory
from apexrl.replay_server.durability.durability_metrics import DurabilityStats
from apexrl.replay_server.durability.wal_format import (
    SEGMENT_NAME,
    SequencePart,
    encode_header,
    encode_record,
    parse_payload,
    read_header,
    read_payloads,
    segment_name,
)

log = logging.getLogger("apexrl.replay.wal")


class WriteAheadLog(TableListener):
    """See the module docstring. `replay(table)` at start, then `open(table)`; `truncate(key)` after each
    checkpoint; `close()` at shutdown."""

    def __init__(
        self,
        directory: str | Path,
        stats: DurabilityStats | None = None,
        *,
        sync: Callable[[int], None] = os.fsync,
    ) -> None:
        """`sync(fd)` makes a segment's written bytes durable: os.fsync; a test holds it back to show that acks
        wait for it."""
        self.directory = Path(directory)
        self._sync = sync
        self.directory.mkdir(parents=True, exist_ok=True)
        self.stats = stats if stats is not None else DurabilityStats()
        self._cond = threading.Condition()
        self._queue: list[tuple[int, bytes, int]] = []  # (end key, record, first key) not yet written
        self._waiters: list[tuple[int, Callable[[BaseException | None], None]]] = []
        self._durable = 0  # every key below this is durable
        self._error: BaseException | None = None  # why appends are refused: the failure, or closed
        self._failure: BaseException | None = None  # the failure (not set by close)
        self._on_failure: list[Callable[[BaseException], None]] = []
        self._closing = False
        self._rotate = False
        self._file: int | None = None
        self._thread: threading.Thread | None = None
        self._table: ReplayTable | None = None  # the table it listens to, once open
        self._incarnation = 0
        self._lineage = 0
        self._signature: Signature | None = None
        self._sequences = False  # whether the table's records carry sequence items (segment version 2)

    # ------------------------------------------------------------------------------------------------ replay
    def segments(self) -> list[tuple[int, Path]]:
        return sorted(
            (int(m.group(1)), p) for p in self.directory.iterdir() if (m := SEGMENT_NAME.fullmatch(p.name))
        )

    def replay(self, table: ReplayTable, restored: bool) -> int:
        """Store every logged batch past the table's keys (the restored checkpoint's, or none when `restored`
        is false: then the log of the history that began empty is replayed). Returns the rows replayed."""
        segments = []
        for first, path in self.segments():
            header = read_header(path)
            if header is None:
                log.warning("write-ahead log segment %s has no readable header; ignored", path)
                continue
            segments.append((first, path, *header))
        lineage = table.lineage if restored else next((h[2] for h in segments if h[0] == 0), table.lineage)
        replayed, gap = 0, False
        for first, path, seg_lineage, signature, sequences in segments:
            if seg_lineage != lineage:
                log.warning(
                    "write-ahead log segment %s belongs to another history (lineage %x, not %x): never "
                    "replayed, renamed %s.orphan",
                    path,
                    seg_lineage,
                    lineage,
                    path.name,
                )
                path.rename(path.with_name(path.name + ".orphan"))
                continue
            if not gap and first > table.next_key:
                self._gap(
                    f"segment {path} starts at key {first}, after key {table.next_key}: rows "
                    f"{table.next_key}..{first - 1} are lost; it and later segments are renamed *.orphan"
                )
                gap = True
            if gap:
                path.rename(path.with_name(path.name + ".orphan"))
                continue
            rows, bad = _replay_segment(table, path, signature, sequences)
            replayed += rows
            if bad is not None:
                offset, why = bad
                aside = path.with_name(f"{path.name}.from-byte-{offset}.orphan")
                _cut(path, offset, aside)
                self._gap(
                    f"{path}: the record at byte {offset} cannot be replayed ({why}): the rows from key "
                    f"{table.next_key} on are lost; the segment is cut there (the rest kept as {aside.name}) "
                    f"and later segments are renamed *.orphan"
                )
                gap = True
        table.lineage = lineage
        self.stats.wal_replayed_rows = replayed
        if replayed:
            log.info(
                "replayed %d rows from the write-ahead log (keys up to %d)", replayed, table.next_key - 1
            )
        return replayed

    def _gap(self, message: str) -> None:
        log.error("WRITE-AHEAD LOG GAP: %s", message)
        with self.stats.lock:
            self.stats.wal_replay_gaps += 1

    # ------------------------------------------------------------------------------------------------ append
    def open(self, table: ReplayTable) -> None:
        """Start logging the table's inserts in a new segment (after `replay`)."""
        self._incarnation, self._lineage = table.incarnation, table.lineage
        self._signature = table.signature
        self._sequences = bool(table.config.max_sequence_length)
        self._durable = table.next_key
        self._thread = threading.Thread(target=self._run, name="apexrl-wal", daemon=True)
        self._thread.start()
        self._table = table
        table.add_listener(self)

    def storing(
        self,
        first_key: int,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray,
        writer_id: str,
        sequence: int,
        items: ItemBatch | None = None,
        trajectory: int = 0,
    ) -> None:
        """Queue one batch the table is about to store (as its listener: called under its lock, in key order).
        UnavailableError when the log has failed or fails now (see the module docstring): then the table stores
        nothing."""
        with self._cond:
            error = self._error
        if error is None:
            try:
                part = (items, trajectory) if self._sequences else None
                record = self._record(first_key, columns, priorities, writer_id, sequence, part)
            except Exception as err:  # a batch the log cannot hold: fail closed rather than store it unlogged
                log.error(
                    "write-ahead log failed to append the batch at key %d (writer %.64r, sequence %d): %r; "
                    "inserts are refused until the shard restarts",
                    first_key,
                    writer_id,
                    sequence,
                    err,
                )
                self._fail(err)
                self._count_failure()
                raise UnavailableError(
                    f"the write-ahead log could not append this batch ({err!r}): not stored; "
                    f"inserts are refused until the shard restarts"
                ) from err
            with self._cond:
                error = self._error
                if error is None:
                    if self._signature is None:
                        self._signature = Signature.from_batch(columns)
                    self._queue.append((first_key + len(priorities), record, first_key))
                    self._cond.notify_all()
                    return
        self._count_failure()
        raise UnavailableError(
            f"the write-ahead log failed ({error}): not stored; inserts are refused until the shard restarts"
        )

    def _record(
        self,
        first_key: int,
        columns: Mapping[str, np.ndarray],
        priorities: np.ndarray,
        writer_id: str,
        sequence: int,
        sequences: SequencePart | None = None,
    ) -> bytes:
        """The batch as a log record (a seam: a test makes it fail once)."""
        return encode_record(
            first_key, columns, priorities, writer_id, sequence, self._incarnation, sequences
        )

    def _count_failure(self) -> None:
        with self.stats.lock:
            self.stats.wal_failures += 1

    def on_failure(self, callback: Callable[[BaseException], None]) -> None:
        """Call `callback(error)` once when the log fails (at once if it has failed): from the thread that found
        the failure, possibly under the table's lock, so it must neither block nor call the table."""
        with self._cond:
            failure = self._failure
            if failure is None:
                self._on_failure.append(callback)
        if failure is not None:
            callback(failure)

    @property
    def durable_key(self) -> int:
        """Every key below this is durable."""
        return self._durable

    def when_durable(self, key: int, callback: Callable[[BaseException | None], None]) -> None:
        """Call `callback(None)` once every key below `key` is durable (at once if it is), or
        `callback(error)` if the log failed. Called from the log's thread."""
        with self._cond:
            if self._durable >= key:
                error = None
            elif self._error is None:
                self._waiters.append((key, callback))
                return
            else:
                error = self._error
        callback(error)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                group, self._queue = self._queue, []
                rotate, self._rotate = self._rotate, False
            try:
                if self._file is None or rotate:
                    self._new_segment(group[0][2])
                data = b"".join(record for _, record, _ in group)
                _write_all(self._file, data)
                self._sync(self._file)
            except Exception as err:  # OSError (a full disk) or worse: never leave the waiters waiting
                log.error(
                    "write-ahead log failed (%r): the batches waiting for it are not acknowledged and inserts "
                    "are refused until the shard restarts",
                    err,
                )
                self._fail(err)
                self._count_failure()  # the failed write, however many batches it held
                return
            with self._cond:
                self._durable = group[-1][0]
                due = [cb for key, cb in self._waiters if key <= self._durable]
                self._waiters = [(key, cb) for key, cb in self._waiters if key > self._durable]
            with self.stats.lock:
                self.stats.wal_bytes += len(data)
                self.stats.wal_fsyncs += 1
                self.stats.wal_batches += len(group)
            for callback in due:
                callback(None)

    def _fail(self, error: BaseException, closing: bool = False) -> None:
        """Stop for good with `error`: answer every waiter with it and, unless the log is just being closed,
        report the failure (stats.wal_failed, the on_failure callbacks)."""
        with self._cond:
            if self._error is None:
                self._error = error
            failed_now = not closing and self._failure is None
            if failed_now:
                self._failure = error
            error = self._error
            waiters, self._waiters = self._waiters, []
            callbacks, self._on_failure = (self._on_failure, []) if failed_now else ([], self._on_failure)
        if failed_now:
            self.stats.wal_failed = 1
        for _, callback in waiters:
            callback(error)
        for callback in callbacks:
            callback(error)

    def _new_segment(self, first_key: int) -> None:
        if self._file is not None:
            os.close(self._file)
        path = self.directory / segment_name(first_key)
        if path.exists():  # a segment that replayed nothing (torn at its first record): keep it aside
            path.rename(path.with_name(path.name + ".orphan"))
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, PRIVATE)
        _write_all(self._file, encode_header(self._lineage, first_key, self._signature, self._sequences))
        self._sync(self._file)
        fsync_directory(self.directory)

    # -------------------------------------------------------------------------------------------- truncation
    def truncate(self, covered_key: int) -> None:
        """A checkpoint is durable and every kept checkpoint holds the keys below `covered_key`: start a new
        segment and delete the segments holding only keys below it."""
        with self._cond:
            self._rotate = True
        segments = self.segments()
        for (_, path), (next_first, _) in zip(segments, segments[1:], strict=False):
            if next_first <= covered_key:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Write and fsync what is queued, then stop listening to the table (close it after the server stopped:
        from then on the table is not logged)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._fail(OSError("the write-ahead log is closed"), closing=True)
        if self._table is not None:
            self._table.remove_listener(self)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replay_segment(
    table: ReplayTable, path: Path, signature: Signature, sequences: bool
) -> tuple[int, tuple[int, str] | None]:
    """Replay one segment's records into the table: the rows stored, and (byte offset, why) of a record whose
    checksum holds but which cannot be replayed (None when the segment was replayed to its end or to a torn tail)."""
    replayed = 0
    for offset, payload in read_payloads(path):
        try:
            first_key, columns, priorities, incarnation, sequence, writer, *part = parse_payload(
                payload, signature, sequences
            )
        except (ValueError, struct.error, UnicodeDecodeError, InvalidArgumentError) as err:
            return replayed, (offset, f"it does not parse: {err}")
        items, trajectory = part[0] if part else (None, 0)
        try:
            if table.insert_at(
                first_key,
                columns,
                priorities,
                writer,
                sequence,
                incarnation,
                items=items,
                trajectory=trajectory,
            ):
                replayed += len(priorities)
        except ApexError as err:
            return replayed, (offset, f"its batch at key {first_key} is refused: {err}")
    return replayed, None


def _cut(path: Path, offset: int, aside: Path) -> None:
    """Keep the bytes of `path` from `offset` on in `aside`, then cut `path` there (both durable)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        rest = f.read()
        with open_private(aside, "wb") as out:
            out.write(rest)
            out.flush()
            os.fsync(out.fileno())
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(path.parent)

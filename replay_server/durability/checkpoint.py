"""Checkpoint files of a replay shard: the writer and the reader (no table, no threads, no gRPC). The layout, byte
by byte, is in `checkpoint_format.py`; no pickle anywhere, so a file from anyone is safe to open.

A file (mode 0600) is written beside its final name, fsynced, renamed over it and the directory fsynced
(`CheckpointWriter`), so a crash leaves the previous file or the new one, never half of one under the final name.
The trailer is written last: a truncated file has none (or one whose footer CRC fails); a flipped bit fails the
CRC32 of its footer or chunk. `CheckpointReader` checks all of that and raises CorruptCheckpointError naming the
file and the fault.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from apexrl.common.compression import CompressedColumn, take_rows
from apexrl.common.errors import InvalidArgumentError
from apexrl.common.files import open_private
from apexrl.common.signature import Signature
from apexrl.replay_server.core.table_state import ITEM_FIELDS, ITEM_LENGTH, NEXT_STEP, ROW_WRITER, TableState
from apexrl.replay_server.durability.checkpoint_format import (
    FORMAT_VERSION,
    HEADER,
    HEADER_MAGIC,
    ITEM_LENGTH_DTYPE,
    LEAF_DTYPE,
    LENGTH_DTYPE,
    MAX_FOOTER_BYTES,
    NEXT_STEP_DTYPE,
    READABLE_VERSIONS,
    TRAILER,
    TRAILER_MAGIC,
    Chunk,
    format_version,
    state_from_json,
    state_to_json,
    variable_parts,
    writer_ids,
)
from apexrl.replay_server.durability.snapshot import Snapshot, chunks_holding

# Slots per chunk aim at this many bytes (about 0.2 ms of copying per critical section while a snapshot is read).
CHUNK_BYTES = 1 << 20


def chunk_rows_for(signature: Signature, bytes_per_row: float | None = None) -> int:
    """Slots per checkpoint chunk for rows of `signature`: about CHUNK_BYTES of row data, counting a compressed
    row at `bytes_per_row` (the table's stored bytes per row) rather than decompressed."""
    row_bytes = signature.row_nbytes if not signature.compressed or not bytes_per_row else bytes_per_row
    return max(1, int(CHUNK_BYTES // max(1, row_bytes)))


class CorruptCheckpointError(Exception):
    """A checkpoint file that cannot be trusted: truncated, a failed checksum, an unknown format, a footer that does
    not parse, or (raised by the checkpointer, restore_checks.py) content no table could have saved."""


def fsync_directory(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable (POSIX needs the directory itself fsynced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointWriter:
    """Writes one checkpoint file: `add_chunk` in slot order, then `finish(state)`; until then the data lives in a
    hidden temporary file beside `path`, removed if the writer is closed unfinished."""

    def __init__(self, path: str | os.PathLike, chunk_rows: int) -> None:
        self.path = Path(path)
        self.chunk_rows = chunk_rows
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        # The table's rows may be anyone's data: owner-only (0600), like the learner's checkpoints.
        self._file: BinaryIO | None = open_private(self._tmp, "wb")
        self._file.write(HEADER.pack(HEADER_MAGIC, FORMAT_VERSION, 0))
        self._offset = HEADER.size
        self._chunks: list[Chunk] = []

    def add_chunk(
        self, slot: int, columns: Mapping[str, np.ndarray | CompressedColumn], leaves: np.ndarray
    ) -> None:
        """Append the rows of slots slot .. slot + len(leaves) - 1: `columns` in the signature's order (compressed
        fields as object arrays of frames, None for a slot holding no row, or as CompressedColumns), then the row
        writers (ROW_WRITER, an object array of str) when the table has compressed fields."""
        crc, length = 0, 0
        parts = []
        for array in columns.values():
            parts += (
                variable_parts(array)
                if isinstance(array, CompressedColumn) or array.dtype == object
                else [array]
            )
        for array in (*parts, np.asarray(leaves, dtype=LEAF_DTYPE)):
            data = memoryview(array if isinstance(array, bytes) else np.ascontiguousarray(array)).cast("B")
            self._file.write(data)
            crc = zlib.crc32(data, crc)
            length += data.nbytes
        self._chunks.append(Chunk(slot, len(leaves), self._offset, length, crc))
        self._offset += length

    @property
    def bytes_written(self) -> int:
        return self._offset

    def finish(self, state: TableState) -> int:
        """Write the footer and trailer, make the file durable and give it its name; return its size in bytes."""
        version = format_version(state)
        footer = json.dumps(
            {
                "format": version,
                "chunk_rows": self.chunk_rows,
                **state_to_json(state),
                "chunks": [[c.slot, c.rows, c.offset, c.length, c.crc32] for c in self._chunks],
            },
            separators=(",", ":"),
        ).encode()
        if version != FORMAT_VERSION:
            self._file.seek(0)
            self._file.write(HEADER.pack(HEADER_MAGIC, version, 0))
            self._file.seek(self._offset)
        self._file.write(footer)
        self._file.write(TRAILER.pack(len(footer), zlib.crc32(footer), TRAILER_MAGIC))
        self._file.flush()
        os.fsync(self._file.fileno())
        size = self._file.tell()
        self._file.close()
        self._file = None
        os.replace(self._tmp, self.path)
        fsync_directory(self.path.parent)
        return size

    def close(self) -> None:
        """Discard an unfinished file."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_snapshot(path: str | os.PathLike, snapshot: Snapshot, bytes_per_second: float = 0.0) -> int:
    """Write a table snapshot as one checkpoint file (the rows are copied from the table as they are written);
    return the file's size in bytes. With `bytes_per_second` > 0 the writing is paced to that rate (sleeping
    between chunks), so the checkpoint takes a bounded share of the CPU the shard's calls need."""
    start = time.monotonic()
    with CheckpointWriter(path, snapshot.chunk_rows) as writer:
        for slot, columns, leaves in snapshot.chunks():
            writer.add_chunk(slot, columns, leaves)
            if bytes_per_second > 0:
                ahead = writer.bytes_written / bytes_per_second - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
        return writer.finish(snapshot.state)


class CheckpointReader:
    """One checkpoint file, checked as it is opened (header, trailer, footer CRC, layout) and as each chunk is
    read (its CRC). Every fault raises CorruptCheckpointError naming the file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        try:
            self.state, self.chunk_rows, self.chunks = self._open()
        except BaseException:
            self._file.close()
            raise
        self._by_slot = {c.slot: c for c in self.chunks}
        self.size_bytes = self._file_size

    def _fail(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint {self.path} is corrupt: {what}")

    def _open(self) -> tuple[TableState, int, list[Chunk]]:
        self._file_size = size = os.fstat(self._file.fileno()).st_size
        if size < HEADER.size + TRAILER.size:
            raise self._fail(f"{size} bytes, too short to be a checkpoint (truncated)")
        magic, version, _ = HEADER.unpack(self._file.read(HEADER.size))
        if magic != HEADER_MAGIC:
            raise self._fail(f"not a checkpoint file (magic {magic!r})")
        if version not in READABLE_VERSIONS:
            raise self._fail(
                f"format version {version}, this apexrl reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        self._file.seek(size - TRAILER.size)
        footer_len, footer_crc, end = TRAILER.unpack(self._file.read(TRAILER.size))
        if end != TRAILER_MAGIC:
            raise self._fail("no trailer at the end of the file (truncated or not finished)")
        footer_start = size - TRAILER.size - footer_len
        if not 0 < footer_len <= MAX_FOOTER_BYTES or footer_start < HEADER.size:
            raise self._fail(f"footer length {footer_len} does not fit in a {size}-byte file")
        self._file.seek(footer_start)
        footer = self._file.read(footer_len)
        if zlib.crc32(footer) != footer_crc:
            raise self._fail("footer CRC32 mismatch")
        try:
            meta = json.loads(footer)
            state = state_from_json(meta)
            chunk_rows = int(meta["chunk_rows"])
            chunks = [Chunk(*map(int, c)) for c in meta["chunks"]]
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            ArithmeticError,
            RecursionError,
            InvalidArgumentError,
        ) as err:  # JSON of any shape: a number too large for int(), a list for a dict
            raise self._fail(f"unreadable footer ({err!r})") from None
        self._check_layout(state, chunk_rows, chunks, footer_start)
        return state, chunk_rows, chunks

    def _check_layout(self, state: TableState, chunk_rows: int, chunks: list[Chunk], data_end: int) -> None:
        if not (
            state.capacity >= 1
            and 0 <= state.size <= state.capacity
            and state.next_key >= state.size
            and chunk_rows >= 1
        ):
            raise self._fail(
                f"impossible state (capacity {state.capacity}, size {state.size}, next key "
                f"{state.next_key}, chunk rows {chunk_rows})"
            )
        signature = state.signature
        variable = len(signature.compressed) + 1 if signature.compressed else 0  # frames and writers
        row_bytes = signature.fixed_row_nbytes + LEAF_DTYPE.itemsize
        if state.max_sequence_length:
            row_bytes += NEXT_STEP_DTYPE.itemsize + ITEM_LENGTH_DTYPE.itemsize
            variable += state.item_signature is not None  # item fields
        row_bytes += variable * LENGTH_DTYPE.itemsize
        position = HEADER.size
        for c in chunks:
            if (
                c.slot % chunk_rows
                or c.rows != min(chunk_rows, state.capacity - c.slot)
                or c.offset != position
                or (c.length != c.rows * row_bytes if not variable else c.length < c.rows * row_bytes)
            ):
                raise self._fail(f"chunk at slot {c.slot} has a wrong layout")
            position += c.length
        if position != data_end:
            raise self._fail(f"chunks end at byte {position}, the footer starts at {data_end}")
        if state.size and [c.slot // chunk_rows for c in chunks] != chunks_holding(state, chunk_rows):
            raise self._fail("the chunks do not cover the rows the state says are held")

    def read_chunk(self, chunk: Chunk) -> tuple[dict[str, np.ndarray | CompressedColumn], np.ndarray]:
        """(columns, leaves) of one chunk, its CRC checked; the arrays are read-only views of the bytes read. A
        compressed field comes as a CompressedColumn (a slot holding no row has an empty frame), and a table with
        compressed fields also gives each row's writer id (ROW_WRITER: an object array of str)."""
        self._file.seek(chunk.offset)
        data = self._file.read(chunk.length)
        if len(data) != chunk.length:
            raise self._fail(f"chunk at slot {chunk.slot} is truncated")
        if zlib.crc32(data) != chunk.crc32:
            raise self._fail(f"chunk at slot {chunk.slot}: CRC32 mismatch")
        columns, offset, rows = {}, 0, chunk.rows
        for f in self.state.signature.fields:
            if f.compression is not None:
                lengths, frames, offset = self._variable(data, offset, chunk)
                columns[f.name] = CompressedColumn(f.compression, f.dtype, f.shape, frames, lengths)
                continue
            n = rows * f.row_nbytes
            columns[f.name] = np.frombuffer(data, f.dtype, rows * math.prod(f.shape), offset).reshape(
                rows, *f.shape
            )
            offset += n
        if self.state.signature.compressed:
            lengths, ids, offset = self._variable(data, offset, chunk)
            columns[ROW_WRITER] = writer_ids(ids, lengths)
        if self.state.max_sequence_length:
            offset = self._sequence_columns(data, offset, chunk, columns)
        if offset + rows * LEAF_DTYPE.itemsize != chunk.length:
            raise self._fail(
                f"chunk at slot {chunk.slot}: its parts do not add up to its {chunk.length} bytes"
            )
        return columns, np.frombuffer(data, LEAF_DTYPE, rows, offset)

    def _sequence_columns(self, data: bytes, offset: int, chunk: Chunk, columns: dict) -> int:
        """Read a sequence table's per-slot columns into `columns`; returns the next offset."""
        rows = chunk.rows
        for name, dtype in ((NEXT_STEP, NEXT_STEP_DTYPE), (ITEM_LENGTH, ITEM_LENGTH_DTYPE)):
            if offset + rows * dtype.itemsize > len(data):
                raise self._fail(f"chunk at slot {chunk.slot}: its {name} column runs past its end")
            columns[name] = np.frombuffer(data, dtype, rows, offset)
            offset += rows * dtype.itemsize
        if self.state.item_signature is not None:
            lengths, fields, offset = self._variable(data, offset, chunk)
            ends = np.cumsum(lengths).tolist()
            items = np.full(rows, None, dtype=object)
            for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
                if end > start:
                    items[i] = fields[start:end]
            columns[ITEM_FIELDS] = items
        return offset

    def _variable(self, data: bytes, offset: int, chunk: Chunk) -> tuple[np.ndarray, bytes, int]:
        """(lengths, bytes, next offset) of a variable-length part: u32 lengths per slot, then the bytes."""
        end = offset + chunk.rows * LENGTH_DTYPE.itemsize
        if end > len(data):
            raise self._fail(f"chunk at slot {chunk.slot}: a variable-length part runs past its end")
        lengths = np.frombuffer(data, LENGTH_DTYPE, chunk.rows, offset).astype(np.int64)
        total = int(lengths.sum())
        if end + total > len(data):
            raise self._fail(f"chunk at slot {chunk.slot}: a variable-length part runs past its end")
        return lengths, data[end : end + total], end + total

    def blocks(self) -> Iterator[tuple[int, dict[str, np.ndarray], np.ndarray]]:
        """(first key, columns, leaves) of every held row in key order, oldest first (what ReplayTable.restore and
        the resharder take). Each chunk's CRC is checked as it is read."""
        state, cap = self.state, self.state.capacity
        key, cached = state.first_key, (None, None)
        while key < state.next_key:
            slot = key % cap
            start = slot - slot % self.chunk_rows
            chunk = self._by_slot.get(start)
            if chunk is None:
                raise self._fail(f"no chunk holds slot {slot}")
            if cached[0] is not chunk:
                cached = (chunk, self.read_chunk(chunk))
            columns, leaves = cached[1]
            a = slot - start
            b = min(chunk.rows, a + state.next_key - key)
            yield key, {name: take_rows(col, slice(a, b)) for name, col in columns.items()}, leaves[a:b]
            key += b - a

    def verify(self) -> None:
        """Read every chunk and check its CRC."""
        for chunk in self.chunks:
            self.read_chunk(chunk)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

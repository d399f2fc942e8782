"""Checkpoint files of a replay shard: the format, its writer and its reader (no table, no threads, no gRPC).

Layout of one file (integers little endian; no pickle anywhere, so a file from anyone is safe to open):

    header    16 bytes   b"APEXRLCK", u32 format version (1; 2 when the table has compressed fields), u32 0
    chunks    for each chunk of slots holding rows, in slot order: the chunk's rows of every column (signature
              order, C order, the field's dtype; a compressed field as u32 frame lengths, one per slot, then the
              frames back to back, a slot that holds no row having a frame of 0 bytes), then, in a table with
              compressed fields, each row's writer id (u32 lengths, then the UTF-8 ids back to back), then the
              chunk's sum-tree leaves (float64, priority ** alpha)
    footer    UTF-8 JSON: the table state (signature, capacity, alpha, keys, incarnation and aliases, the writers'
              de-duplication table, counters) and, per chunk, its first slot, rows, offset, length and CRC32
    trailer   24 bytes   u64 footer length, u32 CRC32 of the footer, 4 zero bytes, b"APXRLEND"

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
import struct
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from apexrl.common.compression import CompressedColumn, take_rows
from apexrl.common.errors import InvalidArgumentError
from apexrl.common.files import open_private
from apexrl.common.signature import Signature
from apexrl.replay_server.durability.snapshot import ROW_WRITER, Snapshot, TableState, chunks_holding

FORMAT_VERSION = 1
# Files of tables with compressed fields (and so row writers) say 2, so an apexrl that cannot read them says why;
# the files of other tables are the same as before, version 1, readable by earlier apexrl versions too.
COMPRESSED_FORMAT_VERSION = 2
_READABLE_VERSIONS = (FORMAT_VERSION, COMPRESSED_FORMAT_VERSION)
_LENGTH_DTYPE = np.dtype("<u4")
_HEADER = struct.Struct("<8sII")
_HEADER_MAGIC = b"APEXRLCK"
_TRAILER = struct.Struct("<QI4x8s")
_TRAILER_MAGIC = b"APXRLEND"
_LEAF_DTYPE = np.dtype("<f8")
# Largest footer accepted: the writers' table dominates it (100,000 writers of ~60 bytes each by default).
_MAX_FOOTER_BYTES = 1 << 30
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


@dataclass(frozen=True)
class Chunk:
    """Where one chunk of slots lies in the file."""

    slot: int  # first slot
    rows: int
    offset: int
    length: int
    crc32: int


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
        self._file.write(_HEADER.pack(_HEADER_MAGIC, FORMAT_VERSION, 0))
        self._offset = _HEADER.size
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
                _variable_parts(array)
                if isinstance(array, CompressedColumn) or array.dtype == object
                else [array]
            )
        for array in (*parts, np.asarray(leaves, dtype=_LEAF_DTYPE)):
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
        version = COMPRESSED_FORMAT_VERSION if state.signature.compressed else FORMAT_VERSION
        footer = json.dumps(
            {
                "format": version,
                "chunk_rows": self.chunk_rows,
                **_state_to_json(state),
                "chunks": [[c.slot, c.rows, c.offset, c.length, c.crc32] for c in self._chunks],
            },
            separators=(",", ":"),
        ).encode()
        if version != FORMAT_VERSION:
            self._file.seek(0)
            self._file.write(_HEADER.pack(_HEADER_MAGIC, version, 0))
            self._file.seek(self._offset)
        self._file.write(footer)
        self._file.write(_TRAILER.pack(len(footer), zlib.crc32(footer), _TRAILER_MAGIC))
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
        if size < _HEADER.size + _TRAILER.size:
            raise self._fail(f"{size} bytes, too short to be a checkpoint (truncated)")
        magic, version, _ = _HEADER.unpack(self._file.read(_HEADER.size))
        if magic != _HEADER_MAGIC:
            raise self._fail(f"not a checkpoint file (magic {magic!r})")
        if version not in _READABLE_VERSIONS:
            raise self._fail(
                f"format version {version}, this apexrl reads versions "
                f"{', '.join(map(str, _READABLE_VERSIONS))}"
            )
        self._file.seek(size - _TRAILER.size)
        footer_len, footer_crc, end = _TRAILER.unpack(self._file.read(_TRAILER.size))
        if end != _TRAILER_MAGIC:
            raise self._fail("no trailer at the end of the file (truncated or not finished)")
        footer_start = size - _TRAILER.size - footer_len
        if not 0 < footer_len <= _MAX_FOOTER_BYTES or footer_start < _HEADER.size:
            raise self._fail(f"footer length {footer_len} does not fit in a {size}-byte file")
        self._file.seek(footer_start)
        footer = self._file.read(footer_len)
        if zlib.crc32(footer) != footer_crc:
            raise self._fail("footer CRC32 mismatch")
        try:
            meta = json.loads(footer)
            state = _state_from_json(meta)
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
        row_bytes = signature.fixed_row_nbytes + variable * _LENGTH_DTYPE.itemsize + _LEAF_DTYPE.itemsize
        position = _HEADER.size
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
            columns[ROW_WRITER] = _writer_ids(ids, lengths)
        if offset + rows * _LEAF_DTYPE.itemsize != chunk.length:
            raise self._fail(
                f"chunk at slot {chunk.slot}: its parts do not add up to its {chunk.length} bytes"
            )
        return columns, np.frombuffer(data, _LEAF_DTYPE, rows, offset)

    def _variable(self, data: bytes, offset: int, chunk: Chunk) -> tuple[np.ndarray, bytes, int]:
        """(lengths, bytes, next offset) of a variable-length part: u32 lengths per slot, then the bytes."""
        end = offset + chunk.rows * _LENGTH_DTYPE.itemsize
        if end > len(data):
            raise self._fail(f"chunk at slot {chunk.slot}: a variable-length part runs past its end")
        lengths = np.frombuffer(data, _LENGTH_DTYPE, chunk.rows, offset).astype(np.int64)
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


def _state_to_json(state: TableState) -> dict:
    return {
        "signature": str(state.signature),
        "capacity": state.capacity,
        "alpha": state.alpha,
        "next_key": state.next_key,
        "size": state.size,
        "max_priority": state.max_priority,
        "incarnation": state.incarnation,
        "aliases": [[k, v] for k, v in state.aliases.items()],
        "writers": [[w, s] for w, s in state.writers],
        "counters": dict(state.counters),
        "lineage": state.lineage,
    }


def _state_from_json(meta: dict) -> TableState:
    return TableState(
        signature=Signature.parse(meta["signature"]),
        capacity=int(meta["capacity"]),
        alpha=float(meta["alpha"]),
        next_key=int(meta["next_key"]),
        size=int(meta["size"]),
        max_priority=float(meta["max_priority"]),
        incarnation=int(meta["incarnation"]),
        aliases={int(k): int(v) for k, v in meta["aliases"]},
        writers=tuple((str(w), int(s)) for w, s in meta["writers"]),
        counters={str(k): int(v) for k, v in meta["counters"].items()},
        lineage=int(meta["lineage"]),
    )


def _variable_parts(column: np.ndarray | CompressedColumn) -> list[bytes]:
    """The two parts of a variable-length column in a chunk: u32 lengths, then the items back to back. From a
    CompressedColumn, or an object array of bytes (frames; None: no row) or str (writer ids)."""
    if isinstance(column, CompressedColumn):
        return [column.lengths.astype(_LENGTH_DTYPE).tobytes(), column.data]
    items = [
        b"" if item is None else item.encode() if isinstance(item, str) else item for item in column.tolist()
    ]
    return [np.fromiter(map(len, items), dtype=_LENGTH_DTYPE, count=len(items)).tobytes(), b"".join(items)]


def _writer_ids(data: bytes, lengths: np.ndarray) -> np.ndarray:
    """An object array of the writer ids (rows of one batch share one str object)."""
    ids = np.empty(len(lengths), dtype=object)
    known: dict[bytes, str] = {}
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    for i in range(len(lengths)):
        raw = data[offsets[i] : offsets[i + 1]]
        text = known.get(raw)
        if text is None:
            text = known[raw] = raw.decode(errors="replace")
        ids[i] = text
    return ids

"""Checkpoint files of a replay shard: the format, its writer and its reader (no table, no threads, no gRPC).

Layout of one file (integers little endian; no pickle anywhere, so a file from anyone is safe to open):

    header    16 bytes   b"APEXRLCK", u32 format version (1), u32 0
    chunks    for each chunk of slots holding rows, in slot order: the chunk's rows of every column (signature
              order, C order, the field's dtype), then the chunk's sum-tree leaves (float64, priority ** alpha)
    footer    UTF-8 JSON: the table state (signature, capacity, alpha, keys, incarnation and aliases, the writers'
              de-duplication table, counters) and, per chunk, its first slot, rows, offset, length and CRC32
    trailer   24 bytes   u64 footer length, u32 CRC32 of the footer, 4 zero bytes, b"APXRLEND"

A file is written beside its final name, fsynced, renamed over it and the directory fsynced (`CheckpointWriter`),
so a crash leaves the previous file or the new one, never half of one under the final name. The trailer is written
last: a truncated file has none (or one whose footer CRC fails); a flipped bit fails the CRC32 of its footer or
chunk. `CheckpointReader` checks all of that and raises CorruptCheckpointError naming the file and the fault.
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

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.snapshot import Snapshot, TableState, chunks_holding

FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")
_HEADER_MAGIC = b"APEXRLCK"
_TRAILER = struct.Struct("<QI4x8s")
_TRAILER_MAGIC = b"APXRLEND"
_LEAF_DTYPE = np.dtype("<f8")
# Largest footer accepted: the writers' table dominates it (100,000 writers of ~60 bytes each by default).
_MAX_FOOTER_BYTES = 1 << 30


class CorruptCheckpointError(Exception):
    """A checkpoint file that cannot be trusted: truncated, a failed checksum, an unknown format."""


@dataclass(frozen=True)
class Chunk:
    """Where one chunk of slots lies in the file."""

    slot: int      # first slot
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
        self._file: BinaryIO | None = open(self._tmp, "wb")  # noqa: SIM115 (closed by finish or close)
        self._file.write(_HEADER.pack(_HEADER_MAGIC, FORMAT_VERSION, 0))
        self._offset = _HEADER.size
        self._chunks: list[Chunk] = []

    def add_chunk(self, slot: int, columns: Mapping[str, np.ndarray], leaves: np.ndarray) -> None:
        """Append the rows of slots slot .. slot + len(leaves) - 1: `columns` in the signature's order."""
        crc, length = 0, 0
        for array in (*columns.values(), np.asarray(leaves, dtype=_LEAF_DTYPE)):
            data = memoryview(np.ascontiguousarray(array)).cast("B")
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
        footer = json.dumps({"format": FORMAT_VERSION, "chunk_rows": self.chunk_rows, **_state_to_json(state),
                             "chunks": [[c.slot, c.rows, c.offset, c.length, c.crc32] for c in self._chunks]},
                            separators=(",", ":")).encode()
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
        if version != FORMAT_VERSION:
            raise self._fail(f"format version {version}, this apexrl reads version {FORMAT_VERSION}")
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
        except (ValueError, KeyError, TypeError, InvalidArgumentError) as err:
            raise self._fail(f"unreadable footer ({err})") from None
        self._check_layout(state, chunk_rows, chunks, footer_start)
        return state, chunk_rows, chunks

    def _check_layout(self, state: TableState, chunk_rows: int, chunks: list[Chunk], data_end: int) -> None:
        if not (state.capacity >= 1 and 0 <= state.size <= state.capacity and state.next_key >= state.size
                and chunk_rows >= 1):
            raise self._fail(f"impossible state (capacity {state.capacity}, size {state.size}, next key "
                             f"{state.next_key}, chunk rows {chunk_rows})")
        row_bytes = state.signature.row_nbytes + _LEAF_DTYPE.itemsize
        position = _HEADER.size
        for c in chunks:
            if (c.slot % chunk_rows or c.rows != min(chunk_rows, state.capacity - c.slot) or c.offset != position
                    or c.length != c.rows * row_bytes):
                raise self._fail(f"chunk at slot {c.slot} has a wrong layout")
            position += c.length
        if position != data_end:
            raise self._fail(f"chunks end at byte {position}, the footer starts at {data_end}")
        if state.size and [c.slot // chunk_rows for c in chunks] != chunks_holding(state, chunk_rows):
            raise self._fail("the chunks do not cover the rows the state says are held")

    def read_chunk(self, chunk: Chunk) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(columns, leaves) of one chunk, its CRC checked; the arrays are read-only views of the bytes read."""
        self._file.seek(chunk.offset)
        data = self._file.read(chunk.length)
        if len(data) != chunk.length:
            raise self._fail(f"chunk at slot {chunk.slot} is truncated")
        if zlib.crc32(data) != chunk.crc32:
            raise self._fail(f"chunk at slot {chunk.slot}: CRC32 mismatch")
        columns, offset = {}, 0
        for f in self.state.signature.fields:
            n = chunk.rows * f.row_nbytes
            columns[f.name] = np.frombuffer(data, f.dtype, chunk.rows * math.prod(f.shape), offset).reshape(
                chunk.rows, *f.shape)
            offset += n
        return columns, np.frombuffer(data, _LEAF_DTYPE, chunk.rows, offset)

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
            yield key, {name: col[a:b] for name, col in columns.items()}, leaves[a:b]
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
        "signature": str(state.signature), "capacity": state.capacity, "alpha": state.alpha,
        "next_key": state.next_key, "size": state.size, "max_priority": state.max_priority,
        "incarnation": state.incarnation, "aliases": [[k, v] for k, v in state.aliases.items()],
        "writers": [[w, s] for w, s in state.writers], "counters": dict(state.counters), "lineage": state.lineage,
    }


def _state_from_json(meta: dict) -> TableState:
    return TableState(
        signature=Signature.parse(meta["signature"]), capacity=int(meta["capacity"]), alpha=float(meta["alpha"]),
        next_key=int(meta["next_key"]), size=int(meta["size"]), max_priority=float(meta["max_priority"]),
        incarnation=int(meta["incarnation"]), aliases={int(k): int(v) for k, v in meta["aliases"]},
        writers=tuple((str(w), int(s)) for w, s in meta["writers"]),
        counters={str(k): int(v) for k, v in meta["counters"].items()}, lineage=int(meta["lineage"]),
    )

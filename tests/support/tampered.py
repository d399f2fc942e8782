"""Shard files whose checksums are right but whose content is not: a checkpoint rewritten with other leaves or
another footer state, every CRC32 recomputed, as a bug or a hostile peer could leave them. The restore must treat
them as it treats corrupt files (tests of replay_server/durability/checkpointer.py and wal.py)."""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from apexrl.replay_server.core.table_state import TableState
from apexrl.replay_server.durability.checkpoint import CheckpointReader, CheckpointWriter
from apexrl.replay_server.durability.wal_format import PAYLOAD, RECORD, SEGMENT


def rewrite_checkpoint(
    path: str | os.PathLike, *, leaves: Callable[[np.ndarray], np.ndarray] | None = None, **state_changes
) -> None:
    """Rewrite the checkpoint at `path` in place with `leaves(all leaves of a chunk)` instead of its leaves and
    `state_changes` applied to its footer state (TableState fields), through the real writer: the file is
    well formed and every checksum holds."""
    path = Path(path)
    with CheckpointReader(path) as reader:
        chunks = [(c.slot, *reader.read_chunk(c)) for c in reader.chunks]
        state: TableState = dataclasses.replace(reader.state, **state_changes)
        chunk_rows = reader.chunk_rows
    with CheckpointWriter(path, chunk_rows) as writer:
        for slot, columns, chunk_leaves in chunks:
            new = (
                chunk_leaves.copy()
                if leaves is None
                else np.asarray(leaves(chunk_leaves.copy()), dtype=np.float64)
            )
            writer.add_chunk(slot, columns, new)
        writer.finish(state)


def wal_records(path: str | os.PathLike) -> list[tuple[int, int, bytes]]:
    """(offset, length, payload) of every record of a write-ahead-log segment (its format in replay_server/durability/wal_format.py)."""
    data = Path(path).read_bytes()
    offset = (
        SEGMENT.size + struct.unpack_from("<I", data, SEGMENT.size - 4)[0]
    )  # the header, then its signature
    records = []
    while offset + RECORD.size <= len(data):
        length, _ = RECORD.unpack_from(data, offset)
        records.append((offset, length, data[offset + RECORD.size : offset + RECORD.size + length]))
        offset += RECORD.size + length
    return records


def rewrite_wal_record(path: str | os.PathLike, index: int, change: Callable[[bytes], bytes]) -> None:
    """Replace record `index` of a segment by `change(its payload)`, with a matching length and CRC32."""
    path = Path(path)
    data = path.read_bytes()
    offset, length, payload = wal_records(path)[index]
    new = change(payload)
    path.write_bytes(
        data[:offset] + RECORD.pack(len(new), zlib.crc32(new)) + new + data[offset + RECORD.size + length :]
    )


def with_priority(payload: bytes, value: float, row: int = 0) -> bytes:
    """A record's payload with row `row`'s raw priority replaced by `value` (NaN, say)."""
    writer_len = PAYLOAD.unpack_from(payload)[-1]
    at = PAYLOAD.size + writer_len + 8 * row
    return payload[:at] + struct.pack("<d", value) + payload[at + 8 :]

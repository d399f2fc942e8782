"""The replay checkpoint's file format, byte by byte, apart from the writer and reader that do the file work, so
the layout, its constants and its footer's JSON can be read (and checked against a file) in one place.

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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from apexrl.common.compression import CompressedColumn
from apexrl.common.signature import Signature
from apexrl.replay_server.core.table_state import TableState

FORMAT_VERSION = 1
# Files of tables with compressed fields (and so row writers) say 2, so an apexrl that cannot read them says why;
# the files of other tables are the same as before, version 1, readable by earlier apexrl versions too.
COMPRESSED_FORMAT_VERSION = 2
READABLE_VERSIONS = (FORMAT_VERSION, COMPRESSED_FORMAT_VERSION)
LENGTH_DTYPE = np.dtype("<u4")
HEADER = struct.Struct("<8sII")
HEADER_MAGIC = b"APEXRLCK"
TRAILER = struct.Struct("<QI4x8s")
TRAILER_MAGIC = b"APXRLEND"
LEAF_DTYPE = np.dtype("<f8")
# Largest footer accepted: the writers' table dominates it (100,000 writers of ~60 bytes each by default).
MAX_FOOTER_BYTES = 1 << 30


@dataclass(frozen=True)
class Chunk:
    """Where one chunk of slots lies in the file."""

    slot: int  # first slot
    rows: int
    offset: int
    length: int
    crc32: int


def state_to_json(state: TableState) -> dict:
    """The footer's table state, as JSON-ready values."""
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


def state_from_json(meta: dict) -> TableState:
    """The table state of a parsed footer; raises (KeyError, ValueError, ...) on JSON of the wrong shape."""
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


def variable_parts(column: np.ndarray | CompressedColumn) -> list[bytes]:
    """The two parts of a variable-length column in a chunk: u32 lengths, then the items back to back. From a
    CompressedColumn, or an object array of bytes (frames; None: no row) or str (writer ids)."""
    if isinstance(column, CompressedColumn):
        return [column.lengths.astype(LENGTH_DTYPE).tobytes(), column.data]
    items = [
        b"" if item is None else item.encode() if isinstance(item, str) else item for item in column.tolist()
    ]
    return [np.fromiter(map(len, items), dtype=LENGTH_DTYPE, count=len(items)).tobytes(), b"".join(items)]


def writer_ids(data: bytes, lengths: np.ndarray) -> np.ndarray:
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

"""The replay checkpoint's file format, byte by byte, apart from the writer and reader that do the file work, so
the layout, its constants and its footer's JSON can be read (and checked against a file) in one place.

Layout of one file (integers little endian; no pickle anywhere, so a file from anyone is safe to open):

    header    16 bytes   b"APEXRLCK", u32 format version (1; 2 when the table has compressed fields; 3 for a
              sequence table), u32 0
    chunks    for each chunk of slots holding rows, in slot order: the chunk's rows of every column (signature
              order, C order, the field's dtype; a compressed field as u32 frame lengths, one per slot, then the
              frames back to back, a slot that holds no row having a frame of 0 bytes), then, in a table with
              compressed fields, each row's writer id (u32 lengths, then the UTF-8 ids back to back), in a sequence
              table each slot's link to its trajectory's next step (i32 key distance), its item's length (u16, 0:
              none) and, when items have fields, its item's fields (u32 lengths, then the fields' raw bytes back to
              back, 0 bytes where no item starts), then the chunk's sum-tree leaves (float64, priority ** alpha)
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
# Sequence tables' files say 3: their chunks hold per-slot sequence columns an older apexrl would misread.
SEQUENCE_FORMAT_VERSION = 3
READABLE_VERSIONS = (FORMAT_VERSION, COMPRESSED_FORMAT_VERSION, SEQUENCE_FORMAT_VERSION)
NEXT_STEP_DTYPE = np.dtype("<i4")
ITEM_LENGTH_DTYPE = np.dtype("<u2")
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
    """The footer's table state, as JSON-ready values (a sequence table's fields only for one)."""
    sequences = {}
    if state.max_sequence_length:
        sequences = {
            "max_sequence_length": state.max_sequence_length,
            "item_signature": None if state.item_signature is None else str(state.item_signature),
            "tails": [[w, t, list(keys)] for w, t, keys in state.tails],
        }
    return {
        **sequences,
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
        max_sequence_length=int(meta.get("max_sequence_length", 0)),
        item_signature=None
        if meta.get("item_signature") is None
        else Signature.parse(meta["item_signature"]),
        tails=tuple((str(w), int(t), tuple(int(k) for k in keys)) for w, t, keys in meta.get("tails", ())),
    )


def format_version(state: TableState) -> int:
    """The version a checkpoint of this table says it is (the oldest that reads it)."""
    if state.max_sequence_length:
        return SEQUENCE_FORMAT_VERSION
    return COMPRESSED_FORMAT_VERSION if state.signature.compressed else FORMAT_VERSION


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

"""The write-ahead log's file format, byte by byte, apart from the thread that writes it and the replay that
trusts it, so a reader (or a test that tampers with a segment) finds the layout in one place.

A segment `wal-<first key, 20 digits>.log` starts with a header: magic, version, 0, lineage, first key, the
signature's length, then the signature's text. Records follow: u32 payload length, u32 CRC32 of the payload, then
the payload = first key, rows, incarnation, sequence, writer id length, the writer id, the raw priorities
(float64), then each column's bytes in signature order (a compressed field: u32 frame lengths, one per row, then
the frames back to back). All little endian.

A sequence table's segments say version 2, and each record goes on after its columns with the batch's trajectory
(u64) and its items: their count (u32), ends and lengths (u32 each), priorities (float64), then, when they have
fields, the item signature's length (u16) and text and the fields' bytes ([items, ...] per field, in signature
order).
"""

from __future__ import annotations

import logging
import math
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from apexrl.common.compression import CompressedColumn
from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_batch import ItemBatch

log = logging.getLogger("apexrl.replay.wal")

MAGIC = b"APXRLWAL"
VERSION = 1
SEQUENCE_VERSION = 2
SEQUENCE_PART = struct.Struct("<QI")  # trajectory, items
SEGMENT = struct.Struct("<8sIIQQI")  # magic, version, 0, lineage, first key, signature length
RECORD = struct.Struct("<II")  # payload length, CRC32
PAYLOAD = struct.Struct("<QIQQH")  # first key, rows, incarnation, sequence, writer id length
SEGMENT_NAME = re.compile(r"wal-(\d{20})\.log")
LENGTH_DTYPE = np.dtype("<u4")

# (first key, columns, priorities, incarnation, sequence, writer id) of one logged batch.
Record = tuple[int, dict[str, np.ndarray | CompressedColumn], np.ndarray, int, int, str]


def segment_name(first_key: int) -> str:
    """The file name of the segment whose first record starts at `first_key`."""
    return f"wal-{first_key:020d}.log"


def encode_header(
    lineage: int, first_key: int, signature: Signature | None, sequences: bool = False
) -> bytes:
    """A segment's header, signature included (version 2 for a sequence table's segment)."""
    text = str(signature).encode()
    version = SEQUENCE_VERSION if sequences else VERSION
    return SEGMENT.pack(MAGIC, version, 0, lineage, first_key, len(text)) + text


def read_header(path: Path) -> tuple[int, Signature, bool] | None:
    """(lineage, signature, whether its records hold sequence items) of a segment; None when its header is
    unreadable or of another format."""
    try:
        with open(path, "rb") as f:
            magic, version, _, lineage, _, length = SEGMENT.unpack(f.read(SEGMENT.size))
            if magic != MAGIC or version not in (VERSION, SEQUENCE_VERSION):
                return None
            return lineage, Signature.parse(f.read(length).decode()), version == SEQUENCE_VERSION
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


def encode_record(
    first_key: int,
    columns: Mapping[str, np.ndarray],
    priorities: np.ndarray,
    writer_id: str,
    sequence: int,
    incarnation: int,
    sequences: SequencePart | None = None,
) -> bytes:
    """One batch as a whole record: length, CRC32, payload (with a sequence table's part when `sequences` is
    given). struct.error for a batch the format cannot hold (a writer id over 65,535 bytes, say)."""
    writer = writer_id.encode()
    rows = len(priorities)
    parts = [
        PAYLOAD.pack(first_key, rows, incarnation, sequence, len(writer)),
        writer,
        np.ascontiguousarray(priorities, dtype="<f8").tobytes(),
    ]
    for column in columns.values():
        if isinstance(column, CompressedColumn):
            parts += [column.lengths.astype(LENGTH_DTYPE).tobytes(), column.data]
        else:
            parts.append(np.ascontiguousarray(column).tobytes())
    if sequences is not None:
        parts += encode_sequence_part(*sequences)
    payload = b"".join(parts)
    return RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def read_payloads(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, payload) of every whole record of a segment whose checksum holds; stops at the first torn or
    corrupt one, naming it in the log."""
    with open(path, "rb") as f:
        data = f.read()
    offset = SEGMENT.size + struct.unpack_from("<I", data, SEGMENT.size - 4)[0]
    while offset < len(data):
        if offset + RECORD.size > len(data):
            log.warning(
                "write-ahead log %s ends in a torn record at byte %d (never acknowledged)", path, offset
            )
            return
        length, crc = RECORD.unpack_from(data, offset)
        payload = data[offset + RECORD.size : offset + RECORD.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            log.warning(
                "write-ahead log %s: torn or corrupt record at byte %d; replay of this segment stops there",
                path,
                offset,
            )
            return
        yield offset, payload
        offset += RECORD.size + length


def parse_payload(payload: bytes, signature: Signature, sequences: bool = False) -> Record:
    """(first key, columns, priorities, incarnation, sequence, writer id) of one record's payload, and with
    `sequences` (a version 2 segment) its (items or None, trajectory); ValueError (or struct.error,
    UnicodeDecodeError) when its parts do not add up to exactly its bytes."""
    first_key, rows, incarnation, sequence, writer_len = PAYLOAD.unpack_from(payload)
    at = PAYLOAD.size
    writer = payload[at : at + writer_len].decode()
    at += writer_len
    priorities = np.frombuffer(payload, "<f8", rows, at)
    at += 8 * rows
    columns: dict[str, np.ndarray | CompressedColumn] = {}
    for field in signature.fields:
        if field.compression is not None:
            lengths = np.frombuffer(payload, LENGTH_DTYPE, rows, at).astype(np.int64)
            at += rows * LENGTH_DTYPE.itemsize
            n = int(lengths.sum())
            columns[field.name] = CompressedColumn(
                field.compression, field.dtype, field.shape, payload[at : at + n], lengths
            )
            at += n
            continue
        n = rows * field.row_nbytes
        columns[field.name] = np.frombuffer(payload, field.dtype, rows * math.prod(field.shape), at).reshape(
            rows, *field.shape
        )
        at += n
    part = None
    if sequences:
        part, at = parse_sequence_part(payload, at)
    if at != len(payload):
        raise ValueError(f"its parts end at byte {at} of its {len(payload)}")
    record = (first_key, columns, priorities, incarnation, sequence, writer)
    return record if part is None else (*record, part)


# (items or None, trajectory) of a sequence table's record.
SequencePart = tuple[ItemBatch | None, int]


def encode_sequence_part(items: ItemBatch | None, trajectory: int) -> list[bytes]:
    count = 0 if items is None else len(items)
    parts = [SEQUENCE_PART.pack(trajectory, count)]
    if not count:
        return parts
    parts += [
        np.asarray(items.ends, dtype=LENGTH_DTYPE).tobytes(),
        np.asarray(items.lengths, dtype=LENGTH_DTYPE).tobytes(),
        np.asarray(items.priorities, dtype="<f8").tobytes(),
    ]
    text = str(Signature.from_batch(items.columns)).encode() if items.columns else b""
    parts += [struct.pack("<H", len(text)), text]
    parts += [np.ascontiguousarray(column).tobytes() for column in items.columns.values()]
    return parts


def parse_sequence_part(payload: bytes, at: int) -> tuple[SequencePart, int]:
    trajectory, count = SEQUENCE_PART.unpack_from(payload, at)
    at += SEQUENCE_PART.size
    if not count:
        return (None, trajectory), at
    ends = np.frombuffer(payload, LENGTH_DTYPE, count, at).astype(np.int64)
    lengths = np.frombuffer(payload, LENGTH_DTYPE, count, at + 4 * count).astype(np.int64)
    priorities = np.frombuffer(payload, "<f8", count, at + 8 * count)
    at += 16 * count
    (length,) = struct.unpack_from("<H", payload, at)
    text = payload[at + 2 : at + 2 + length].decode()
    at += 2 + length
    columns = {}
    for field in Signature.parse(text).fields if text else ():
        n = count * field.row_nbytes
        columns[field.name] = np.frombuffer(payload, field.dtype, count * math.prod(field.shape), at).reshape(
            count, *field.shape
        )
        at += n
    return (ItemBatch(ends, lengths, columns, priorities), trajectory), at

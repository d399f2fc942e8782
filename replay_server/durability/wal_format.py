"""The write-ahead log's file format, byte by byte, apart from the thread that writes it and the replay that
trusts it, so a reader (or a test that tampers with a segment) finds the layout in one place.

A segment `wal-<first key, 20 digits>.log` starts with a header: magic, version, 0, lineage, first key, the
signature's length, then the signature's text. Records follow: u32 payload length, u32 CRC32 of the payload, then
the payload = first key, rows, incarnation, sequence, writer id length, the writer id, the raw priorities
(float64), then each column's bytes in signature order (a compressed field: u32 frame lengths, one per row, then
the frames back to back). All little endian.
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

log = logging.getLogger("apexrl.replay.wal")

MAGIC = b"APXRLWAL"
VERSION = 1
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


def encode_header(lineage: int, first_key: int, signature: Signature | None) -> bytes:
    """A segment's header, signature included."""
    text = str(signature).encode()
    return SEGMENT.pack(MAGIC, VERSION, 0, lineage, first_key, len(text)) + text


def read_header(path: Path) -> tuple[int, Signature] | None:
    """(lineage, signature) of a segment; None when its header is unreadable or of another format."""
    try:
        with open(path, "rb") as f:
            magic, version, _, lineage, _, length = SEGMENT.unpack(f.read(SEGMENT.size))
            if magic != MAGIC or version != VERSION:
                return None
            return lineage, Signature.parse(f.read(length).decode())
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


def encode_record(
    first_key: int,
    columns: Mapping[str, np.ndarray],
    priorities: np.ndarray,
    writer_id: str,
    sequence: int,
    incarnation: int,
) -> bytes:
    """One batch as a whole record: length, CRC32, payload. struct.error for a batch the format cannot hold (a
    writer id over 65,535 bytes, say)."""
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


def parse_payload(payload: bytes, signature: Signature) -> Record:
    """(first key, columns, priorities, incarnation, sequence, writer id) of one record's payload; ValueError (or
    struct.error, UnicodeDecodeError) when its parts do not add up to exactly its bytes."""
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
    if at != len(payload):
        raise ValueError(f"its parts end at byte {at} of its {len(payload)}")
    return first_key, columns, priorities, incarnation, sequence, writer

"""Compressed columns: rows of one field, each compressed on its own (one zstd or LZ4 frame per row).

An image column is compressed by the writer (the actor), travels and is stored as these frames (the replay shard
never decompresses or recompresses: it checks each frame's length and magic number only) and is decompressed in
the learner's data path. A `CompressedColumn` is what the SDK, the wire codec and the table hold for such a column;
it knows its logical per-row dtype and shape (what the frames decompress to) and supports what the data path does
with columns: length, gathering rows, concatenating.

Frames: ZSTD is a Zstandard frame (RFC 8878), LZ4 an LZ4 frame (the LZ4 frame format, not a raw block); each
decompresses to exactly one row's bytes (C order, little endian). Importing this module imports numpy only; the
`zstandard` and `lz4` packages (the `compression` extra) are imported by the functions that compress or
decompress, so a replay shard needs neither.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Compression names as written in signatures (`obs:uint8[4,84,84]@zstd`), and each frame format's magic number.
ZSTD, LZ4 = "zstd", "lz4"
COMPRESSIONS: tuple[str, ...] = (ZSTD, LZ4)
MAGIC: dict[str, bytes] = {ZSTD: b"\x28\xb5\x2f\xfd", LZ4: b"\x04\x22\x4d\x18"}
DEFAULT_LEVEL = {ZSTD: 3, LZ4: 0}


def max_frame_nbytes(row_nbytes: int) -> int:
    """The largest frame accepted for a row of `row_nbytes` raw bytes: above both codecs' worst case for
    incompressible data (zstd: n + n/256 + 64 bytes; LZ4 frames: n + n/255 + 27 bytes)."""
    return row_nbytes + row_nbytes // 128 + 1024


@dataclass(frozen=True, eq=False)
class CompressedColumn:
    """`len(lengths)` rows of one field: row i is the frame `data[offsets[i]:offsets[i + 1]]`, which decompresses
    (with `compression`) to one row of `dtype` and `shape`. Immutable; gathering and slicing copy frames.

    Deliberately not array-like (no `__getitem__`, no `__array__`): numpy must never mistake frames for rows.
    `take_rows` and `concatenate` work on it and on arrays alike."""

    compression: str
    dtype: np.dtype
    shape: tuple[int, ...]  # per-row logical shape (the batch dimension excluded)
    data: bytes  # the frames back to back
    lengths: np.ndarray  # int64 [rows]: each frame's byte length
    offsets: np.ndarray = field(init=False, repr=False)  # int64 [rows + 1]

    def __post_init__(self) -> None:
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        object.__setattr__(self, "offsets", offsets)
        if offsets[-1] != len(self.data):
            raise ValueError(f"frame lengths sum to {int(offsets[-1])}, data holds {len(self.data)} bytes")

    # --- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_frames(
        cls, compression: str, dtype: np.dtype, shape: tuple[int, ...], frames: Sequence[bytes]
    ) -> CompressedColumn:
        """A column of the given frames (bytes objects, one per row)."""
        lengths = np.fromiter(map(len, frames), dtype=np.int64, count=len(frames))
        return cls(compression, np.dtype(dtype), tuple(shape), b"".join(frames), lengths)

    # --- what the data path does with columns ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        """Compressed bytes of all rows (what the shard stores and counts)."""
        return len(self.data)

    @property
    def row_nbytes(self) -> int:
        """Raw bytes of one decompressed row."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The shape of the column once decompressed: [rows, *shape]."""
        return (len(self), *self.shape)

    def frame(self, i: int) -> bytes:
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def frames(self, start: int = 0, stop: int | None = None) -> list[bytes]:
        """Rows start .. stop - 1 as separate bytes objects (copies, independent of this column's data)."""
        stop = len(self) if stop is None else stop
        data, offsets = self.data, self.offsets.tolist()
        return [data[offsets[i] : offsets[i + 1]] for i in range(start, stop)]

    def take(self, indices) -> CompressedColumn:
        """The rows at `indices` (an index array, a slice or a boolean mask), in that order."""
        picked = np.arange(len(self))[indices]
        data, offsets = self.data, self.offsets.tolist()
        frames = [data[offsets[i] : offsets[i + 1]] for i in picked.tolist()]
        return CompressedColumn(
            self.compression, self.dtype, self.shape, b"".join(frames), self.lengths[picked]
        )

    def same_type(self, other: CompressedColumn) -> bool:
        return (self.compression, self.dtype, self.shape) == (other.compression, other.dtype, other.shape)

    def describe(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}@{self.compression}"


Column = np.ndarray | CompressedColumn


def concatenate(columns: Sequence[Column]) -> Column:
    """Rows of several pieces of one column, in order (numpy arrays or compressed columns of one type)."""
    first = columns[0]
    if not isinstance(first, CompressedColumn):
        return np.concatenate(columns)
    for other in columns[1:]:
        if not isinstance(other, CompressedColumn) or not first.same_type(other):
            raise ValueError(f"cannot concatenate a {first.describe()} column with another kind of column")
    if len(columns) == 1:
        return first
    return CompressedColumn(
        first.compression,
        first.dtype,
        first.shape,
        b"".join(c.data for c in columns),
        np.concatenate([c.lengths for c in columns]),
    )


def take_rows(column: Column, indices) -> Column:
    """Rows `indices` (an index array, a slice or a boolean mask) of a numpy column or a compressed one."""
    return column.take(indices) if isinstance(column, CompressedColumn) else column[indices]


def column_nbytes(column: Column) -> int:
    """Bytes a column takes as sent and stored (compressed bytes for a compressed column)."""
    return column.nbytes if isinstance(column, CompressedColumn) else np.asarray(column).nbytes


def logical_shape(column: Column) -> tuple[int, ...]:
    """The column's shape once decompressed."""
    return column.logical_shape if isinstance(column, CompressedColumn) else tuple(column.shape)


# --- compressing and decompressing (the writer's and the learner's side) ------------------------------------------
_local = threading.local()  # zstd contexts are not thread-safe: one per thread


def _zstd_compressor(level: int):
    import zstandard

    cache = _local.__dict__.setdefault("zstd_compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
    return cache[level]


def _zstd_decompressor():
    import zstandard

    if not hasattr(_local, "zstd_decompressor"):
        _local.zstd_decompressor = zstandard.ZstdDecompressor()
    return _local.zstd_decompressor


def compress(array: np.ndarray, compression: str, level: int | None = None) -> CompressedColumn:
    """Compress every row of `array` (first dimension = rows) into its own frame."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r} (known: {', '.join(COMPRESSIONS)})")
    array = np.ascontiguousarray(array)
    if array.ndim == 0:
        raise ValueError("a compressed column needs a batch dimension")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    level = DEFAULT_LEVEL[compression] if level is None else level
    if compression == ZSTD:
        compress_row = _zstd_compressor(level).compress
    else:
        import lz4.frame

        def compress_row(row, _compress=lz4.frame.compress, _level=level):
            return _compress(row, compression_level=_level, store_size=True)

    frames = [compress_row(row) for row in array.reshape(len(array), -1).view(np.uint8)]
    return CompressedColumn.from_frames(compression, array.dtype, array.shape[1:], frames)


class BadFrame(ValueError):
    """A frame that does not decompress to one row of its column's dtype and shape."""


def decompress_frame(frame: bytes, compression: str, row_nbytes: int) -> bytes:
    """The raw bytes of one row; BadFrame when the frame is not a valid frame of exactly `row_nbytes` bytes.
    A frame announcing another size is refused before anything is allocated for it."""
    try:
        if compression == ZSTD:
            import zstandard

            size = zstandard.frame_content_size(frame)
            if size not in (row_nbytes, -1):
                raise BadFrame(f"the frame announces {size} bytes, the row has {row_nbytes}")
            raw = _zstd_decompressor().decompress(frame, max_output_size=row_nbytes)
        elif compression == LZ4:
            import lz4.frame

            size = lz4.frame.get_frame_info(frame).get("content_size", 0)
            if size not in (row_nbytes, 0):
                raise BadFrame(f"the frame announces {size} bytes, the row has {row_nbytes}")
            decompressor = lz4.frame.LZ4FrameDecompressor()
            raw = decompressor.decompress(frame, max_length=row_nbytes + 1)
            if not decompressor.eof or decompressor.unused_data:
                raise BadFrame(
                    f"the frame holds more than {row_nbytes} bytes, is truncated or is followed by "
                    f"other bytes"
                )
        else:
            raise BadFrame(f"unknown compression {compression!r}")
    except BadFrame:
        raise
    except Exception as err:  # noqa: BLE001 (each library has its own error types; all mean "bad frame")
        raise BadFrame(f"not a valid {compression} frame ({type(err).__name__}: {err})") from None
    if len(raw) != row_nbytes:
        raise BadFrame(f"the frame decompresses to {len(raw)} bytes, the row has {row_nbytes}")
    return raw


def decompress_into(column: CompressedColumn, out: np.ndarray) -> dict[int, str]:
    """Decompress every row of `column` into `out` (shape [rows, *shape], the column's dtype, C-contiguous);
    return {row: reason} for the rows whose frame is bad (their rows in `out` are zeroed). A BOOL row holding
    bytes other than 0 and 1 is bad too."""
    if out.shape != column.logical_shape or out.dtype != column.dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"out is {out.dtype}{list(out.shape)}, the column decompresses to "
            f"{column.dtype}{list(column.logical_shape)} (C order)"
        )
    n = column.row_nbytes
    flat = out.reshape(len(column), -1).view(np.uint8) if len(column) else out
    bad: dict[int, str] = {}
    data, offsets = column.data, column.offsets.tolist()
    is_bool = column.dtype == np.bool_
    for i in range(len(column)):
        try:
            raw = decompress_frame(data[offsets[i] : offsets[i + 1]], column.compression, n)
            row = np.frombuffer(raw, dtype=np.uint8)
            if is_bool and n and row.max() > 1:
                raise BadFrame("a BOOL row holds bytes other than 0 and 1")
            flat[i] = row
        except BadFrame as err:
            flat[i] = 0
            bad[i] = str(err)
    return bad


def decompress(column: CompressedColumn) -> tuple[np.ndarray, dict[int, str]]:
    """The decompressed array of `column` and its bad rows (see decompress_into)."""
    out = np.empty(column.logical_shape, dtype=column.dtype)
    return out, decompress_into(column, out)


def compress_image_columns(
    columns: dict[str, np.ndarray], compression: str | None, names: Sequence[str] = ("obs", "next_obs")
) -> dict[str, np.ndarray | CompressedColumn]:
    """`columns` with its image columns among `names` compressed one frame per row (`compression`: "zstd" or
    "lz4"; None or "none" leaves them raw). An image column is uint8 or bool with at least 2 dimensions per row
    (Atari's [4, 84, 84], MinAtar's [10, 10, C]); vectors stay raw (compressing them saves little and costs
    the learner a decompression per row). The replay signature then reads `obs:uint8[4,84,84]@zstd`."""
    if compression in (None, "none"):
        return columns
    out = dict(columns)
    for name in names:
        column = columns.get(name)
        if column is not None and is_image(column.dtype, column.shape[1:]):
            out[name] = compress(column, compression)
    return out


IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


def is_image(dtype: np.dtype, row_shape: Sequence[int]) -> bool:
    """Whether rows of this dtype and shape are images, which replay keeps compressed: uint8 or bool with at
    least 2 dimensions (Atari's [4, 84, 84], MinAtar's [10, 10, C]); vectors stay raw."""
    return np.dtype(dtype) in IMAGE_DTYPES and len(row_shape) >= 2

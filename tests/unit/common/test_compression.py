"""Compressed columns (common/compression.py): zstd and LZ4 round trips, gathering and concatenating frames, and
the bad frames the learner's data path must refuse (wrong size, garbage, truncated, bool bytes above 1)."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.common.compression import (
    LZ4,
    MAGIC,
    ZSTD,
    BadFrame,
    CompressedColumn,
    column_nbytes,
    compress,
    concatenate,
    decompress,
    decompress_frame,
    logical_shape,
    take_rows,
)


def frames_like(rows: int = 6, seed: int = 0) -> np.ndarray:
    """Pixel-like uint8 [rows, 4, 84, 84]: a flat background with a few moving blocks (compressible)."""
    rng = np.random.default_rng(seed)
    out = np.full((rows, 4, 84, 84), 87, dtype=np.uint8)
    for i in range(rows):
        for k in range(4):
            y, x = rng.integers(0, 80, 2)
            out[i, k, y : y + 4, x : x + 2] = 236
    return out


@pytest.mark.parametrize("compression", [ZSTD, LZ4])
def test_round_trip_keeps_every_row_and_frames_are_small(compression):
    array = frames_like()
    column = compress(array, compression)
    assert len(column) == 6 and column.logical_shape == (6, 4, 84, 84) and column.dtype == np.uint8
    assert column.nbytes == int(column.lengths.sum()) < array.nbytes / 20
    assert all(column.frame(i)[:4] == MAGIC[compression] for i in range(6))
    out, bad = decompress(column)
    assert bad == {}
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("compression", [ZSTD, LZ4])
def test_bool_and_wide_dtypes_round_trip(compression):
    rng = np.random.default_rng(1)
    planes = rng.random((5, 10, 10, 4)) < 0.1
    wide = rng.standard_normal((3, 7)).astype(">f8")  # big endian in, little endian stored
    for array in (planes, wide):
        out, bad = decompress(compress(array, compression))
        assert bad == {} and out.dtype == array.dtype.newbyteorder("<")
        np.testing.assert_array_equal(out, array)


def test_take_and_concatenate_copy_the_right_frames():
    array = frames_like(8)
    column = compress(array, ZSTD)
    picked = take_rows(column, np.array([5, 0, 5, 7]))
    np.testing.assert_array_equal(decompress(picked)[0], array[[5, 0, 5, 7]])
    np.testing.assert_array_equal(decompress(take_rows(column, slice(2, 4)))[0], array[2:4])
    joined = concatenate([take_rows(column, slice(0, 3)), take_rows(column, slice(3, None))])
    assert joined.data == column.data and np.array_equal(joined.lengths, column.lengths)
    np.testing.assert_array_equal(concatenate([np.zeros(2), np.ones(1)]), [0, 0, 1])
    with pytest.raises(ValueError, match="cannot concatenate"):
        concatenate([column, compress(array, LZ4)])
    assert column_nbytes(column) == column.nbytes and column_nbytes(array) == array.nbytes
    assert logical_shape(column) == array.shape


def test_a_compressed_column_is_never_mistaken_for_an_array():
    column = compress(frames_like(2), ZSTD)
    assert np.asarray(column, dtype=object).shape == ()  # not a sequence of rows to numpy
    with pytest.raises(TypeError):
        column[0]  # noqa: B018


@pytest.mark.parametrize("compression", [ZSTD, LZ4])
def test_bad_frames_are_named_and_their_rows_zeroed(compression):
    array = frames_like(5)
    good = compress(array, compression)
    other_shape = compress(array[:, :2], compression)  # decompresses to half a row
    frames = good.frames()
    frames[1] = other_shape.frame(1)
    frames[2] = MAGIC[compression] + b"\x00" * 40  # the magic number, then garbage
    frames[3] = good.frame(3)[:-5]  # truncated
    column = CompressedColumn.from_frames(compression, np.uint8, (4, 84, 84), frames)
    out, bad = decompress(column)
    assert sorted(bad) == [1, 2, 3]
    assert "14112" in bad[1] and "28224" in bad[1]  # the frame's size and the row's
    np.testing.assert_array_equal(out[[0, 4]], array[[0, 4]])
    assert not out[[1, 2, 3]].any()


def test_a_bool_row_with_other_bytes_is_bad():
    ones = compress(np.full((1, 10, 10, 2), 2, dtype=np.uint8), ZSTD)
    column = CompressedColumn(ZSTD, np.dtype(bool), (10, 10, 2), ones.data, ones.lengths)
    assert "BOOL" in decompress(column)[1][0]


def test_a_frame_announcing_a_huge_size_is_refused_before_allocating():
    import zstandard

    frame = zstandard.ZstdCompressor().compress(b"\x00" * 100_000)
    with pytest.raises(BadFrame, match="announces 100000 bytes, the row has 1000"):
        decompress_frame(frame, ZSTD, 1000)
    with pytest.raises(BadFrame, match="unknown compression"):
        decompress_frame(frame, "gzip", 1000)

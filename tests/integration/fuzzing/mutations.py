"""Mutations drawn with hypothesis: of serialized bytes (truncated, bit-flipped, spliced, random) and of protobuf
fields (tensor dtype, shape, data, values).

Every function takes `draw` (hypothesis' `data.draw`), mutates or returns its input, and appends a short label of
what it did to `log`, so a failure names the mutations that led to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from apexrl.proto import tensor_pb2

Draw = Callable[[st.SearchStrategy[Any]], Any]

# Dimensions around every limit: negative, 0, small, the table's capacity (256), MAX_DIM (2**31) and beyond.
SPECIAL_DIMS = (
    -(2**63),
    -1,
    0,
    1,
    2,
    3,
    4,
    5,
    8,
    255,
    256,
    257,
    2**20,
    2**25,
    2**31 - 1,
    2**31,
    2**31 + 1,
    2**32,
    2**62,
    2**63 - 1,
)
# Wire dtype numbers: every listed value, DTYPE_UNSPECIFIED (0), and values no DType names.
DTYPE_NUMBERS = (*range(0, 13), 13, 99, 2**31 - 1, -1)
# Raw priorities around the accepted range [0, 1e25]: NaN, infinities, negatives, subnormals, the bounds.
SPECIAL_FLOATS = (
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    -5e-324,
    -0.0,
    0.0,
    5e-324,
    1e-300,
    1e-45,
    1.0,
    3.0,
    1e25,
    float(np.nextafter(1e25, math.inf)),
    1e26,
    3.4e38,
    float(np.finfo(np.float64).max),
)
SPECIAL_U64 = (0, 1, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)

_NP_DTYPES = {
    1: np.float32,
    2: np.float64,
    3: np.float16,
    4: np.int8,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    8: np.uint8,
    9: np.uint16,
    10: np.uint32,
    11: np.uint64,
    12: np.uint8,
}


def mutate_tensor(draw: Draw, tensor: tensor_pb2.Tensor, log: list[str], what: str) -> None:
    """Change one thing about `tensor` in place: dtype, a dimension, the rank, the data length or bytes, the
    values (special floats), or clear it."""
    shape = list(tensor.shape)
    op = draw(
        st.sampled_from(
            [
                "dtype",
                "dim",
                "dim",
                "append_dim",
                "drop_dim",
                "rank",
                "huge_empty",
                "truncate",
                "extend",
                "empty_data",
                "random_data",
                "values",
                "values",
                "clear",
            ]
        )
    )
    log.append(f"{what}:{op}")
    if op == "dtype":
        tensor.dtype = draw(st.sampled_from(DTYPE_NUMBERS))
    elif op == "dim":
        index = draw(st.integers(0, max(len(shape) - 1, 0)))
        shape[index : index + 1] = [draw(st.sampled_from(SPECIAL_DIMS))]
        tensor.shape[:] = shape
    elif op == "append_dim":
        tensor.shape.append(draw(st.sampled_from(SPECIAL_DIMS)))
    elif op == "drop_dim":
        tensor.shape[:] = shape[:-1]
    elif op == "rank":  # same element count and data, rank at and beyond numpy's limits (32 / 64)
        tensor.shape[:] = shape + [1] * draw(st.sampled_from([30, 31, 32, 62, 63, 64, 65, 100]))
    elif op == "huge_empty":  # no elements, but the other dimensions multiply past int64
        tensor.shape[:] = [
            *shape[:1],
            *draw(
                st.sampled_from(
                    [[2**31, 2**31, 0], [2**31, 2**25, 0], [0, 2**31, 2**31], [2**31, 2**20, 0], [0] * 3]
                )
            ),
        ]
        tensor.data = b""
    elif op == "truncate":
        tensor.data = tensor.data[: draw(st.integers(0, max(len(tensor.data) - 1, 0)))]
    elif op == "extend":
        tensor.data = tensor.data + bytes(draw(st.sampled_from([1, 3, 4, 8, 64])))
    elif op == "empty_data":
        tensor.data = b""
    elif op == "random_data":
        tensor.data = draw(st.binary(min_size=len(tensor.data), max_size=len(tensor.data)))
    elif op == "values":
        tensor.data = special_values(draw, tensor.dtype, len(tensor.data))
    else:
        tensor.Clear()


def special_values(draw: Draw, dtype: int, nbytes: int) -> bytes:
    """`nbytes` bytes of `dtype` holding special values (NaN, infinities, negatives, huge, ...): one at a random
    position among ordinary ones, or all of them."""
    np_dtype = np.dtype(_NP_DTYPES.get(dtype, np.uint8))
    count = nbytes // np_dtype.itemsize
    if count == 0:
        return b""
    if np_dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            pool = np.array(SPECIAL_FLOATS).astype(np_dtype)
    elif np_dtype.kind == "u":
        pool = np.array([v % (1 << (8 * np_dtype.itemsize)) for v in SPECIAL_U64], dtype=np.uint64).astype(
            np_dtype
        )
    else:
        info = np.iinfo(np_dtype)
        pool = np.array([info.min, -1, 0, 1, info.max], dtype=np_dtype)
    values = np.ones(count, dtype=np_dtype)
    if draw(st.booleans()):
        values[draw(st.integers(0, count - 1))] = pool[draw(st.integers(0, len(pool) - 1))]
    else:
        values[:] = pool[draw(st.lists(st.integers(0, len(pool) - 1), min_size=count, max_size=count))]
    return values.tobytes() + bytes(nbytes - count * np_dtype.itemsize)


def chance(draw: Draw, percent: float) -> bool:
    """True about `percent` percent of the time. Hypothesis favours the ends of a range (0, the maximum, small
    values), so the event is a band in the middle of 0..9999, not `== 0` (which would come up far too often)."""
    return 4000 <= draw(st.integers(0, 9999)) < 4000 + round(percent * 100)


def mangle(draw: Draw, raw: bytes, log: list[str], what: str, probability: int = 35) -> bytes:
    """With `probability` percent, damage serialized bytes: truncate, flip bits, insert, delete or splice bytes,
    repeat the message (a protobuf merge), append an unknown field or garbage, or replace it all by random bytes.
    The result may or may not still parse."""
    if not chance(draw, probability):
        return raw
    op = draw(
        st.sampled_from(
            [
                "truncate",
                "flip",
                "flip",
                "insert",
                "delete",
                "splice",
                "repeat",
                "unknown_field",
                "garbage",
                "random",
            ]
        )
    )
    log.append(f"{what}:bytes-{op}")
    n = len(raw)
    if op == "truncate" and n:
        return raw[: draw(st.integers(0, n - 1))]
    if op == "flip" and n:
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, n - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if op == "insert":
        at = draw(st.integers(0, n))
        return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if op == "delete" and n:
        at = draw(st.integers(0, n - 1))
        return raw[:at] + raw[at + draw(st.integers(1, 8)) :]
    if op == "splice" and n:
        at = draw(st.integers(0, n - 1))
        piece = draw(st.binary(min_size=1, max_size=8))
        return raw[:at] + piece + raw[at + len(piece) :]
    if op == "repeat":
        return raw + raw
    if op == "unknown_field":  # field 15, varint: a valid message from a newer client, must be ignored
        return raw + b"\x78" + bytes([draw(st.integers(0, 127))])
    if op == "garbage":
        return raw + draw(st.binary(min_size=1, max_size=16))
    return draw(st.binary(max_size=64))


def oversize_string_field(field_number: int, nbytes: int) -> bytes:
    """A message holding one length-delimited field of `nbytes` 'a's: valid protobuf, larger than a limit."""
    tag = (field_number << 3) | 2
    return _varint(tag) + _varint(nbytes) + b"a" * nbytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)

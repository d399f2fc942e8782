"""The parameter service's weights format and version rules, shared by the store, the wire module, the client and
the learner (numpy only: no protobuf, no gRPC).

A version is a flat list of named tensors packed into one concatenation of raw bytes (C order, little endian) plus
a layout saying where each tensor lives (`TensorEntry`: name, dtype, shape, offset, nbytes). A layout describes its
bytes exactly: at least one tensor, unique non-empty names, dimensions of at most MAX_DIM, no overlaps, no gaps.
The wire module (wire.py) only converts a layout to and from the WeightsHeader message.

Versions are integers >= 1 that strictly increase; 0 means "nothing" (no version published yet, or a reader that
holds none). Each new version lies in a window above the current one: greater than it and at most
MAX_VERSION_STEP above it (`version_window`, `check_version_in_window`). Without the upper bound one publish of
2**64 - 1 would leave no version for anyone after it, and every reader would take those weights for the newest;
with it, reaching the top (MAX_VERSION, below 2**63 so the number fits every language's signed 64-bit integer)
takes 2**43 publishes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError
from apexrl.common.signature import MAX_DIM, canonical_dtype

MAX_VERSION = (1 << 63) - 1  # versions travel as uint64, but stay within a signed 64-bit integer
MAX_VERSION_STEP = 1 << 20  # a new version is at most this far above the current one


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in the concatenated bytes of a version."""

    name: str
    dtype: np.dtype  # little endian, one of apexrl's wire dtypes
    shape: tuple[int, ...]
    offset: int  # byte offset in the concatenation
    nbytes: int  # prod(shape) * itemsize

    def __str__(self) -> str:
        return f"{self.name!r} {self.dtype.name}{list(self.shape)} at bytes [{self.offset}, {self.offset + self.nbytes})"


Layout = tuple[TensorEntry, ...]


class VersionRefusedError(FailedPreconditionError):
    """A version outside the window above the current one (not greater, too far above, or beyond MAX_VERSION):
    the weights may be fine, the number is not. A publisher recovers by reading the current version and
    publishing above it."""


# --- versions ------------------------------------------------------------------------------------------------------


def version_window(current: int) -> tuple[int, int]:
    """The versions [low, high] that may follow `current` (empty, low > high, once current is MAX_VERSION)."""
    return current + 1, min(current + MAX_VERSION_STEP, MAX_VERSION)


def check_version_number(version: int | None) -> int | None:
    """`version` as an int, or None (the store assigns the next one); InvalidArgumentError for what is no version
    at all (not an integer, or below 1: 0 means "none")."""
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise InvalidArgumentError(f"version must be an integer or None, got {version!r}")
    if version < 1:
        raise InvalidArgumentError(f"version must be >= 1 (0 means 'none'), got {version}")
    return int(version)


def check_version_in_window(version: int, current: int | None = None) -> None:
    """VersionRefusedError when `version` (>= 1) may not follow `current`: it is not greater, more than
    MAX_VERSION_STEP above it, or above MAX_VERSION. With `current` None (a client, which does not know the
    service's version) only MAX_VERSION is checked; the store checks the whole window."""
    low, high = version_window(current) if current is not None else (1, MAX_VERSION)
    if version < low:
        raise VersionRefusedError(f"version {version} is not greater than the current version {current}")
    if version <= high:
        return
    why = (
        f"above the largest version {MAX_VERSION}"
        if version > MAX_VERSION
        else f"more than {MAX_VERSION_STEP} above the current version {current}"
    )
    where = (
        ""
        if current is None
        else f": the current version is {current}, so the next must be in [{low}, {high}]"
    )
    raise VersionRefusedError(f"version {version} is {why}{where}")


def next_version(current: int) -> int:
    """The version that follows `current` when the publisher names none; VersionRefusedError at MAX_VERSION."""
    low, high = version_window(current)
    if low > high:
        raise VersionRefusedError(f"no version is left after the current one ({current}, the largest)")
    return low


# --- layout and bytes ----------------------------------------------------------------------------------------------


def check_layout(layout: Sequence[TensorEntry], total_bytes: int) -> None:
    """Check that `layout` describes exactly `total_bytes` bytes: at least one tensor, unique non-empty names,
    dimensions in range, nbytes = prod(shape) * itemsize, every tensor inside the total, no two tensors
    overlapping, and total_bytes = the sum of every nbytes. InvalidArgumentError names the first problem."""
    if not layout:
        raise InvalidArgumentError("weights have no tensors")
    seen: set[str] = set()
    for e in layout:
        if not e.name:
            raise InvalidArgumentError("a tensor has an empty name")
        if e.name in seen:
            raise InvalidArgumentError(f"duplicate tensor name {e.name!r}")
        seen.add(e.name)
        for d in e.shape:
            if d < 0 or d > MAX_DIM:
                raise InvalidArgumentError(
                    f"tensor {e.name!r}: dimension {d} out of range [0, {MAX_DIM}] in shape {list(e.shape)}"
                )
        expected = math.prod(e.shape) * e.dtype.itemsize  # exact: Python ints cannot overflow
        if e.nbytes != expected:
            raise InvalidArgumentError(
                f"tensor {e.name!r}: nbytes {e.nbytes}, but shape {list(e.shape)} of {e.dtype.name} needs {expected}"
            )
        if e.offset < 0 or e.offset + e.nbytes > total_bytes:
            raise InvalidArgumentError(f"tensor {e}: outside the {total_bytes} total bytes")
    by_offset = sorted((e for e in layout if e.nbytes > 0), key=lambda e: e.offset)
    for before, after in itertools.pairwise(by_offset):
        if before.offset + before.nbytes > after.offset:
            raise InvalidArgumentError(f"tensors {before} and {after} overlap")
    covered = sum(e.nbytes for e in layout)
    if covered != total_bytes:
        raise InvalidArgumentError(
            f"total_bytes is {total_bytes}, but the tensors' nbytes sum to {covered} (no gaps are allowed)"
        )


def check_packed(layout: Sequence[TensorEntry], payload: memoryview | bytes | bytearray) -> memoryview:
    """`payload` as a read-only byte view (not copied) once `layout` describes it exactly (`check_layout`) and
    every bool tensor's bytes are 0 or 1; InvalidArgumentError names the first problem."""
    view = memoryview(payload).toreadonly().cast("B")
    check_layout(layout, view.nbytes)
    for e in layout:
        if e.dtype == np.bool_ and e.nbytes:
            largest = int(np.frombuffer(view, np.uint8, e.nbytes, e.offset).max())
            if largest > 1:
                raise InvalidArgumentError(f"tensor {e.name!r}: bool bytes must be 0 or 1, found {largest}")
    return view


def pack(weights: Mapping[str, np.ndarray]) -> tuple[Layout, memoryview]:
    """Concatenate `weights` (in mapping order) into one read-only buffer; return (layout, bytes).

    InvalidArgumentError for no tensors, an empty or non-string name, or an unsupported dtype.
    """
    if not weights:
        raise InvalidArgumentError("weights have no tensors")
    arrays: list[tuple[str, np.ndarray]] = []
    for name, value in weights.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"tensor names must be non-empty strings, got {name!r}")
        array = np.asarray(value)
        try:
            dt = canonical_dtype(array.dtype)
        except (InvalidArgumentError, TypeError) as err:
            raise InvalidArgumentError(f"tensor {name!r}: {err}") from None
        arrays.append(
            (name, np.asarray(array, dtype=dt, order="C"))
        )  # keeps 0-d (ascontiguousarray does not)
    layout: list[TensorEntry] = []
    offset = 0
    for name, array in arrays:
        layout.append(TensorEntry(name, array.dtype, tuple(array.shape), offset, array.nbytes))
        offset += array.nbytes
    buffer = np.empty(offset, dtype=np.uint8)
    for entry, (_, array) in zip(layout, arrays, strict=True):
        buffer[entry.offset : entry.offset + entry.nbytes] = array.reshape(-1).view(np.uint8)
    return tuple(layout), memoryview(buffer).toreadonly()


def unpack(layout: Sequence[TensorEntry], payload: memoryview | bytes | bytearray) -> dict[str, np.ndarray]:
    """The named arrays of a packed version, in layout order: views of `payload` (read-only when it is), except
    that a tensor whose offset is not a multiple of its itemsize is copied so every array is aligned."""
    arrays: dict[str, np.ndarray] = {}
    for e in layout:
        count = e.nbytes // e.dtype.itemsize
        array = np.frombuffer(payload, dtype=e.dtype, count=count, offset=e.offset).reshape(e.shape)
        arrays[e.name] = array if array.flags.aligned else array.copy()
    return arrays

"""Table signatures: the ordered fields `name -> (dtype, shape)` every row of a replay table has.

Pure module (numpy only). A signature is declared at start-up (`--signature 'obs:float32[4],action:int64[]'`) or
fixed by the first insert; every later batch is checked against it before anything is stored.

A field may be compressed: `obs:uint8[4,84,84]@zstd` (or `@lz4`) declares rows of uint8[4, 84, 84] that travel
and are stored as one zstd (LZ4) frame per row (common/compression.py): its dtype and shape are what each frame
decompresses to, and a batch carries it as a `CompressedColumn` of that compression, dtype and shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from apexrl.common.compression import COMPRESSIONS, CompressedColumn
from apexrl.common.errors import InvalidArgumentError

# Wire dtypes (see protos/apexrl/proto/tensor.proto); always little endian on the wire and in tables.
SUPPORTED_DTYPES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
# Dimensions above this are refused before any arithmetic on them (prod() of a few of these cannot overflow int64).
MAX_DIM = 1 << 31

# A column the built-in actor writes beside the transition's (obs, action, reward, discount, next_obs; custom actors
# write the same names): the weights version acting when the row was completed (int64). Optional; it feeds the
# learner's staleness histogram.
ROW_VERSION_COLUMN = "weight_version"


def canonical_dtype(dtype: np.typing.DTypeLike) -> np.dtype:
    """The little-endian numpy dtype apexrl stores for `dtype`; InvalidArgumentError when unsupported."""
    dt = np.dtype(dtype)
    if dt.name not in SUPPORTED_DTYPES:
        raise InvalidArgumentError(f"unsupported dtype {dt} (supported: {', '.join(SUPPORTED_DTYPES)})")
    return dt.newbyteorder("<") if dt.byteorder == ">" else dt


@dataclass(frozen=True)
class FieldSpec:
    """One field: per-row dtype and shape (the batch dimension excluded), and its compression (None: raw)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    compression: str | None = None

    def __post_init__(self) -> None:
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise InvalidArgumentError(
                f"field {self.name!r}: unknown compression {self.compression!r} (known: "
                f"{', '.join(COMPRESSIONS)})"
            )

    def __str__(self) -> str:
        return f"{self.name}:{self.type_name}"

    @property
    def type_name(self) -> str:
        """`dtype[shape]`, with `@compression` for a compressed field."""
        text = f"{self.dtype.name}[{','.join(map(str, self.shape))}]"
        return text if self.compression is None else f"{text}@{self.compression}"

    @cached_property
    def row_nbytes(self) -> int:
        """Raw bytes of one row (for a compressed field: what one frame decompresses to)."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Signature:
    """The ordered fields of a table. Names are unique."""

    fields: tuple[FieldSpec, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if not names:
            raise InvalidArgumentError("a signature needs at least one field")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidArgumentError(f"duplicate field names in signature: {dupes}")

    def __str__(self) -> str:
        return ",".join(str(f) for f in self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @cached_property
    def row_nbytes(self) -> int:
        """Raw bytes of one row, compressed fields counted decompressed."""
        return sum(f.row_nbytes for f in self.fields)

    @cached_property
    def fixed_row_nbytes(self) -> int:
        """Bytes of one row's uncompressed fields (each stored row takes these plus its compressed frames)."""
        return sum(f.row_nbytes for f in self.fields if f.compression is None)

    @cached_property
    def compressed(self) -> tuple[FieldSpec, ...]:
        """The compressed fields, in signature order."""
        return tuple(f for f in self.fields if f.compression is not None)

    @classmethod
    def parse(cls, text: str) -> Signature:
        """Parse `name:dtype[d0,d1,...]` items, each optionally followed by `@zstd` or `@lz4` (a compressed field),
        separated by commas outside brackets, e.g. `obs:uint8[4,84,84]@zstd,action:int64[],reward:float32[]`."""
        items = [
            m.group(0)
            for m in re.finditer(r"[^,\[\]]+(\[[^\]]*\])?[^,\[\]]*", text)
            if m.group(0).strip(" ,")
        ]
        fields = []
        for item in items:
            m = re.fullmatch(
                r"\s*([A-Za-z_][\w.\-]*)\s*:\s*(\w+)\s*(?:\[([\d,\s]*)\])?\s*(?:@\s*(\w+)\s*)?", item
            )
            if not m:
                raise InvalidArgumentError(
                    f"cannot parse signature field {item.strip()!r}; expected "
                    f"name:dtype[d0,d1] or name:dtype[d0,d1]@zstd"
                )
            name, dtype, dims, compression = m.groups()
            try:
                dt = canonical_dtype(dtype)
            except TypeError as exc:
                raise InvalidArgumentError(f"field {name!r}: unknown dtype {dtype!r}") from exc
            shape = tuple(int(d) for d in dims.split(",") if d.strip()) if dims else ()
            fields.append(FieldSpec(name, dt, shape, compression))
        return cls(tuple(fields))

    @classmethod
    def from_batch(cls, columns: Mapping[str, np.ndarray | CompressedColumn]) -> Signature:
        """The signature a batch implies (per-row shape = column shape without the first dimension; a compressed
        column gives a compressed field)."""
        return cls(tuple(_field_of(n, a) for n, a in columns.items()))

    def check_batch(self, columns: Mapping[str, np.ndarray | CompressedColumn]) -> int:
        """Check that a batch matches this signature exactly; return its number of rows.

        Raises InvalidArgumentError naming the first difference: a missing or unknown column, a column whose dtype,
        per-row shape or compression differs, or columns of different lengths.
        """
        rows = check_rows(columns)
        missing = [n for n in self.names if n not in columns]
        unknown = sorted(set(columns) - set(self.names))
        if missing or unknown:
            raise InvalidArgumentError(
                f"batch columns do not match the table signature ({self}): missing {missing}, unknown {unknown}"
            )
        for spec in self.fields:
            col = columns[spec.name]
            compression = col.compression if isinstance(col, CompressedColumn) else None
            if col.dtype != spec.dtype or _row_shape(col) != spec.shape or compression != spec.compression:
                raise InvalidArgumentError(
                    f"column {spec.name!r} is {_type_name(col)} per row, "
                    f"the table signature wants {_describe(spec.dtype, spec.shape, spec.compression)}"
                )
        return rows


def _row_shape(column: np.ndarray | CompressedColumn) -> tuple[int, ...]:
    return column.shape if isinstance(column, CompressedColumn) else tuple(column.shape[1:])


def _type_name(column: np.ndarray | CompressedColumn) -> str:
    compression = column.compression if isinstance(column, CompressedColumn) else None
    return _describe(column.dtype, _row_shape(column), compression)


def _describe(dtype: np.dtype, shape: tuple[int, ...], compression: str | None) -> str:
    text = f"{dtype.name}{list(shape)}"
    return text if compression is None else f"{text}@{compression}"


def _field_of(name: str, column: np.ndarray | CompressedColumn) -> FieldSpec:
    if isinstance(column, CompressedColumn):
        return FieldSpec(name, canonical_dtype(column.dtype), column.shape, column.compression)
    return FieldSpec(name, canonical_dtype(column.dtype), tuple(column.shape[1:]))


def check_rows(columns: Mapping[str, np.ndarray | CompressedColumn]) -> int:
    """The common first dimension of all columns; InvalidArgumentError for a ragged or empty batch."""
    if not columns:
        raise InvalidArgumentError("batch has no columns")
    lengths = {}
    for name, col in columns.items():
        if isinstance(col, CompressedColumn):
            lengths[name] = len(col)
            continue
        if col.ndim == 0:
            raise InvalidArgumentError(f"column {name!r} is a scalar; columns need a batch dimension")
        lengths[name] = col.shape[0]
    if len(set(lengths.values())) != 1:
        raise InvalidArgumentError(f"ragged batch: columns have different lengths {lengths}")
    rows = next(iter(lengths.values()))
    if rows == 0:
        raise InvalidArgumentError("batch has 0 rows")
    return int(rows)

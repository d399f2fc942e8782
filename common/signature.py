"""Table signatures: the ordered fields `name -> (dtype, shape)` every row of a replay table has.

Pure module (numpy only). A signature is declared at start-up (`--signature 'obs:float32[4],action:int64[]'`) or
fixed by the first insert; every later batch is checked against it before anything is stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from apexrl.common.errors import InvalidArgumentError

# Wire dtypes (see protos/apexrl/proto/tensor.proto); always little endian on the wire and in tables.
SUPPORTED_DTYPES: tuple[str, ...] = (
    "float32", "float64", "float16", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool",
)

# The columns the built-in actor writes and the learner reads (custom actors write the same names). The learner
# trains on the first five; `weight_version` (int64, the weights version acting when the row was completed) is
# optional and feeds the learner's staleness histogram.
TRANSITION_COLUMNS: tuple[str, ...] = ("obs", "action", "reward", "discount", "next_obs")
ROW_VERSION_COLUMN = "weight_version"


def canonical_dtype(dtype: np.typing.DTypeLike) -> np.dtype:
    """The little-endian numpy dtype apexrl stores for `dtype`; InvalidArgumentError when unsupported."""
    dt = np.dtype(dtype)
    if dt.name not in SUPPORTED_DTYPES:
        raise InvalidArgumentError(f"unsupported dtype {dt} (supported: {', '.join(SUPPORTED_DTYPES)})")
    return dt.newbyteorder("<") if dt.byteorder == ">" else dt


@dataclass(frozen=True)
class FieldSpec:
    """One field: per-row dtype and shape (the batch dimension excluded)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name}:{self.dtype.name}[{','.join(map(str, self.shape))}]"

    @cached_property
    def row_nbytes(self) -> int:
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
        return sum(f.row_nbytes for f in self.fields)

    @classmethod
    def parse(cls, text: str) -> Signature:
        """Parse `name:dtype[d0,d1,...]` items separated by commas outside brackets, e.g.
        `obs:float32[4],action:int64[],reward:float32[]`."""
        items = [m.group(0) for m in re.finditer(r"[^,\[\]]+(\[[^\]]*\])?", text) if m.group(0).strip(" ,")]
        fields = []
        for item in items:
            m = re.fullmatch(r"\s*([A-Za-z_][\w.\-]*)\s*:\s*(\w+)\s*(?:\[([\d,\s]*)\])?\s*", item)
            if not m:
                raise InvalidArgumentError(f"cannot parse signature field {item.strip()!r}; expected name:dtype[d0,d1]")
            name, dtype, dims = m.groups()
            try:
                dt = canonical_dtype(dtype)
            except TypeError as exc:
                raise InvalidArgumentError(f"field {name!r}: unknown dtype {dtype!r}") from exc
            shape = tuple(int(d) for d in dims.split(",") if d.strip()) if dims else ()
            fields.append(FieldSpec(name, dt, shape))
        return cls(tuple(fields))

    @classmethod
    def from_batch(cls, columns: Mapping[str, np.ndarray]) -> Signature:
        """The signature a batch implies (per-row shape = column shape without the first dimension)."""
        return cls(tuple(FieldSpec(n, canonical_dtype(a.dtype), tuple(a.shape[1:])) for n, a in columns.items()))

    def check_batch(self, columns: Mapping[str, np.ndarray]) -> int:
        """Check that a batch matches this signature exactly; return its number of rows.

        Raises InvalidArgumentError naming the first difference: a missing or unknown column, a column whose dtype
        or per-row shape differs, or columns of different lengths.
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
            if col.dtype != spec.dtype or tuple(col.shape[1:]) != spec.shape:
                raise InvalidArgumentError(
                    f"column {spec.name!r} is {col.dtype.name}{list(col.shape[1:])} per row, "
                    f"the table signature wants {spec.dtype.name}{list(spec.shape)}"
                )
        return rows


def check_rows(columns: Mapping[str, np.ndarray]) -> int:
    """The common first dimension of all columns; InvalidArgumentError for a ragged or empty batch."""
    if not columns:
        raise InvalidArgumentError("batch has no columns")
    lengths = {}
    for name, col in columns.items():
        if col.ndim == 0:
            raise InvalidArgumentError(f"column {name!r} is a scalar; columns need a batch dimension")
        lengths[name] = col.shape[0]
    if len(set(lengths.values())) != 1:
        raise InvalidArgumentError(f"ragged batch: columns have different lengths {lengths}")
    rows = next(iter(lengths.values()))
    if rows == 0:
        raise InvalidArgumentError("batch has 0 rows")
    return int(rows)

"""Validation of raw priorities and of priority updates, before the table's lock is taken.

A checked update is what `ReplayTable.apply_updates` applies: the servicer checks each request of a priority stream
on its own (a bad one ends the stream after the ones before it were applied), then applies the good ones together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apexrl.common.errors import InvalidArgumentError

_PRIORITY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_KEY_DTYPES = (np.dtype(np.uint64), np.dtype(np.int64))

# Largest raw priority accepted: far above any |TD error|, and small enough that p ** alpha (alpha <= 10) summed
# over any table stays finite in float64.
MAX_PRIORITY = 1e25


def check_priorities(priorities: np.ndarray, rows: int, what: str = "priorities") -> np.ndarray:
    """Validate raw priorities: shape [rows], real dtype, finite, in [0, MAX_PRIORITY]. Returns them as float64."""
    if priorities.ndim != 1 or priorities.shape[0] != rows:
        raise InvalidArgumentError(f"{what} has shape {list(priorities.shape)}, expected [{rows}]")
    if priorities.dtype not in _PRIORITY_DTYPES:
        raise InvalidArgumentError(f"{what} must be float32 or float64, got {priorities.dtype.name}")
    values = priorities.astype(np.float64, copy=False)
    bad = ~((values >= 0) & (values <= MAX_PRIORITY))  # also true for NaN
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgumentError(
            f"{what} must be finite, >= 0 and <= {MAX_PRIORITY:g}; {int(bad.sum())} are not "
            f"(first: index {i} = {float(values[i])})"
        )
    return values


@dataclass(frozen=True)
class CheckedUpdate:
    """One priority update, checked: keys as int64 (keys at or above 2**63 become negative, hence stale) and
    raw priorities as float64, both [n]."""

    keys: np.ndarray
    values: np.ndarray
    incarnation: int


def check_update(keys: np.ndarray, priorities: np.ndarray, incarnation: int = 0) -> CheckedUpdate:
    """InvalidArgumentError for keys that are not uint64/int64 [n] or priorities that check_priorities refuses."""
    if keys.ndim != 1:
        raise InvalidArgumentError(f"keys has shape {list(keys.shape)}, expected [n]")
    if keys.dtype not in _KEY_DTYPES:
        raise InvalidArgumentError(f"keys must be uint64 or int64, got {keys.dtype.name}")
    values = check_priorities(priorities, keys.shape[0])
    return CheckedUpdate(keys.astype(np.int64, copy=False), values, incarnation)

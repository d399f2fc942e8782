"""What the commands print for people and scripts, worded and rounded one way everywhere: the one JSON line that
`apexrl launch`, `apexrl evaluate` and `apexrl export` end with (`json_line`), and counts in words (`plural`).

Floats in a JSON line are rounded to 3 decimals, as progress.csv writes them (returns, seconds), and to 3
significant digits below 1 so that a small quantity (an export's largest action difference, 2.38e-07) is not
printed as 0: CartPole's whole returns and Pendulum's fractional ones read alike (500.0, -151.284).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

DECIMALS = 3


def rounded(value: float) -> float:
    """`value` to 3 decimals, or to 3 significant digits below 1 (0 and non-finite values unchanged)."""
    if value == 0 or not math.isfinite(value):
        return value
    if abs(value) < 1:
        return float(f"{value:.{DECIMALS}g}")
    return round(value, DECIMALS)


def json_line(doc: Mapping[str, Any]) -> str:
    """`doc` as one JSON line, every float in it (in nested mappings and lists too) `rounded`."""
    return json.dumps(_rounded_floats(doc))


def plural(count: int, noun: str) -> str:
    """'1 greedy episode', '2 greedy episodes', '0 episodes': `count` and `noun` (singular, regular plural)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _rounded_floats(value: Any) -> Any:
    if isinstance(value, float):
        return rounded(value)
    if isinstance(value, Mapping):
        return {k: _rounded_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded_floats(v) for v in value]
    return value

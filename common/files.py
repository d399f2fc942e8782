"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, and rename it over `path`.

    The rename is atomic on POSIX, so readers see the old file or the new one, never a mix; a crash leaves the
    old file intact (and at worst a stray `.tmp` file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path

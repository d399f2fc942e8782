"""Atomic file writes (a reader, or a crash, never sees a half-written file) and generated files checked for
staleness."""

from __future__ import annotations

import os
import sys
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


def write_or_check(path: Path, text: str, *, check: bool, regenerate: str) -> int:
    """Write a generated file, or with `check` compare it with what is committed: the exit status (1 stale, with
    `regenerate` named as the fix, else 0) of the generators whose output CI checks for staleness."""
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: run {regenerate}", file=sys.stderr)
            return 1
        print(f"{path.name} up to date")
        return 0
    atomic_write(path, text)
    print(f"wrote {path}")
    return 0

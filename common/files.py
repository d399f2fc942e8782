"""Atomic file writes (a reader, or a crash, never sees a half-written file), files only their owner may read
(checkpoints, logs: anything that may hold a secret), and generated files checked for staleness."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO

PRIVATE = 0o600  # owner read/write: checkpoints, write-ahead logs, role logs


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, and rename it over `path`.

    The rename is atomic on POSIX, so readers see the old file or the new one, never a mix; a crash leaves the
    old file intact (and at worst a stray `.tmp` file). `mode` sets the file's permission bits exactly (PRIVATE
    for checkpoints); None leaves them to the umask, as for any new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open_private(tmp, "wb", mode=mode) if mode is not None else open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def open_private(path: str | os.PathLike, how: str = "ab", *, mode: int = PRIVATE) -> IO[bytes]:
    """Open `path` for binary writing ("wb" truncates, "ab" appends) with exactly the permission bits `mode`,
    whatever the umask or an earlier file of that name had: a new file is created with them (never readable by
    others, not even for a moment), an existing one gets them before anything is written."""
    flags = os.O_WRONLY | os.O_CREAT | {"wb": os.O_TRUNC, "ab": os.O_APPEND}[how]
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, how)


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

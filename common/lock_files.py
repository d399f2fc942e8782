"""A lock file that names its holder: an exclusive flock, held for as long as the process keeps the descriptor (the
kernel lets it go when the process exits, SIGKILL included, so no stale lock survives a crash), with the holder's pid
written in the file so that a refusal can name it. Used for a run directory (launcher/run_dir.py) and a replay
shard's directories (replay_server/durability/directory_lock.py).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(Exception):
    """Another process holds the lock; `holder` is the pid it wrote ("unknown" when it wrote none)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by pid {holder}")
        self.path = path
        self.holder = holder


def hold_lock(path: Path) -> int:
    """Lock `path` (created 0600 when missing) for this process and write its pid there; the descriptor to keep
    (closing it releases the lock). LockHeld when another process holds it; OSError when the file system has no
    locks (some FUSE mounts: the descriptor is closed)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeld(path, holder) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd

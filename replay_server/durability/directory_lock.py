"""One shard per directory: a shard holds an exclusive `flock` on DIR/shard.lock in its checkpoint directory (and in
its write-ahead log's, when that is another one) for as long as it runs. A second shard given the same directory
(by a launcher, by hand, by a volume mounted into two pods) is refused at start, naming the directory and the
holder's pid, instead of both writing checkpoint files of the same names and one of them failing. The kernel drops
the lock when its holder exits, SIGKILL included: no stale file to clean up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from apexrl.common.lock_files import LockHeld, hold_lock
from apexrl.common.settings import SettingsError

log = logging.getLogger("apexrl.replay")

LOCK_NAME = "shard.lock"


class DirectoryLock:
    """An exclusive lock on a shard's directory, held from `acquire` until `release` (or the process's exit)."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self.fd = fd

    @classmethod
    def acquire(cls, directory: str | os.PathLike, flag: str) -> DirectoryLock:
        """Lock `directory` (created when missing) for this process; SettingsError naming `flag`, the directory
        and the holder when another process holds it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        try:
            fd = hold_lock(path)
        except LockHeld as held:
            raise SettingsError(
                f"{flag} {directory} is in use by another replay shard (pid {held.holder} holds {path}): give each "
                f"shard its own directory"
            ) from None
        except OSError as err:  # a file system without locks (some FUSE mounts): serve, and say what is lost
            log.warning(
                "cannot lock %s (%s): a second shard given %s would not be refused",
                path,
                err.strerror,
                directory,
            )
            return cls(directory, -1)
        return cls(directory, fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_directories(directories: Iterable[tuple[str, str | os.PathLike | None]]) -> list[DirectoryLock]:
    """Lock every (flag, directory) given (None: none), each directory once (a shard may keep its write-ahead log
    in its checkpoint directory); all or none: on a refusal the locks taken are released before it is raised."""
    locks: list[DirectoryLock] = []
    seen: set[Path] = set()
    try:
        for flag, directory in directories:
            if directory is None or Path(directory).resolve() in seen:
                continue
            seen.add(Path(directory).resolve())
            locks.append(DirectoryLock.acquire(directory, flag))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks

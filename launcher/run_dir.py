"""The run directory's life: its default name, the lock that keeps two launchers out of one run, and the checks
that a new run starts in an empty directory and a resumed one in a finished run.

The lock is `flock` on RUN_DIR/launch.lock, held by the launcher and inherited by every role it starts (the file
descriptor is passed to them), so that it is free exactly when no process of the run is left: a launcher killed
with SIGKILL leaves its roles running, and they still hold it. The kernel drops it with the last holder; no stale
pid file is ever left to clean up.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from apexrl.common.env_settings import EnvChoice
from apexrl.common.lock_files import LockHeld, hold_lock
from apexrl.launcher.fleet_config import ConfigError

CONFIG_NAME = "config.json"
LOCK_NAME = "launch.lock"


def default_run_dir(env: EnvChoice | str) -> str:
    """runs/NAME-TIMESTAMP, NAME the registered id made safe for a file name (no '/', ':' or spaces)."""
    name = (env if isinstance(env, EnvChoice) else EnvChoice(env)).run_name()
    return f"runs/{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class RunLock:
    """An exclusive lock on a run directory, held from `acquire` until `release` (and by the roles it is passed
    to, until they exit)."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self.fd = fd

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Lock `run_dir` (created 0700 when missing); ConfigError naming the holder when a run uses it."""
        if not run_dir.exists():
            run_dir.mkdir(parents=True)
            run_dir.chmod(0o700)  # logs, checkpoints: the run is its owner's alone
        path = run_dir / LOCK_NAME
        try:
            fd = hold_lock(path)
        except LockHeld as held:
            raise ConfigError(
                f"{run_dir} is in use by a running launch (pid {held.holder}, or roles it started, hold {path}): "
                f"stop it first (SIGTERM or Ctrl-C)"
            ) from None
        return cls(run_dir, fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def check_new(run_dir: Path) -> None:
    """ConfigError when `run_dir` holds a run already: a new run never writes over another's files."""
    if (run_dir / CONFIG_NAME).exists():
        raise ConfigError(
            f"{run_dir} already holds a run ({CONFIG_NAME}): continue it with `apexrl launch --resume {run_dir}` "
            f"(apexrl.resume in Python), or choose another run_dir"
        )


def check_resumable(run_dir: Path) -> None:
    """ConfigError unless `run_dir` holds a run to continue (its config.json)."""
    if not run_dir.is_dir():
        raise ConfigError(f"--resume: {run_dir} is not a directory")
    if not (run_dir / CONFIG_NAME).is_file():
        raise ConfigError(f"--resume: {run_dir} holds no run ({CONFIG_NAME} is missing)")

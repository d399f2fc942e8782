"""A shard's checkpoint directory: restoring the newest good checkpoint at start, taking checkpoints (every N
seconds, on request, at shutdown) without stopping the shard, and keeping the newest K.

Files are `checkpoint-NNNNNNNNNN.apexrl`, numbered upwards (checkpoint.py has the format). A file that fails its
checks at start, its checksums or its content (restore_checks.py: NaN or negative priorities, keys that do not fit,
anything a table could never have saved), is renamed `*.corrupt` (kept for inspection, never read again), counted,
and the previous one is tried: a bad file costs the rows since the previous checkpoint, never a crash loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from apexrl.common.errors import InvalidArgumentError, UnavailableError
from apexrl.common.settings import SettingsError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.table_state import TableState
from apexrl.replay_server.core.types import CheckpointResult
from apexrl.replay_server.durability.checkpoint import (
    CheckpointReader,
    CorruptCheckpointError,
    chunk_rows_for,
    fsync_directory,
    write_snapshot,
)
from apexrl.replay_server.durability.durability_metrics import DurabilityStats
from apexrl.replay_server.durability.restore_checks import check_state, checked_blocks
from apexrl.replay_server.durability.snapshot import Snapshot

log = logging.getLogger("apexrl.replay.checkpoint")

_NAME = re.compile(r"checkpoint-(\d{10})\.apexrl(\.corrupt)?")


def signature_difference(saved: Signature, wanted: Signature) -> str:
    """The fields two signatures disagree on, in words."""
    a, b = {f.name: f for f in saved.fields}, {f.name: f for f in wanted.fields}
    parts = [
        f"field {n!r} is {a[n].type_name} there, {b[n].type_name} here" for n in a if n in b and a[n] != b[n]
    ]
    parts += [f"field {n!r} only there" for n in a if n not in b] + [
        f"field {n!r} only here" for n in b if n not in a
    ]
    if not parts and saved.names != wanted.names:
        parts.append(f"the fields are in another order ({', '.join(saved.names)} there)")
    return "; ".join(parts)


class Checkpointer:
    """The checkpoints of one table in one directory. `restore()` once at start (the table refusing calls), then
    `start()` the periodic thread; `request()` asks for a checkpoint (the Checkpoint RPC); `close()` stops the
    thread and writes the final checkpoint.

    `on_written(key)` runs after each durable checkpoint with the smallest inserted_total of the checkpoints kept:
    the write-ahead log drops what all of them cover."""

    def __init__(
        self,
        table: ReplayTable,
        directory: str | Path,
        *,
        keep: int = 2,
        every: float = 0.0,
        max_mb_per_s: float = 0.0,
        stats: DurabilityStats | None = None,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep ({keep}) must be at least 1")
        self.table = table
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.every = every
        self.max_mb_per_s = max_mb_per_s
        self.stats = stats if stats is not None else DurabilityStats()
        self.on_written = on_written
        self._cond = threading.Condition()
        self._waiting: list[Future] = []  # requests served by the next checkpoint to start
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()  # one checkpoint at a time
        self._last_mark: tuple[int, int] | None = None  # (inserted, updated) of the last checkpoint
        self._covered: dict[Path, int] = {}  # checkpoint file -> its inserted_total
        numbers = [int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.fullmatch(p.name))]
        self._next_number = max(numbers, default=0) + 1

    def files(self) -> list[Path]:
        """Good-looking checkpoint files, oldest first (corrupt ones excluded)."""
        return self.list_files(self.directory)

    @staticmethod
    def list_files(directory: str | Path, *, corrupt_too: bool = False) -> list[Path]:
        """The checkpoint files of a directory, oldest first; those renamed `.corrupt` only with `corrupt_too`."""
        found = [
            (int(m.group(1)), p)
            for p in Path(directory).iterdir()
            if (m := _NAME.fullmatch(p.name)) and (corrupt_too or not m.group(2))
        ]
        return [p for _, p in sorted(found)]

    # ------------------------------------------------------------------------------------------------ restore
    def restore(self) -> TableState | None:
        """Load the newest checkpoint that passes its checks (checksums and content) into the (empty, refusing)
        table; return its state, or None when there is none. Raises SettingsError when it was made with another
        signature or alpha than this shard's settings (the shard must refuse to start)."""
        for stray in self.directory.glob(".checkpoint-*.tmp"):
            log.warning("removing %s, left by a checkpoint that never finished", stray)
            stray.unlink(missing_ok=True)
        start = time.monotonic()
        files = self.files()
        for path in reversed(files):
            try:
                with CheckpointReader(path) as reader:
                    state = reader.state
                    try:
                        check_state(state)
                        self._check_fits(state, path)
                        rows = self.table.load_state(state, checked_blocks(state, reader.blocks()))
                    except InvalidArgumentError as err:  # well formed, but no table could have saved it
                        raise CorruptCheckpointError(
                            f"checkpoint {path} holds invalid content: {err}"
                        ) from None
            except (CorruptCheckpointError, OSError) as err:
                self._set_aside(path, err)
                continue
            seconds = time.monotonic() - start
            log.info(
                "restored %d rows (keys %d..%d) from %s in %.2fs",
                rows,
                state.next_key - rows,
                state.next_key - 1,
                path,
                seconds,
            )
            self.stats.restore_seconds, self.stats.restored_rows = seconds, rows
            return state
        if files:
            log.error(
                "NO GOOD CHECKPOINT in %s: all %d were set aside as corrupt; the shard starts without their "
                "rows",
                self.directory,
                len(files),
            )
        return None

    def _set_aside(self, path: Path, err: Exception) -> None:
        """A checkpoint that cannot be trusted: named in the log, renamed `*.corrupt` and counted."""
        log.error(
            "CORRUPT CHECKPOINT skipped: %s; renamed to %s.corrupt, trying the previous one", err, path.name
        )
        path.rename(path.with_name(path.name + ".corrupt"))
        with self.stats.lock:
            self.stats.corrupt_checkpoints += 1

    def _check_fits(self, state: TableState, path: Path) -> None:
        config = self.table.config
        if config.signature is not None and state.signature != config.signature:
            raise SettingsError(
                f"checkpoint {path} was made with signature {state.signature}, this shard is started with "
                f"--signature {config.signature}: {signature_difference(state.signature, config.signature)}. Start "
                f"with the checkpoint's signature or another --checkpoint-dir"
            )
        saved, mine = state.max_sequence_length, config.max_sequence_length
        if bool(saved) != bool(mine) or saved > mine:
            kind = f"a sequence table of items up to {saved} steps" if saved else "a table of transitions"
            raise SettingsError(
                f"checkpoint {path} holds {kind}, this shard is started with --max-sequence-length {mine}: start "
                f"with --max-sequence-length {saved} or another --checkpoint-dir"
            )
        if (
            config.item_signature is not None
            and state.item_signature is not None
            and state.item_signature != config.item_signature
        ):
            raise SettingsError(
                f"checkpoint {path} was made with --item-signature {state.item_signature}, this shard with "
                f"{config.item_signature}: start with the checkpoint's or another --checkpoint-dir"
            )
        if state.alpha != config.alpha:
            raise SettingsError(
                f"checkpoint {path} stores priorities ** {state.alpha}, this shard is started with --alpha "
                f"{config.alpha}: start with --alpha {state.alpha} or another --checkpoint-dir"
            )
        if state.capacity != config.capacity:
            log.warning(
                "checkpoint %s was made with capacity %d, this shard has %d%s",
                path,
                state.capacity,
                config.capacity,
                ""
                if state.size <= config.capacity
                else f": its {state.size - config.capacity} oldest rows are dropped",
            )

    # -------------------------------------------------------------------------------------------- checkpoints
    def checkpoint(self, *, paced: bool = True) -> CheckpointResult:
        """Take a checkpoint now, in this thread (waiting for one in progress); return it once durable, written at
        `max_mb_per_s` unless not `paced`. FailedPreconditionError when the table has no signature yet; OSError
        when the file cannot be written."""
        with self._write_lock:
            info = self.table.info()
            chunk_rows = (
                chunk_rows_for(info.signature, info.stored_bytes / info.size if info.size else None)
                if info.signature
                else 1
            )
            start = time.monotonic()
            number, self._next_number = self._next_number, self._next_number + 1
            path = self.directory / f"checkpoint-{number:010d}.apexrl"
            try:
                with Snapshot.take(self.table, chunk_rows) as snapshot:
                    size = write_snapshot(path, snapshot, self.max_mb_per_s * 1e6 if paced else 0.0)
            except OSError:
                with self.stats.lock:
                    self.stats.checkpoints_failed += 1
                raise
            state = snapshot.state
            seconds = time.monotonic() - start
            self._last_mark = (state.next_key, state.counters.get("updated", 0))
            with self.stats.lock:
                s = self.stats
                s.checkpoints_written += 1
                s.last_checkpoint_unix_seconds, s.last_checkpoint_bytes = time.time(), size
                s.last_checkpoint_seconds, s.last_checkpoint_rows = seconds, state.size
            log.info("checkpoint %s: %d rows, %.1f MB in %.2fs", path.name, state.size, size / 1e6, seconds)
            self._covered[path] = state.next_key
            kept = self._prune()
            if self.on_written is not None and kept:
                self.on_written(min(kept))
            return CheckpointResult(
                path=str(path),
                rows=state.size,
                inserted_total=state.next_key,
                bytes=size,
                seconds=seconds,
                incarnation=state.incarnation,
            )

    def _prune(self) -> list[int]:
        """Delete all but the newest `keep` checkpoints; return the kept ones' inserted_total."""
        files = self.files()
        for old in files[: -self.keep]:
            old.unlink(missing_ok=True)
            self._covered.pop(old, None)
        fsync_directory(self.directory)
        for path in files[-self.keep :]:
            if path not in self._covered:  # written by an earlier process: read its footer once
                try:
                    with CheckpointReader(path) as reader:
                        self._covered[path] = reader.state.next_key
                except (CorruptCheckpointError, OSError):
                    continue
        return [self._covered[p] for p in files[-self.keep :] if p in self._covered]

    def request(self) -> Future:
        """A future of the next checkpoint to start (the Checkpoint RPC): its CheckpointResult or its error."""
        future: Future = Future()
        try:
            self.table.check_available()  # restoring: answer at once rather than after the restore
        except UnavailableError as err:
            future.set_exception(err)
            return future
        with self._cond:
            if self._stopping:
                future.set_exception(UnavailableError("the shard is shutting down"))
                return future
            self._waiting.append(future)
            self._cond.notify_all()
        return future

    def _take(self, waiters: list[Future]) -> None:
        try:
            result = self.checkpoint()
        except Exception as err:  # noqa: BLE001 (handed to every caller; the shard goes on serving)
            log.error("checkpoint failed: %s", err)
            for w in waiters:
                w.set_exception(err)
            return
        for w in waiters:
            w.set_result(result)

    def start(self) -> None:
        """Start the thread that serves requests and, with `every` > 0, takes a checkpoint every `every` seconds
        when the table changed."""
        self._thread = threading.Thread(target=self._run, name="apexrl-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        due = time.monotonic() + self.every if self.every > 0 else None
        while True:
            with self._cond:
                while not (self._waiting or self._stopping or (due is not None and time.monotonic() >= due)):
                    self._cond.wait(None if due is None else max(0.0, due - time.monotonic()))
                if self._stopping:
                    return
                waiters, self._waiting = self._waiting, []
            if waiters or self._changed():
                self._take(waiters)
            if self.every > 0:
                due = time.monotonic() + self.every

    def _changed(self) -> bool:
        info = self.table.info()
        return info.signature is not None and (info.inserted_total, info.updated_total) != self._last_mark

    def close(self, *, final: bool = True) -> CheckpointResult | None:
        """Stop taking checkpoints (the one in progress finishes); with `final`, write one last checkpoint, which
        also answers the requests still waiting. Returns it (None when the table has nothing to save)."""
        with self._cond:
            self._stopping = True
            waiters, self._waiting = self._waiting, []
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        result = None
        if final and self.table.signature is not None:
            try:
                result = self.checkpoint(paced=False)  # the server has stopped: no call to leave CPU to
            except OSError as err:
                log.error("final checkpoint failed: %s", err)
                for w in waiters:
                    w.set_exception(err)
                return None
        for w in waiters:
            if result is not None:
                w.set_result(result)
            else:
                w.set_exception(UnavailableError("the shard shut down before checkpointing"))
        return result

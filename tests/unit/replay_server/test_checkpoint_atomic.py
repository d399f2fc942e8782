"""A checkpoint is written to a temporary file and renamed to its final name only once whole (checkpoint.py): while
it is written, and after a write that ends in an error, nothing lies under its final name and the previous
checkpoint is the one restored, without a corrupt file to set aside. (A writer killed mid-write:
integration/replay_server/test_checkpoint_crash.py.)"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator

import pytest

from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpoint import write_snapshot
from apexrl.replay_server.durability.checkpointer import Checkpointer
from apexrl.replay_server.durability.snapshot import Snapshot
from tests.conftest import cartpole_batch


class PausedSnapshot:
    """A real table snapshot whose chunks stop after the first until `resume()`; then the rest follow, or `error`
    is raised in the writer (a full disk, say)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self.chunk_rows = snapshot.chunk_rows
        self.paused = threading.Event()
        self._resumed = threading.Event()
        self.error: BaseException | None = None

    @property
    def state(self):
        return self._snapshot.state

    def resume(self, error: BaseException | None = None) -> None:
        self.error = error
        self._resumed.set()

    def chunks(self) -> Iterator:
        chunks = self._snapshot.chunks()
        yield next(chunks)
        self.paused.set()
        assert self._resumed.wait(30), "the test never resumed the write"
        if self.error is not None:
            raise self.error
        yield from chunks


def table() -> ReplayTable:
    return ReplayTable(TableConfig(capacity=1000, seed=0))


@pytest.mark.timeout(60)
def test_a_checkpoint_being_written_or_failed_mid_write_leaves_nothing_under_its_name(tmp_path):
    t = table()
    t.insert(cartpole_batch(100))
    checkpointer = Checkpointer(t, tmp_path)
    previous = checkpointer.checkpoint().path
    t.insert(cartpole_batch(200, 100))
    final = tmp_path / "checkpoint-0000000002.apexrl"
    errors: list[BaseException] = []

    with Snapshot.take(t, chunk_rows=50) as snapshot:
        paused = PausedSnapshot(snapshot)

        def write() -> None:
            try:
                write_snapshot(final, paused)
            except OSError as err:
                errors.append(err)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            assert paused.paused.wait(30), "the writer never wrote its first chunk"
            names = sorted(p.name for p in tmp_path.iterdir())
            assert names == [".checkpoint-0000000002.apexrl.tmp", "checkpoint-0000000001.apexrl"], (
                f"while checkpoint 2 is written the directory holds {names}: it must be only in a temporary file"
            )
        finally:
            paused.resume(OSError(errno.ENOSPC, "No space left on device"))
            writer.join(30)
    assert [type(e) for e in errors] == [OSError]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-0000000001.apexrl"]

    restored = table()
    restored.refuse_calls("restoring")
    again = Checkpointer(restored, tmp_path)
    state = again.restore()
    assert str(Checkpointer.list_files(tmp_path, corrupt_too=True)[0]) == previous
    assert (state.next_key, restored.info().size, again.stats.corrupt_checkpoints) == (100, 100, 0)

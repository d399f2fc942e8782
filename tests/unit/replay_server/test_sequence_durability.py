"""A sequence table's items survive what a table of transitions survives: a checkpoint (taken while the table keeps
changing), the write-ahead log's replay, and both together; the restored table goes on where the saved one stopped
(its writers' later windows reach back into restored steps)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpoint import CheckpointReader, write_snapshot
from apexrl.replay_server.durability.restore_checks import check_state, checked_blocks
from apexrl.replay_server.durability.snapshot import Snapshot
from apexrl.replay_server.durability.wal import WriteAheadLog

STEP = Signature.parse("obs:float32[2],action:int64[]")
WINDOW, PERIOD = 6, 3


def make_table(capacity: int = 200, **kwargs) -> ReplayTable:
    config = {"capacity": capacity, "max_sequence_length": WINDOW, "signature": STEP, "seed": 0, "alpha": 0.7}
    return ReplayTable(TableConfig(**{**config, **kwargs}))


class Trajectories:
    """Three trajectories of one writer stepping in turn, `PERIOD` steps per insert, a window in each insert once
    a trajectory has WINDOW steps. Step values name (trajectory, step): 1000 * trajectory + step."""

    def __init__(self) -> None:
        self.steps = [0, 0, 0]
        self.sequence = 0

    def write(self, table: ReplayTable, rounds: int) -> None:
        for _ in range(rounds):
            for trajectory in range(3):
                first = self.steps[trajectory]
                values = 1000 * trajectory + np.arange(first, first + PERIOD, dtype=np.float32)
                end = first + PERIOD
                items = None
                if end >= WINDOW:
                    start = end - WINDOW
                    items = ItemBatch(
                        np.array([PERIOD]),
                        np.array([WINDOW]),
                        {"state": np.array([[1000 * trajectory + start, 0]], np.float32)},
                        np.array([1.0 + (end % 7)]),
                    )
                self.sequence += 1
                table.insert(
                    {"obs": np.stack([values, -values], axis=1), "action": values.astype(np.int64)},
                    writer_id="actor",
                    sequence=self.sequence,
                    items=items,
                    trajectory=trajectory,
                )
                self.steps[trajectory] = end


def contents(table: ReplayTable) -> dict[int, tuple]:
    """Every item by key: its steps' obs, its length, state and priority (drawn by sampling the whole mass)."""
    info = table.info()
    batch = table.sample(4000)
    obs = batch.columns["obs"].reshape(len(batch.keys), WINDOW, 2)[:, :, 0]
    found = {
        int(key): (tuple(o.tolist()), int(length), tuple(state.tolist()), float(priority))
        for key, o, length, state, priority in zip(
            batch.keys, obs, batch.lengths, batch.item_columns["state"], batch.priorities, strict=True
        )
    }
    assert len(found) == info.size  # every item drawn at least once (4,000 draws, a few dozen items)
    return found


def check_windows(found: dict[int, tuple]) -> None:
    for steps, length, state, _ in found.values():
        assert steps[0] == state[0]  # the state was taken at the window's first step
        np.testing.assert_array_equal(np.diff(steps[:length]), 1)  # one trajectory's consecutive steps


def restore_from_file(path, **kwargs) -> ReplayTable:
    restored = make_table(**kwargs)
    restored.refuse_calls("restoring")
    with CheckpointReader(path) as reader:
        check_state(reader.state)
        restored.load_state(reader.state, checked_blocks(reader.state, reader.blocks()))
    restored.refuse_calls(None)
    return restored


def test_a_checkpoint_restores_every_item_and_the_writers_go_on(tmp_path) -> None:
    original, writer = make_table(), Trajectories()
    writer.write(original, 30)  # 270 steps into 200 slots: the ring has wrapped, early items are gone
    path = tmp_path / "checkpoint"
    with Snapshot.take(original, 16) as snapshot:
        write_snapshot(path, snapshot)
    restored = restore_from_file(path)
    assert restored.info().size == original.info().size
    assert restored.info().steps == original.info().steps
    expected = contents(original)
    assert contents(restored) == expected
    check_windows(expected)
    later = Trajectories()
    later.steps, later.sequence = list(writer.steps), writer.sequence
    later.write(restored, 2)  # windows reach back into restored steps: the tails came back too
    writer.write(original, 2)
    assert contents(restored) == contents(original)


def test_a_checkpoint_is_the_table_at_one_instant_while_writes_go_on(tmp_path) -> None:
    table, writer = make_table(), Trajectories()
    writer.write(table, 10)
    expected = contents(table)
    with Snapshot.take(table, 16) as snapshot:
        writer.write(table, 12)  # overwrites, links and items into earlier steps, before any chunk is copied
        write_snapshot(tmp_path / "checkpoint", snapshot)
    restored = restore_from_file(tmp_path / "checkpoint")
    assert contents(restored) == expected


def test_the_write_ahead_log_replays_items_with_their_priorities(tmp_path) -> None:
    original, writer = make_table(), Trajectories()
    log = WriteAheadLog(tmp_path)
    log.open(original)
    writer.write(original, 25)
    done = threading.Event()
    log.when_durable(original.next_key, lambda error: done.set())
    assert done.wait(10)
    log.close()
    replayed = make_table()
    replayed.refuse_calls("restoring")
    WriteAheadLog(tmp_path).replay(replayed, restored=False)
    replayed.refuse_calls(None)
    assert contents(replayed) == contents(original)


def test_a_checkpoint_then_the_log_gives_back_the_table(tmp_path) -> None:
    original, writer = make_table(), Trajectories()
    log = WriteAheadLog(tmp_path / "wal")
    log.open(original)
    writer.write(original, 8)
    with Snapshot.take(original, 16) as snapshot:
        write_snapshot(tmp_path / "checkpoint", snapshot)
    writer.write(original, 8)  # after the checkpoint: only in the log
    done = threading.Event()
    log.when_durable(original.next_key, lambda error: done.set())
    assert done.wait(10)
    log.close()
    restored = make_table()
    restored.refuse_calls("restoring")
    with CheckpointReader(tmp_path / "checkpoint") as reader:
        restored.load_state(reader.state, checked_blocks(reader.state, reader.blocks()))
    WriteAheadLog(tmp_path / "wal").replay(restored, restored=True)
    restored.refuse_calls(None)
    assert contents(restored) == contents(original)


def test_a_sequence_checkpoint_does_not_load_into_a_table_of_transitions(tmp_path) -> None:
    original = make_table()
    Trajectories().write(original, 3)
    with Snapshot.take(original, 16) as snapshot:
        write_snapshot(tmp_path / "checkpoint", snapshot)
    plain = ReplayTable(TableConfig(capacity=200, signature=STEP, alpha=0.7))
    plain.refuse_calls("restoring")
    with (
        CheckpointReader(tmp_path / "checkpoint") as reader,
        pytest.raises(InvalidArgumentError, match="sequence"),
    ):
        plain.load_state(reader.state, reader.blocks())
    assert plain.info().inserted_total == 0


@pytest.mark.parametrize(("sources", "targets"), [(2, 3), (3, 1)])
def test_resharding_moves_each_trajectory_whole_with_its_items(tmp_path, sources, targets) -> None:
    from collections import Counter

    from apexrl.replay_server.durability.checkpointer import Checkpointer
    from apexrl.replay_server.durability.reshard import reshard

    expected: Counter = Counter()
    source_dirs = []
    for m in range(sources):
        table = make_table(capacity=150 + 40 * m, seed=m)
        Trajectories().write(table, 12 + 5 * m)  # wrapped: the oldest steps and their items are gone
        expected.update(item[:3] + (item[3],) for item in contents(table).values())
        source_dirs.append(tmp_path / f"old{m}")
        Checkpointer(table, source_dirs[-1]).checkpoint()
    target_dirs = [tmp_path / f"new{n}" for n in range(targets)]
    result = reshard(source_dirs, target_dirs)
    found: Counter = Counter()
    for directory, rows in zip(target_dirs, result.rows, strict=True):
        (path,) = Checkpointer.list_files(directory)
        restored = restore_from_file(path, capacity=max(rows, 1))
        items = contents(restored) if restored.info().size else {}
        check_windows(items)  # each window's steps are still one trajectory's, in order
        found.update(item[:3] + (item[3],) for item in items.values())
    assert found == expected  # every item once, with its steps, length, state and priority
    assert sum(result.rows) == result.source_rows

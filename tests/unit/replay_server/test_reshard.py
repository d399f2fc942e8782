"""Resharding checkpoints offline (replay_server/durability/reshard.py): M saved shards onto N, every row once with its
priority, even shares of every source and age, in place, and what is refused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from apexrl.common.settings import SettingsError
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpoint import CheckpointReader
from apexrl.replay_server.durability.checkpointer import Checkpointer
from apexrl.replay_server.durability.reshard import reshard
from tests.conftest import cartpole_batch


def saved_shard(directory, ids: range, capacity: int, seed: int, extra: bool = False) -> None:
    """A shard whose rows are numbered `ids` (the last `capacity` of them held), with random priorities (and a
    column more with `extra`)."""
    t = ReplayTable(TableConfig(capacity=capacity, alpha=0.6, seed=seed))
    rng = np.random.default_rng(seed)
    for start in range(ids.start, ids.stop, 97):
        rows = min(97, ids.stop - start)
        columns = cartpole_batch(rows, start) | ({"extra": np.zeros(rows, np.uint8)} if extra else {})
        t.insert(columns, rng.random(rows) * 10)
    Checkpointer(t, directory).checkpoint()


def rows_in(directory) -> list[tuple[int, int, float]]:
    """(key, row id, stored priority) of every row of a directory's newest checkpoint."""
    (path,) = Checkpointer.list_files(directory)
    out = []
    with CheckpointReader(path) as reader:
        for first, columns, leaves in reader.blocks():
            for i in range(len(leaves)):
                assert (
                    columns["obs"][i, 0] == columns["action"][i]
                    and columns["next_obs"][i, 0] == columns["action"][i] + 1
                )
                out.append((first + i, int(columns["action"][i]), float(leaves[i])))
    return out


@pytest.mark.parametrize(("sources", "targets"), [(2, 3), (3, 1), (1, 4), (3, 3)])
def test_every_row_goes_to_exactly_one_new_shard_with_its_priority(tmp_path, sources, targets):
    spec = [
        (range(1000 * m, 1000 * m + 700 + 150 * m), 500 + 100 * m) for m in range(sources)
    ]  # some wrapped
    src = [tmp_path / f"old{m}" for m in range(sources)]
    for m, (ids, capacity) in enumerate(spec):
        saved_shard(src[m], ids, capacity, seed=m)
    before = [row for d in src for row in rows_in(d)]
    dst = [tmp_path / f"new{n}" for n in range(targets)]
    result = reshard(src, dst)
    after = [rows_in(d) for d in dst]

    # Every row exactly once, with its priority bit for bit: the same multiset of (row, priority).
    assert Counter((i, p) for _, i, p in before) == Counter((i, p) for part in after for _, i, p in part)
    assert sum(result.rows) == result.source_rows == len(before)
    assert result.rows == [len(part) for part in after]
    assert max(result.rows) - min(result.rows) <= 1  # even shares
    for part, leaf_sum in zip(after, result.leaf_sums, strict=True):
        assert [k for k, _, _ in part] == list(range(len(part)))  # keys 0, 1, ... in age order
        assert leaf_sum == pytest.approx(sum(p for _, _, p in part))
    # Each target holds an even share of each source, and of its old and new halves (ages interleaved).
    for ids, _ in spec:
        held = sorted(i for _, i, _ in before if ids.start <= i < ids.stop)
        halves = held[: len(held) // 2], held[len(held) // 2 :]
        for part in after:
            mine = {i for _, i, _ in part}
            for half in halves:
                assert abs(len(mine.intersection(half)) - len(half) / targets) <= sources + 1
        # Within a target, a source's rows keep their age order.
        for part in after:
            order = [i for _, i, _ in part if ids.start <= i < ids.stop]
            assert order == sorted(order)
    capacity = -(-sum(c for _, c in spec) // targets)
    with CheckpointReader(Checkpointer.list_files(dst[0])[0]) as reader:
        state = reader.state
    assert (state.capacity, state.incarnation, state.writers, state.alpha) == (capacity, 0, (), 0.6)


def test_a_resharded_checkpoint_restores_and_serves(tmp_path):
    saved_shard(tmp_path / "a", range(0, 300), 300, seed=1)
    saved_shard(tmp_path / "b", range(1000, 1300), 300, seed=2)
    reshard([tmp_path / "a", tmp_path / "b"], [tmp_path / "x", tmp_path / "y", tmp_path / "z"])
    t = ReplayTable(TableConfig(capacity=200, alpha=0.6))
    t.refuse_calls("restoring")
    assert Checkpointer(t, tmp_path / "y").restore().size == 200
    t.refuse_calls(None)
    assert t.info().size == 200 and t.info().inserted_total == 200
    assert t.insert(cartpole_batch(10, 5000)).first_key == 200
    assert t.info().size == 200  # full: the oldest row went


def test_resharding_in_place_replaces_the_old_checkpoints(tmp_path):
    src = [tmp_path / "0", tmp_path / "1"]
    saved_shard(src[0], range(0, 100), 100, seed=1)
    saved_shard(src[1], range(100, 200), 100, seed=2)
    before = Counter(i for d in src for _, i, _ in rows_in(d))
    dst = [*src, tmp_path / "2"]
    result = reshard(src, dst)
    assert [p.name for p in result.paths] == [
        "checkpoint-0000000002.apexrl",
        "checkpoint-0000000002.apexrl",
        "checkpoint-0000000001.apexrl",
    ]
    assert (
        Counter(i for d in dst for _, i, _ in rows_in(d)) == before
    )  # rows_in: one checkpoint per directory


def test_what_is_refused(tmp_path):
    saved_shard(tmp_path / "a", range(0, 100), 100, seed=1)
    saved_shard(tmp_path / "b", range(0, 100), 100, seed=2)
    saved_shard(tmp_path / "wide", range(0, 100), 100, seed=3, extra=True)
    with pytest.raises(SettingsError, match="field 'extra' only there"):
        reshard([tmp_path / "a", tmp_path / "wide"], [tmp_path / "x"])
    with pytest.raises(SettingsError, match="already holds checkpoints"):
        reshard([tmp_path / "a"], [tmp_path / "b"])
    with pytest.raises(SettingsError, match="200 rows do not fit in 2 shards of capacity 60"):
        reshard([tmp_path / "a", tmp_path / "b"], [tmp_path / "x", tmp_path / "y"], capacity=60)
    with pytest.raises(SettingsError, match="holds no checkpoint"):
        reshard([tmp_path / "x"], [tmp_path / "y"])
    assert not list((tmp_path / "x").glob("*.apexrl")) and not list((tmp_path / "x").glob(".*tmp"))


def test_compressed_rows_are_resharded_frame_for_frame_with_their_writers(tmp_path):
    from apexrl.common.compression import decompress
    from apexrl.replay_server.core.table_state import ROW_WRITER
    from tests.conftest import frame_ids, pixel_batch

    sources = [tmp_path / "a", tmp_path / "b"]
    for m, directory in enumerate(sources):
        t = ReplayTable(TableConfig(capacity=150, alpha=0.6, seed=m))
        for start in range(1000 * m, 1000 * m + 200, 20):  # wraps: the last 150 held
            t.insert(pixel_batch(20, start), np.full(20, 1.0 + m), writer_id=f"actor-{m}", sequence=start)
        Checkpointer(t, directory).checkpoint()
    targets = [tmp_path / "x", tmp_path / "y", tmp_path / "z"]
    result = reshard(sources, targets)
    assert sum(result.rows) == 300
    seen = []
    for directory in targets:
        (path,) = Checkpointer.list_files(directory)
        with CheckpointReader(path) as reader:
            for _, columns, _leaves in reader.blocks():
                ids = columns["action"]
                np.testing.assert_array_equal(frame_ids(decompress(columns["obs"])[0]), ids)
                np.testing.assert_array_equal(frame_ids(decompress(columns["next_obs"])[0]), ids + 1)
                assert list(columns[ROW_WRITER]) == [f"actor-{i // 1000}" for i in ids]
                seen += ids.tolist()
    assert sorted(seen) == sorted([*range(50, 200), *range(1050, 1200)])
    t = ReplayTable(TableConfig(capacity=100, alpha=0.6))
    t.refuse_calls("restoring")
    assert Checkpointer(t, targets[1]).restore().size == 100
    t.refuse_calls(None)
    assert t.sample(10).writers[0].startswith("actor-")

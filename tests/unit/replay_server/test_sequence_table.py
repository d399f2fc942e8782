"""Sequence tables (replay_server/core/sequences.py): items are windows of one writer's steps, stored once, evicted
with their first step, sampled and prioritised as items."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable
from apexrl.replay_server.core.table_config import TableConfig

STEP = Signature.parse("obs:float32[3],action:int64[]")
STATE = Signature.parse("state:float32[2,4]")


def make_table(capacity: int = 1000, length: int = 6, **kwargs) -> ReplayTable:
    return ReplayTable(
        TableConfig(
            capacity=capacity,
            max_sequence_length=length,
            signature=STEP,
            item_signature=kwargs.pop("item_signature", STATE),
            seed=0,
            **kwargs,
        )
    )


def steps(first: int, rows: int) -> dict[str, np.ndarray]:
    """`rows` steps whose obs[0] is their step number (first, first + 1, ...), so a test can read them back."""
    numbers = np.arange(first, first + rows, dtype=np.float32)
    return {"obs": np.stack([numbers, numbers, numbers], axis=1), "action": numbers.astype(np.int64)}


def items(ends, lengths, priorities=None, state_value: float = 0.0) -> ItemBatch:
    count = len(ends)
    return ItemBatch(
        ends=np.asarray(ends, dtype=np.int64),
        lengths=np.asarray(lengths, dtype=np.int64),
        columns={"state": np.full((count, 2, 4), state_value, dtype=np.float32)},
        priorities=None if priorities is None else np.asarray(priorities, dtype=np.float64),
    )


class Writer:
    """One actor's episode: sends `period` steps per insert with the window that ends there."""

    def __init__(self, table: ReplayTable, writer_id: str, window: int, period: int) -> None:
        self.table, self.writer_id, self.window, self.period = table, writer_id, window, period
        self.sent = 0
        self.sequence = 0

    def send(self, rows: int, item_lengths=(), priorities=None):
        ends = [rows] * len(item_lengths)
        batch = items(ends, item_lengths, priorities) if item_lengths else None
        self.sequence += 1
        result = self.table.insert(
            steps(self.sent, rows), writer_id=self.writer_id, sequence=self.sequence, items=batch
        )
        self.sent += rows
        return result


def test_items_refer_to_steps_stored_once_and_sample_as_windows() -> None:
    table = make_table(length=6)
    writer = Writer(table, "a", window=6, period=3)
    writer.send(3)
    result = writer.send(3, item_lengths=[6])  # steps 0..5
    assert result.items == 1
    writer.send(3, item_lengths=[6])  # steps 3..8: steps 3..5 shared, not copied
    info = table.info()
    assert (info.size, info.steps, info.inserted_total) == (2, 9, 9)
    batch = table.sample(64)
    obs = batch.columns["obs"].reshape(64, 6, 3)[:, :, 0]
    starts = obs[:, 0]
    assert set(starts.tolist()) == {0.0, 3.0}
    np.testing.assert_array_equal(obs, starts[:, None] + np.arange(6))
    assert set(batch.keys.tolist()) == {0, 3}  # an item's key is its first step's key
    assert batch.lengths.tolist() == [6] * 64
    assert batch.item_columns["state"].shape == (64, 2, 4)
    assert batch.sequence_length == 6


def test_interleaved_writers_keep_their_own_steps() -> None:
    table = make_table(length=4)
    a, b = Writer(table, "a", 4, 2), Writer(table, "b", 4, 2)
    for _ in range(3):
        a.send(2, item_lengths=[4] if a.sent >= 2 else [])
        b.sent += 100  # b's step numbers differ from a's
        b.send(2, item_lengths=[4] if b.sent >= 102 else [])
        b.sent -= 100
    batch = table.sample(200)
    obs = batch.columns["obs"].reshape(200, 4, 3)[:, :, 0]
    np.testing.assert_array_equal(
        np.diff(obs, axis=1), 1
    )  # consecutive steps of one writer, never the other's


def test_short_items_are_padded_with_their_last_step() -> None:
    table = make_table(length=6)
    writer = Writer(table, "a", 6, 3)
    writer.send(2, item_lengths=[2])  # an episode that ended after 2 steps
    batch = table.sample(4)
    obs = batch.columns["obs"].reshape(4, 6, 3)[:, :, 0]
    np.testing.assert_array_equal(obs, [[0, 1, 1, 1, 1, 1]] * 4)
    assert batch.lengths.tolist() == [2] * 4


def test_an_item_leaves_with_its_first_step_and_is_never_sampled_after() -> None:
    table = make_table(capacity=10, length=4)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    writer.send(2, item_lengths=[4])  # item at key 0: steps 0..3
    writer.send(2, item_lengths=[4])  # item at key 2: steps 2..5
    assert table.info().size == 2
    writer.send(4)  # keys 6..9: the ring is full, nothing evicted yet
    assert table.info().size == 2
    writer.send(1)  # key 10 overwrites key 0: its item goes, whatever its other steps
    info = table.info()
    assert (info.size, info.items_evicted_total) == (1, 1)
    batch = table.sample(50)
    assert set(batch.keys.tolist()) == {2}
    writer.send(2)  # keys 11, 12 overwrite keys 1, 2
    assert table.info().size == 0


def test_the_mass_is_the_held_items_only_while_the_ring_wraps() -> None:
    """Steps carry no leaf of the sum tree: only the held items' first steps do, so overwriting a step clears a
    leaf only where an item started (the table no longer writes a zero per step), and the total is always the held
    items' priorities, however often the ring wraps."""
    table = make_table(capacity=23, length=6, alpha=1.0)
    table.insert(steps(0, 3), writer_id="a", sequence=1)
    sent = 3
    for i in range(40):  # windows of 6 every 3 steps, 1 or 2 per insert
        count = 1 + i % 2
        rows = 3 * count
        batch_items = items(
            [3 * (j + 1) for j in range(count)], [6] * count, [1.0 + i + j for j in range(count)]
        )
        table.insert(steps(sent, rows), writer_id="a", sequence=i + 2, items=batch_items)
        sent += rows
        batch = table.sample(64)
        info = table.info()
        assert info.size <= 23 // 3 and set(batch.keys.tolist()) <= set(range(sent - 23, sent))
        leaves = table._tree.leaf_values()
        assert np.count_nonzero(leaves) == info.size  # one leaf per held item, none per step
        assert info.total_priority == pytest.approx(leaves.sum())
        for key, length in zip(batch.keys.tolist(), batch.lengths.tolist(), strict=True):
            assert length == 6 and key % 3 == 0  # every draw is an item's first step


def test_an_item_whose_first_step_is_gone_on_arrival_is_dropped_and_counted() -> None:
    table = make_table(capacity=4, length=4)
    a, b = Writer(table, "a", 4, 2), Writer(table, "b", 4, 2)
    a.send(2)
    b.send(2)
    b.send(1)  # the ring (4 steps) overwrites a's first step
    result = a.send(2, item_lengths=[4])
    assert result.items == 0
    info = table.info()
    assert (info.size, info.items_inserted_total, info.items_evicted_total) == (0, 1, 1)


def test_priorities_are_per_item_and_sampling_follows_them() -> None:
    table = make_table(capacity=10_000, length=4, alpha=1.0)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    for priority in (1.0, 2.0, 3.0, 4.0):
        writer.send(2, item_lengths=[4], priorities=[priority])
    batches = [table.sample(7) for _ in range(4000)]  # 7 strata each: uneven against the 4 items
    drawn = np.concatenate([batch.keys for batch in batches])
    keys, counts = np.unique(drawn, return_counts=True)
    assert keys.tolist() == [0, 2, 4, 6]
    expected = np.array([1.0, 2.0, 3.0, 4.0]) / 10.0 * len(drawn)
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    np.testing.assert_allclose(batches[0].probabilities, batches[0].priorities / 10.0)


def test_updates_apply_to_items_and_steps_that_begin_none_are_stale() -> None:
    table = make_table(length=4, alpha=1.0)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    writer.send(2, item_lengths=[4])
    result = table.update_priorities(np.array([0, 1, 99]), np.array([5.0, 5.0, 5.0]))
    assert (result.applied, result.stale) == (1, 2)
    assert result.totals.total_priority == pytest.approx(5.0)
    assert result.totals.size == 1


def test_zero_mass_samples_items_uniformly() -> None:
    table = make_table(length=4)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    writer.send(2, item_lengths=[4], priorities=[0.0])
    writer.send(2, item_lengths=[4], priorities=[0.0])
    batch = table.sample(100)
    assert set(batch.keys.tolist()) == {0, 2}
    np.testing.assert_allclose(batch.probabilities, 0.5)


def test_min_size_counts_items() -> None:
    table = make_table(length=4, min_size_to_sample=2)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    writer.send(2, item_lengths=[4])
    with pytest.raises(Exception, match="min_size_to_sample"):
        table.sample(1)
    writer.send(2, item_lengths=[4])
    assert len(table.sample(1).keys) == 1


def test_take_keeps_each_items_steps() -> None:
    table = make_table(length=4)
    writer = Writer(table, "a", 4, 2)
    writer.send(2)
    writer.send(2, item_lengths=[4])
    writer.send(2, item_lengths=[4])
    batch = table.sample(8)
    part = batch.take(np.array([1, 3]))
    obs = part.columns["obs"].reshape(2, 4, 3)[:, :, 0]
    np.testing.assert_array_equal(obs[:, 0], part.keys.astype(np.float32))
    assert part.item_columns["state"].shape == (2, 2, 4)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"item_batch": items([3], [7])}, "items.length[0]"),  # longer than declared
        ({"item_batch": items([4], [3])}, "items.end[0]"),  # ends past the batch
        ({"item_batch": items([3], [5])}, "items.length[0]"),  # steps the shard does not hold
        (
            {
                "item_batch": ItemBatch(
                    np.array([3]), np.array([3]), {"state": np.zeros((1, 3, 4), np.float32)}
                )
            },
            "items.columns",
        ),  # a state of the wrong shape
        ({"item_batch": items([3, 3], [3, 3])}, "items: two items"),
        ({"item_batch": items([3], [3], priorities=[np.nan])}, "items.priorities"),
        ({"item_batch": items([3], [3]), "priorities": np.ones(3)}, "priorities"),
        ({"item_batch": items([3], [3]), "writer_id": ""}, "writer_id"),
        ({"item_batch": items([3], [3, 2])}, "items.length has 2"),
    ],
)
def test_bad_items_are_refused_whole_naming_the_field(kwargs, field) -> None:
    table = make_table(length=6)
    before = table.info()
    with pytest.raises(InvalidArgumentError, match=field.replace("[", r"\[").replace("]", r"\]")):
        table.insert(
            steps(0, 3),
            kwargs.get("priorities"),
            writer_id=kwargs.get("writer_id", "a"),
            sequence=1,
            items=kwargs["item_batch"],
        )
    after = table.info()
    assert (after.steps, after.size, after.inserted_total) == (before.steps, 0, 0)
    # and the writer can go on: nothing of the refused insert is held against it
    assert table.insert(steps(0, 3), writer_id="a", sequence=1, items=items([3], [3])).items == 1


def test_the_first_items_fix_the_item_fields() -> None:
    table = make_table(length=6, item_signature=None)
    table.insert(steps(0, 3), writer_id="a", sequence=1, items=items([3], [3]))
    assert table.info().item_signature == STATE
    wrong = ItemBatch(np.array([3]), np.array([3]), {"state": np.zeros((1, 8), np.float32)})
    with pytest.raises(InvalidArgumentError, match="items.columns: column 'state'"):
        table.insert(steps(3, 3), writer_id="a", sequence=2, items=wrong)


def test_an_item_may_not_start_where_another_does() -> None:
    table = make_table(length=6)
    writer = Writer(table, "a", 6, 3)
    writer.send(3, item_lengths=[3])
    with pytest.raises(InvalidArgumentError, match="already starts"):
        writer.send(3, item_lengths=[6])


def test_items_on_a_transition_table_are_refused() -> None:
    table = ReplayTable(TableConfig(capacity=10, signature=STEP))
    with pytest.raises(InvalidArgumentError, match="stores transitions"):
        table.insert(steps(0, 3), writer_id="a", sequence=1, items=items([3], [3]))


def test_resent_batches_are_duplicates_and_keep_the_tail() -> None:
    table = make_table(length=4)
    table.insert(steps(0, 2), writer_id="a", sequence=1)
    assert table.insert(steps(0, 2), writer_id="a", sequence=1).duplicate
    table.insert(steps(2, 2), writer_id="a", sequence=2, items=items([2], [4]))
    obs = table.sample(1).columns["obs"][:, 0]
    np.testing.assert_array_equal(obs, [0, 1, 2, 3])

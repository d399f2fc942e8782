"""A merged request's batches stored exactly once (replay_server/core/merged_batches.py) against a real table: as few
table calls as that allows, resent batches answered as duplicates, exactly the bad batch refused, and a step held
back by the table going on from what it already stored."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.common.errors import ApexError, DeadlineExceededError, InvalidArgumentError
from apexrl.replay_server.core.merged_batches import MergedBatches
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.core.types import InsertResult

BATCH_ROWS = [2, 3, 1, 4]
OFFSETS = [0, 2, 5, 6, 10]


def rows(values: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": values.astype(np.float32)}


class Recorder:
    """The table calls a merged request makes: (first value, rows, sequence) each."""

    def __init__(self, table: ReplayTable, writer_id: str = "w") -> None:
        self.table, self.writer_id, self.calls = table, writer_id, []

    def __call__(self, columns, priorities, sequence: int) -> InsertResult:
        self.calls.append((float(columns["x"][0]), len(columns["x"]), sequence))
        return self.table.insert(columns, priorities, writer_id=self.writer_id, sequence=sequence)


def store_all(merged: MergedBatches, insert) -> list:
    outcomes = []
    while not merged.done:
        error = None
        try:
            merged.step(insert)
        except ApexError as err:
            error = err
        outcomes += merged.settle(error)
    return outcomes


def stored_values(table: ReplayTable) -> list[float]:
    return table._storage["x"][: table.next_key].tolist()


def test_new_batches_take_two_table_calls_and_leave_the_writer_at_the_last_sequence():
    table = ReplayTable(TableConfig(capacity=100))
    insert = Recorder(table)
    merged = MergedBatches(rows(np.arange(10)), None, OFFSETS, first_sequence=7)
    outcomes = store_all(merged, insert)
    assert insert.calls == [(0.0, 2, 7), (2.0, 8, 10)]  # batch 0 alone, then batches 1..3 as sequence 10
    assert [(o.last_sequence, o.batches, o.result.rows) for o in outcomes] == [(7, 1, 2), (10, 3, 8)]
    assert stored_values(table) == list(range(10))
    assert table.insert(rows(np.arange(1)), writer_id="w", sequence=10).duplicate  # L = 10, as one by one


def test_a_resent_request_stores_only_the_batches_the_table_has_not_seen():
    table = ReplayTable(TableConfig(capacity=100))
    # batches 0 and 1 arrived before the stream broke
    for sequence, (lo, hi) in zip((7, 8), ((0, 2), (2, 5)), strict=True):
        table.insert(rows(np.arange(lo, hi)), writer_id="w", sequence=sequence)
    insert = Recorder(table)
    outcomes = store_all(MergedBatches(rows(np.arange(10)), None, OFFSETS, first_sequence=7), insert)
    assert [(o.last_sequence, o.batches, o.result.duplicate) for o in outcomes] == [
        (7, 1, True),
        (8, 1, True),
        (9, 1, False),
        (10, 1, False),
    ]
    assert stored_values(table) == list(range(10))  # each row once


def test_a_bad_batch_is_refused_alone_and_the_others_are_stored():
    table = ReplayTable(TableConfig(capacity=100))
    priorities = np.ones(10)
    priorities[5] = -1.0  # batch 2 (row 5) is bad
    outcomes = store_all(
        MergedBatches(rows(np.arange(10)), priorities, OFFSETS, first_sequence=1), Recorder(table)
    )
    results = [(o.last_sequence, o.batches, type(o.result).__name__) for o in outcomes]
    assert results == [
        (1, 1, "InsertResult"),
        (2, 1, "InsertResult"),
        (3, 1, "InvalidArgumentError"),
        (4, 1, "InsertResult"),
    ]
    assert isinstance(outcomes[2].result, InvalidArgumentError)
    assert stored_values(table) == [0, 1, 2, 3, 4, 6, 7, 8, 9]


def test_a_step_held_back_goes_on_without_storing_again():
    table = ReplayTable(TableConfig(capacity=100))
    record = Recorder(table)
    held_once = []

    def insert(columns, priorities, sequence):
        if sequence == 4 and not held_once:  # the call for the rest: the table is not ready yet
            held_once.append(sequence)
            raise DeadlineExceededError("rate limiter")
        return record(columns, priorities, sequence)

    merged = MergedBatches(rows(np.arange(10)), None, OFFSETS, first_sequence=1)
    with pytest.raises(DeadlineExceededError):
        merged.step(insert)
    merged.step(insert)  # retried, as the servicer's wait does
    assert [(o.last_sequence, o.batches) for o in merged.settle()] == [(1, 1), (4, 3)]
    assert record.calls == [(0.0, 2, 1), (2.0, 8, 4)]  # batch 0 stored once
    assert merged.done and stored_values(table) == list(range(10))


def test_settle_without_a_step_or_an_error_is_a_bug():
    merged = MergedBatches(rows(np.arange(10)), None, OFFSETS, first_sequence=1)
    with pytest.raises(ValueError):
        merged.settle()

"""The replay table (replay_server/core/table.py) without a server: FIFO ring and keys, stale keys, de-duplication,
signatures, default priorities, incarnations, sampling, rate limiting and shutdown, driven from threads."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from apexrl.common.errors import (
    InvalidArgumentError,
    UnavailableError,
)
from apexrl.common.signature import Signature
from apexrl.replay_server.core.admission import NotReadyError
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.core.table_state import TableListener
from apexrl.replay_server.durability.snapshot import Snapshot
from tests.conftest import cartpole_batch


def table(**config) -> ReplayTable:
    return ReplayTable(TableConfig(**{"capacity": 10, "alpha": 1.0, "seed": 0, **config}))


def stored(t: ReplayTable) -> dict[int, float]:
    """key -> stored priority of every row, read through sampling every row (alpha 1: the raw priority)."""
    batch = t.sample(t.config.max_sample_batch_size)
    return dict(zip(batch.keys.tolist(), batch.priorities.tolist(), strict=True))


# --- FIFO ring and keys --------------------------------------------------------------------------------------------


def test_keys_are_insertion_indices_and_the_oldest_rows_are_evicted_first():
    t = table()
    results = [t.insert(cartpole_batch(4, 4 * i)) for i in range(4)]  # 16 rows into 10 slots: wraps around
    assert [(r.first_key, r.rows, r.duplicate) for r in results] == [
        (0, 4, False),
        (4, 4, False),
        (8, 4, False),
        (12, 4, False),
    ]
    info = t.info()
    assert (info.size, info.inserted_total, info.evicted_total, info.capacity) == (10, 16, 6, 10)
    batch = t.sample(500)
    assert set(batch.keys.tolist()) == set(range(6, 16))  # the newest 10 rows, every one of them drawn
    ids = batch.columns["action"]
    np.testing.assert_array_equal(
        batch.keys.astype(np.int64), ids
    )  # each key names the row inserted under it
    np.testing.assert_array_equal(batch.columns["obs"][:, 0], ids.astype(np.float32))
    np.testing.assert_array_equal(batch.columns["next_obs"][:, 0], ids + 1.0)


def test_a_batch_of_exactly_the_capacity_replaces_everything():
    t = table()
    t.insert(cartpole_batch(7))
    assert t.insert(cartpole_batch(10, 100)).first_key == 7
    assert set(t.sample(200).columns["action"].tolist()) == set(range(100, 110))
    assert t.info().evicted_total == 7
    with pytest.raises(InvalidArgumentError, match="batch of 11 rows exceeds the table capacity"):
        t.insert(cartpole_batch(11))


# --- priorities ----------------------------------------------------------------------------------------------------


def test_stale_and_unknown_keys_are_ignored_and_counted_never_applied_to_the_slots_new_rows():
    t = table()
    t.insert(cartpole_batch(10), np.ones(10))
    t.insert(cartpole_batch(5, 10), np.full(5, 2.0))  # keys 0..4 evicted; their slots hold keys 10..14
    result = t.update_priorities(np.array([0, 3, 4, 5, 14, 15, 99], dtype=np.uint64), np.full(7, 50.0))
    assert (result.applied, result.stale) == (
        2,
        5,
    )  # 5 and 14 are live; 0, 3, 4 evicted; 15, 99 never existed
    priorities = stored(t)
    assert priorities[5] == 50.0 and priorities[14] == 50.0
    assert [priorities[k] for k in (10, 13)] == [2.0, 2.0]  # slots of the evicted keys 0 and 3: untouched
    assert (priorities[6], priorities[11]) == (1.0, 2.0)
    for bad in (np.array([-1, -5], np.int64), np.array([2**63 + 5, 2**64 - 1], np.uint64)):
        assert t.update_priorities(bad, np.ones(2)).stale == 2
    info = t.info()
    assert (info.updated_total, info.stale_updates_total) == (2, 9)
    assert info.total_priority == pytest.approx(sum(priorities.values()))


def test_updates_of_another_incarnation_are_all_stale():
    t = table()
    t.insert(cartpole_batch(10), np.ones(10))
    assert t.incarnation != 0 and t.incarnation % 2 == 1  # never 0: 0 means "this shard, whatever it is"
    assert ReplayTable(TableConfig(capacity=10)).incarnation != t.incarnation
    result = t.update_priorities(
        np.arange(10, dtype=np.uint64), np.full(10, 7.0), incarnation=t.incarnation ^ 2
    )
    assert (result.applied, result.stale) == (0, 10)
    assert t.info().total_priority == 10.0
    assert (
        t.update_priorities(np.arange(2, dtype=np.uint64), np.full(2, 7.0), incarnation=t.incarnation).applied
        == 2
    )
    assert t.update_priorities(np.arange(2, 4, dtype=np.uint64), np.full(2, 7.0), incarnation=0).applied == 2
    assert t.info().total_priority == 6.0 + 4 * 7.0


def test_rows_without_priorities_get_the_largest_priority_seen():
    t = table(capacity=100)
    t.insert(cartpole_batch(2))  # nothing seen yet: 1.0
    t.insert(cartpole_batch(2, 2), np.array([2.0, 5.0]))
    t.insert(cartpole_batch(2, 4))  # 5.0
    t.update_priorities(np.array([0], np.uint64), np.array([9.0]))
    t.insert(cartpole_batch(2, 6))  # 9.0, set by an update
    t.update_priorities(np.array([1], np.uint64), np.array([0.5]))  # lowering one row lowers no maximum
    t.insert(cartpole_batch(1, 8))
    assert stored(t) == {0: 9.0, 1: 0.5, 2: 2.0, 3: 5.0, 4: 5.0, 5: 5.0, 6: 9.0, 7: 9.0, 8: 9.0}
    assert t.info().max_priority == 9.0


def test_repeated_keys_in_one_update_last_value_wins_and_each_entry_counts():
    t = table()
    t.insert(cartpole_batch(10), np.ones(10))
    assert t.update_priorities(np.array([3, 3, 3], np.uint64), np.array([7.0, 2.0, 4.0])).applied == 3
    assert stored(t)[3] == 4.0


@pytest.mark.parametrize(
    ("keys", "priorities", "message"),
    [
        (np.arange(3, dtype=np.uint64), np.array([1.0, np.nan, 1.0]), "index 1 = nan"),
        (np.arange(3, dtype=np.uint64), np.array([1.0, 1.0, -2.0]), "index 2 = -2.0"),
        (np.arange(3, dtype=np.uint64), np.ones(2), "priorities has shape [2], expected [3]"),
        (np.arange(3, dtype=np.uint64), np.ones(3, np.int64), "must be float32 or float64, got int64"),
        (np.arange(3, dtype=np.float64), np.ones(3), "keys must be uint64 or int64, got float64"),
        (np.zeros((2, 2), np.uint64), np.ones(2), "keys has shape [2, 2], expected [n]"),
    ],
)
def test_bad_updates_are_refused_and_change_nothing(keys, priorities, message):
    t = table()
    t.insert(cartpole_batch(10), np.ones(10))
    with pytest.raises(InvalidArgumentError) as err:
        t.update_priorities(keys, priorities)
    assert message in str(err.value)
    assert t.info().total_priority == 10.0 and t.info().updated_total == 0


# --- de-duplication and signatures ---------------------------------------------------------------------------------


def test_a_resent_batch_is_reported_as_duplicate_and_stored_once():
    t = table(capacity=100)
    assert not t.insert(cartpole_batch(3), writer_id="w", sequence=1).duplicate
    again = t.insert(cartpole_batch(3), writer_id="w", sequence=1)
    assert (again.duplicate, again.rows, again.first_key) == (True, 0, 0)
    assert t.insert(cartpole_batch(3), writer_id="w", sequence=0).duplicate  # older than the last stored
    assert t.insert(cartpole_batch(3, 3), writer_id="w", sequence=5).first_key == 3  # gaps are fine
    assert not t.insert(
        cartpole_batch(3, 6), writer_id="other", sequence=1
    ).duplicate  # writers are independent
    assert (
        not t.insert(cartpole_batch(3, 9)).duplicate and not t.insert(cartpole_batch(3, 12)).duplicate
    )  # no id
    info = t.info()
    assert (info.size, info.inserted_total, info.duplicate_batches_total) == (15, 15, 2)


def test_the_least_recently_used_writer_is_forgotten_first():
    t = table(capacity=100, max_tracked_writers=2)
    t.insert(cartpole_batch(1), writer_id="a", sequence=1)
    t.insert(cartpole_batch(1), writer_id="b", sequence=1)
    assert t.insert(cartpole_batch(1), writer_id="a", sequence=1).duplicate  # "a" is now the most recent
    t.insert(cartpole_batch(1), writer_id="c", sequence=1)  # forgets "b"
    assert t.insert(cartpole_batch(1), writer_id="a", sequence=1).duplicate
    assert not t.insert(cartpole_batch(1), writer_id="b", sequence=1).duplicate


def test_a_full_writer_table_forgets_a_writer_of_the_identity_holding_the_most():
    """Under role identities (ids `NAME/ID`) one actor opening writer after writer forgets its own writers, never
    another identity's: the others' resends stay duplicates."""
    t = table(capacity=1000, max_tracked_writers=4)
    t.insert(cartpole_batch(1), writer_id="learner/x", sequence=1)
    t.insert(cartpole_batch(1), writer_id="actor-1/a", sequence=1)
    for i in range(10):  # actor-0's writers flood the table
        t.insert(cartpole_batch(1), writer_id=f"actor-0/{i}", sequence=1)
    assert t.insert(cartpole_batch(1), writer_id="learner/x", sequence=1).duplicate
    assert t.insert(cartpole_batch(1), writer_id="actor-1/a", sequence=1).duplicate
    assert t.insert(cartpole_batch(1), writer_id="actor-0/9", sequence=1).duplicate  # its newest are kept
    assert not t.insert(
        cartpole_batch(1), writer_id="actor-0/0", sequence=1
    ).duplicate  # its oldest forgotten
    assert len(t.state().writers) == 4
    # Saved and restored, the table keeps the same writers in the same order.
    from apexrl.replay_server.core.dedup import WriterSequences

    restored = WriterSequences(4, t.state().writers)
    assert list(restored.items()) == list(t.state().writers)


def test_the_first_insert_fixes_the_signature_and_later_batches_must_match():
    t = table()
    assert t.signature is None and t.info().signature is None
    t.insert(cartpole_batch(2))
    assert str(t.signature) == (
        "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
    )
    wrong = cartpole_batch(2)
    wrong["obs"] = wrong["obs"].astype(np.float64)
    with pytest.raises(InvalidArgumentError, match="column 'obs' is float64\\[4\\] per row"):
        t.insert(wrong)
    with pytest.raises(InvalidArgumentError, match="unknown \\['extra'\\]"):
        t.insert({**cartpole_batch(2), "extra": np.zeros(2)})
    assert t.info().inserted_total == 2


def test_a_declared_signature_is_enforced_from_the_first_insert():
    t = table(signature=Signature.parse("obs:float32[4],action:int64[]"))
    assert str(t.info().signature) == "obs:float32[4],action:int64[]"
    with pytest.raises(InvalidArgumentError, match="unknown \\['discount', 'next_obs', 'reward'\\]"):
        t.insert(cartpole_batch(2))
    batch = cartpole_batch(2)
    t.insert({"obs": batch["obs"], "action": batch["action"]})
    assert t.info().size == 2


# --- sampling ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_rows_are_drawn_in_proportion_to_priority_to_the_alpha(alpha):
    t = table(capacity=8, alpha=alpha, seed=3)
    raw = np.array([1.0, 2.0, 3.0, 4.0, 0.5, 8.0, 0.0, 1.5])
    t.insert(cartpole_batch(8), raw)
    leaves = np.where(raw > 0, raw**alpha, 0.0)
    counts = np.zeros(8)
    for _ in range(40):
        batch = t.sample(256)
        np.testing.assert_allclose(batch.priorities, leaves[batch.keys.astype(np.int64)])
        np.testing.assert_allclose(batch.probabilities, batch.priorities / leaves.sum())
        assert (batch.total_priority, batch.size, batch.incarnation) == (
            pytest.approx(leaves.sum()),
            8,
            t.incarnation,
        )
        assert batch.min_priority == pytest.approx(leaves[leaves > 0].min())
        counts += np.bincount(batch.keys.astype(np.int64), minlength=8)
    assert counts[6] == 0  # priority 0 is never drawn
    keep = leaves > 0
    _, p_value = stats.chisquare(counts[keep], counts.sum() * leaves[keep] / leaves.sum())
    assert p_value > 1e-3, counts


def test_a_table_whose_priorities_are_all_zero_samples_uniformly():
    t = table(capacity=20, seed=1)
    t.insert(cartpole_batch(20, 0), np.zeros(20))
    batch = t.sample(2000)
    assert batch.total_priority == 0 and set(batch.keys.tolist()) == set(range(20))
    np.testing.assert_allclose(batch.probabilities, 1 / 20)


def test_batch_size_must_be_within_limits():
    t = table(max_sample_batch_size=8)
    t.insert(cartpole_batch(4))
    for bad in (0, 9):
        with pytest.raises(InvalidArgumentError, match=f"batch_size \\({bad}\\) must be in \\[1, 8\\]"):
            t.sample(bad)
    assert len(t.sample(8).keys) == 8  # with replacement: more than the rows held


# --- waiting, rate limiting, shutdown ------------------------------------------------------------------------------


def test_below_the_minimum_size_a_sample_is_not_ready_until_an_insert_brings_the_table_there():
    """The table never blocks: the server waits (waits.py), trying the call again as the table changes."""
    t = table(capacity=100, min_size_to_sample=5)
    t.insert(cartpole_batch(4))
    with pytest.raises(
        NotReadyError, match="sample not ready: table holds 4 rows, fewer than min_size_to_sample"
    ):
        t.sample(2)
    t.insert(cartpole_batch(1, 4))  # the fifth row lets it go
    assert t.sample(3).size == 5


def test_a_sampler_ahead_of_the_ratio_is_not_ready_until_an_insert_lets_it_go():
    t = table(capacity=1000, samples_per_insert=1.0, samples_per_insert_tolerance=16)
    t.insert(cartpole_batch(32))
    t.sample(32)
    t.sample(32)  # diff 32 - 64 = -32 < -16
    with pytest.raises(
        NotReadyError, match="rate limiter: samples_per_insert 1.0: 64 rows sampled"
    ) as refused:
        t.sample(8)
    assert refused.value.reason.startswith("rate limiter: ") and t.info().sampled_total == 64
    t.insert(cartpole_batch(32, 32))  # diff 0: sampling allowed again
    assert t.sample(8).size == 64 and t.info().sampled_total == 72


def test_a_writer_ahead_of_the_ratio_is_not_ready_until_samples_let_it_go():
    t = table(capacity=1000, samples_per_insert=1.0, samples_per_insert_tolerance=16)
    t.insert(cartpole_batch(32))  # diff 32 > 16: the next insert waits
    with pytest.raises(NotReadyError, match="insert not ready: rate limiter"):
        t.insert(cartpole_batch(8, 32), writer_id="w", sequence=1)
    assert t.info().inserted_total == 32  # held, not stored, and its sequence not used up
    t.sample(16)  # diff 16: inserting allowed again
    assert t.insert(cartpole_batch(8, 32), writer_id="w", sequence=1).first_key == 32
    assert t.info().inserted_total == 40


def test_a_closed_table_answers_inserts_and_samples_unavailable_ready_or_not():
    """A shard shutting down answers at once (UNAVAILABLE: try another shard); priority updates still land."""
    t = table(capacity=100, min_size_to_sample=50)
    t.insert(cartpole_batch(60))
    t.close()
    for call in (lambda: t.insert(cartpole_batch(1, 60)), lambda: t.sample(1)):
        with pytest.raises(UnavailableError, match="replay table is shutting down"):
            call()
    assert t.update_priorities(np.arange(3), np.full(3, 2.0)).applied == 3
    assert t.info().inserted_total == 60 and t.info().sampled_total == 0


def test_blocked_seconds_count_from_a_sides_first_refusal_to_its_admission(monkeypatch):
    from apexrl.replay_server.core import admission

    now = [100.0]
    monkeypatch.setattr(admission.time, "monotonic", lambda: now[0])
    t = table(capacity=1000, samples_per_insert=1.0, samples_per_insert_tolerance=16)
    assert t.blocked_seconds() == {"insert": 0.0, "sample": 0.0}
    t.insert(cartpole_batch(32))  # diff 32 > 16: the next insert is held back
    for _ in range(3):  # the server tries again every 0.25 s at most
        with pytest.raises(NotReadyError):
            t.insert(cartpole_batch(8, 32))
        now[0] += 0.25
    t.sample(16)  # lets the writer go; its wait is added when it is admitted
    t.insert(cartpole_batch(8, 32))
    assert t.blocked_seconds() == {"insert": 0.75, "sample": 0.0}
    now[0] += 10.0
    t.sample(8)  # admitted at once: samples were never held back
    assert t.blocked_seconds() == {"insert": 0.75, "sample": 0.0}


# --- compressed fields and capacity in bytes ---------------------------------------------------------------------


def test_compressed_fields_are_stored_and_sampled_as_their_frames_with_their_writers():
    from apexrl.common.compression import CompressedColumn, decompress
    from tests.conftest import frame_ids, pixel_batch

    t = table()
    first = pixel_batch(6, 0)
    t.insert(first, writer_id="actor-a", sequence=1)
    t.insert(pixel_batch(6, 6), writer_id="actor-b", sequence=1)  # 12 rows into 10 slots
    assert str(t.signature) == (
        "obs:uint8[2,16,16]@zstd,action:int64[],reward:float32[],discount:float32[],"
        "next_obs:uint8[2,16,16]@zstd"
    )
    batch = t.sample(200)
    obs = batch.columns["obs"]
    assert isinstance(obs, CompressedColumn) and len(obs) == 200
    ids = batch.columns["action"]
    np.testing.assert_array_equal(
        frame_ids(decompress(obs)[0]), ids
    )  # each row's own frame, never decompressed
    np.testing.assert_array_equal(frame_ids(decompress(batch.columns["next_obs"])[0]), ids + 1)
    assert set(ids.tolist()) == set(range(2, 12))
    assert list(batch.writers) == ["actor-a" if i < 6 else "actor-b" for i in ids]
    info = t.info()
    frames = sum(pixel_batch(1, i)[n].nbytes for i in range(2, 12) for n in ("obs", "next_obs"))
    assert info.stored_bytes == 10 * (8 + 4 + 4) + frames  # the frames as they came, plus the raw fields
    assert info.inserted_bytes_total == 12 * 16 + first["obs"].nbytes + first["next_obs"].nbytes + sum(
        pixel_batch(6, 6)[n].nbytes for n in ("obs", "next_obs")
    )
    plain = table()  # a table without compressed fields returns no writers
    plain.insert(cartpole_batch(3), writer_id="w", sequence=1)
    assert plain.sample(4).writers == () and plain.info().stored_bytes == 3 * 48


def test_a_compressed_signature_takes_only_frames_of_its_compression():
    from tests.conftest import pixel_batch

    t = table(
        signature=Signature.parse(
            "obs:uint8[2,16,16]@zstd,action:int64[],reward:float32[],"
            "discount:float32[],next_obs:uint8[2,16,16]@zstd"
        )
    )
    t.insert(pixel_batch(3))
    with pytest.raises(
        InvalidArgumentError,
        match=r"column 'obs' is uint8\[2, 16, 16\]@lz4 per row, the table "
        r"signature wants uint8\[2, 16, 16\]@zstd",
    ):
        t.insert(pixel_batch(3, compression="lz4"))


def test_max_bytes_evicts_the_oldest_rows_first_and_their_keys_go_stale():
    t = table(capacity=100, max_bytes=10 * 48)  # CartPole rows are 48 bytes: 10 fit
    for i in range(4):
        t.insert(cartpole_batch(4, 4 * i))
    info = t.info()
    assert (info.size, info.stored_bytes, info.evicted_total, info.max_bytes) == (10, 480, 6, 480)
    assert set(t.sample(300).keys.tolist()) == set(range(6, 16))
    assert t.update_priorities(np.arange(16, dtype=np.uint64), np.ones(16)).stale == 6
    assert t.info().total_priority == pytest.approx(10.0)  # evicted rows left the sum tree
    with pytest.raises(
        InvalidArgumentError, match=r"batch of 528 bytes exceeds the table's max_bytes \(480\)"
    ):
        t.insert(cartpole_batch(11))
    with pytest.raises(ValueError, match="max_bytes"):
        TableConfig(max_bytes=0)


def test_max_bytes_counts_compressed_rows_as_stored_and_releases_their_frames():
    from tests.conftest import pixel_batch

    one = pixel_batch(1)
    row = (
        16 + one["obs"].nbytes + one["next_obs"].nbytes
    )  # about 70 bytes: every frame is about the same size
    t = table(capacity=1000, max_bytes=50 * row)
    for i in range(20):
        t.insert(pixel_batch(10, 10 * i), writer_id="w", sequence=i)
    info = t.info()
    assert 40 <= info.size <= 60 and info.stored_bytes <= 50 * row and info.evicted_total == 200 - info.size
    assert set(t.sample(500).columns["action"].tolist()) == set(range(200 - info.size, 200))
    held = [frame for frame in t._storage["obs"] if frame is not None]
    assert len(held) == info.size  # the evicted rows' frames were released
    assert info.stored_bytes == info.size * 16 + sum(map(len, held)) + sum(
        len(f) for f in t._storage["next_obs"] if f is not None
    )


def test_rows_evicted_by_bytes_while_a_snapshot_is_read_come_back_in_it():
    from tests.conftest import frame_ids, pixel_batch

    t = table(capacity=100, max_bytes=30 * 80)
    for i in range(3):
        t.insert(pixel_batch(10, 10 * i), writer_id="w", sequence=i)
    held = t.info().size
    snapshot = Snapshot.take(t, chunk_rows=8)
    for i in range(3, 8):
        t.insert(
            pixel_batch(10, 10 * i), writer_id="w", sequence=i
        )  # evicts (by bytes) what the snapshot holds
    seen = {}
    for slot, columns, _ in snapshot.chunks():
        for j, frame in enumerate(columns["obs"]):
            if frame is not None:
                seen[slot + j] = frame
    snapshot.close()
    from apexrl.common.compression import CompressedColumn, decompress

    state = snapshot.state
    ids = [
        int(
            frame_ids(
                decompress(CompressedColumn.from_frames("zstd", np.uint8, (2, 16, 16), [seen[k % 100]]))[0]
            )[0]
        )
        for k in range(state.first_key, state.next_key)
    ]
    assert ids == list(range(30 - held, 30))


# --- listeners (the write-ahead log's and a snapshot's way in) -----------------------------------------------------


class Journal(TableListener):
    """A listener that hands each batch about to be stored to `storing` (as the write-ahead log does)."""

    def __init__(self, storing) -> None:
        self.storing = storing


def _disk_full(*batch) -> None:
    raise OSError(28, "No space left on device")


def test_a_journal_that_raises_fails_the_insert_and_leaves_the_table_unchanged():
    """The journal runs before the table changes, so a batch the write-ahead log did not take is never stored (and
    so never sampled, counted or acknowledged)."""
    t = table(capacity=100)
    t.insert(cartpole_batch(10), np.full(10, 2.0), writer_id="w", sequence=1)
    before, writers, leaves = (
        t.info(),
        dict(t._writers),
        t._tree.leaf_values().copy(),
    )  # white box: exact state
    journal = Journal(_disk_full)
    t.add_listener(journal)
    with pytest.raises(OSError, match="No space left on device"):
        t.insert(cartpole_batch(10, 10), np.full(10, 7.0), writer_id="w", sequence=2)
    with pytest.raises(OSError, match="No space left on device"):
        t.insert(cartpole_batch(10, 10), writer_id="new", sequence=1)  # a writer never seen: not remembered
    assert t.info() == before  # size, inserted count, keys, max priority, every counter
    assert dict(t._writers) == writers and t.next_key == 10
    np.testing.assert_array_equal(t._tree.leaf_values(), leaves)
    assert t.insert(cartpole_batch(10, 10), writer_id="w", sequence=1).duplicate  # de-duplication as before
    t.remove_listener(journal)
    result = t.insert(cartpole_batch(10, 10), writer_id="w", sequence=2)  # the sequence was not used up
    assert (result.first_key, result.rows, result.duplicate) == (10, 10, False)


def test_a_first_insert_the_journal_refuses_fixes_no_signature():
    t = table()
    journal = Journal(_disk_full)
    t.add_listener(journal)
    with pytest.raises(OSError):
        t.insert(cartpole_batch(3))
    assert t.signature is None and t.info().size == 0
    t.remove_listener(journal)
    t.insert({"x": np.zeros((2, 3), np.int8)})  # another signature is still free to come first
    assert str(t.signature) == "x:int8[3]"


def test_the_journal_sees_each_batch_before_the_table_changes_with_the_priorities_it_will_get():
    t = table(capacity=100)
    seen = []

    def journal(first_key, columns, priorities, writer_id, sequence):
        seen.append((first_key, t.next_key, priorities.tolist(), writer_id, sequence))

    t.add_listener(Journal(journal))
    t.insert(cartpole_batch(2), np.array([3.0, 4.0]), writer_id="w", sequence=7)
    t.insert(cartpole_batch(2, 2))  # no priorities: the largest seen
    assert seen == [(0, 0, [3.0, 4.0], "w", 7), (2, 2, [4.0, 4.0], "", 0)]


def test_an_insert_that_fails_after_its_batch_was_journalled_stops_inserts(monkeypatch):
    """The log then holds keys the table does not: a later batch must not be logged under the same keys."""
    t = table(capacity=100)
    t.add_listener(Journal(lambda *batch: None))

    def broken(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(t, "_write_rows", broken)
    with pytest.raises(MemoryError):
        t.insert(cartpole_batch(2))
    monkeypatch.undo()
    with pytest.raises(UnavailableError, match="after its batch was journalled at key 0"):
        t.insert(cartpole_batch(2))

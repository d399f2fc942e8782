"""The write-ahead log (replay_server/durability/wal.py) without a server: replayed after a checkpoint or from scratch, a
torn tail, segments dropped once checkpoints cover them, another lineage never replayed, a failing disk, and gaps
(a missing segment, a record whose checksum holds but that cannot be replayed) logged, counted and set aside."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest

from apexrl.common.errors import UnavailableError
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability import wal as wal_module
from apexrl.replay_server.durability.checkpointer import Checkpointer
from apexrl.replay_server.durability.snapshot import Snapshot
from apexrl.replay_server.durability.wal import WriteAheadLog
from tests.conftest import cartpole_batch, wait_until
from tests.support.tampered import wal_records


def table(**config) -> ReplayTable:
    return ReplayTable(TableConfig(**{"capacity": 1000, "alpha": 0.5, "seed": 0, **config}))


def logged(directory, batches: int, rows: int = 10, t: ReplayTable | None = None, start: int = 0):
    """A table logging into `directory`: `batches` inserts from two writers, all durable."""
    t = t or table()
    log = WriteAheadLog(directory)
    log.open(t)
    for i in range(start, start + batches):
        t.insert(cartpole_batch(rows, i * rows), np.full(rows, 1.0 + i), writer_id=f"w{i % 2}", sequence=i)
    done = threading.Event()
    log.when_durable(t.next_key, lambda error: done.set())
    assert done.wait(10)
    log.close()
    return t, log


def rows(t: ReplayTable) -> dict[int, tuple[int, float]]:
    info = t.info()
    leaves = t._tree.leaf_values()
    return {
        k: (int(t._storage["action"][k % info.capacity]), float(leaves[k % info.capacity]))
        for k in range(info.inserted_total - info.size, info.inserted_total)
    }


def replayed(directory, restored_from: ReplayTable | None = None, **config) -> ReplayTable:
    t = table(**config)
    t.refuse_calls("restoring")
    if restored_from is not None:
        t.load_state(*_state_and_blocks(restored_from))
    WriteAheadLog(directory).replay(t, restored=restored_from is not None)
    t.refuse_calls(None)
    return t


def _state_and_blocks(source: ReplayTable):
    snapshot = Snapshot.take(source, 64)
    blocks = []
    for slot, columns, leaves in snapshot.chunks():
        blocks.append((slot, columns, leaves))
    snapshot.close()
    state = snapshot.state
    cap = state.capacity
    keyed = []
    for key in range(state.first_key, state.next_key):
        slot = key % cap
        for start, columns, leaves in blocks:
            if start <= slot < start + len(leaves):
                i = slot - start
                keyed.append((key, {k: v[i : i + 1] for k, v in columns.items()}, leaves[i : i + 1]))
    return state, keyed


def test_a_log_replayed_from_scratch_gives_back_every_row_priority_and_writer(tmp_path):
    original, _ = logged(tmp_path, 30)
    t = replayed(tmp_path)
    assert rows(t) == rows(original) and t.info().max_priority == original.info().max_priority
    assert t.lineage == original.lineage
    assert t.insert(cartpole_batch(10), writer_id="w1", sequence=29).duplicate
    # Keys sampled from the process that wrote the log name the same rows here.
    assert (
        t.update_priorities(
            np.arange(300, dtype=np.uint64), np.ones(300), incarnation=original.incarnation
        ).applied
        == 300
    )


def test_replay_after_a_checkpoint_skips_what_the_checkpoint_holds(tmp_path):
    original, log = logged(tmp_path, 10)
    at_checkpoint = table()
    at_checkpoint.refuse_calls("r")
    at_checkpoint.load_state(*_state_and_blocks(original))
    at_checkpoint.refuse_calls(None)
    logged(tmp_path, 10, t=original, start=10)
    t = replayed(tmp_path, restored_from=at_checkpoint)
    assert rows(t) == rows(original) and t.info().inserted_total == 200


def test_a_torn_tail_stops_the_replay_at_the_last_whole_record(tmp_path, caplog):
    original, _ = logged(tmp_path, 5)
    (segment,) = tmp_path.glob("wal-*.log")
    data = segment.read_bytes()
    segment.write_bytes(data[:-7])  # the last record lost its end: SIGKILL during its write
    with caplog.at_level(logging.WARNING, "apexrl.replay.wal"):
        t = replayed(tmp_path)
    assert t.info().inserted_total == 40 and rows(t) == {k: v for k, v in rows(original).items() if k < 40}
    assert "torn or corrupt record" in caplog.text
    # Logging goes on in a new segment right after the last replayed key; a second replay reads both.
    logged(tmp_path, 3, t=t, start=100)
    assert replayed(tmp_path).info().inserted_total == 70


def test_a_flipped_bit_in_a_record_stops_the_replay_there(tmp_path, caplog):
    """A bit flipped inside the third record (keys 20..29): exactly the two records before it come back, with
    their rows and priorities, and the warning names the segment and the record's byte."""
    original, _ = logged(tmp_path, 5)
    (segment,) = tmp_path.glob("wal-*.log")
    offset, length, _ = wal_records(segment)[2]
    data = bytearray(segment.read_bytes())
    data[offset + 8 + length // 2] ^= 0x40  # inside its payload: its CRC32 fails
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "apexrl.replay.wal"):
        t = replayed(tmp_path)
    assert t.info().inserted_total == 20
    assert rows(t) == {k: v for k, v in rows(original).items() if k < 20}
    assert f"write-ahead log {segment}: torn or corrupt record at byte {offset}" in caplog.text


def test_segments_are_rotated_and_dropped_once_the_kept_checkpoints_cover_them(tmp_path):
    t = table()
    log = WriteAheadLog(tmp_path / "wal")
    checkpointer = Checkpointer(t, tmp_path / "ck", keep=2, on_written=log.truncate)
    log.open(t)

    def insert_durably(n: int) -> None:
        for _ in range(n):
            t.insert(cartpole_batch(10, t.next_key))
        wait_until(lambda: log.durable_key == t.next_key, "the log durable")

    insert_durably(3)
    checkpointer.checkpoint()  # at key 30: one checkpoint kept, covering 0..29
    insert_durably(3)
    checkpointer.checkpoint()  # at key 60; kept: 30 and 60
    insert_durably(3)
    names = sorted(p.name for p in (tmp_path / "wal").iterdir())
    assert names == ["wal-00000000000000000030.log", "wal-00000000000000000060.log"]  # 0..29 dropped
    checkpointer.checkpoint()  # at key 90; kept: 60 and 90
    insert_durably(1)
    names = sorted(p.name for p in (tmp_path / "wal").iterdir())
    assert names == ["wal-00000000000000000060.log", "wal-00000000000000000090.log"]
    log.close()
    # Falling back to the older kept checkpoint (60) still finds every row after it in the log.
    fallback = table()
    fallback.refuse_calls("r")
    checkpointer.files()[-1].unlink()
    assert Checkpointer(fallback, tmp_path / "ck").restore().next_key == 60
    WriteAheadLog(tmp_path / "wal").replay(fallback, restored=True)
    assert fallback.next_key == 100


def test_a_log_of_another_lineage_is_never_replayed(tmp_path, caplog):
    logged(tmp_path, 5)
    other = table()
    other.insert(cartpole_batch(10))
    t = table()
    t.refuse_calls("r")
    t.load_state(*_state_and_blocks(other))  # a checkpoint of another history (e.g. made by resharding)
    with caplog.at_level(logging.WARNING, "apexrl.replay.wal"):
        assert WriteAheadLog(tmp_path).replay(t, restored=True) == 0
    assert t.next_key == 10 and "belongs to another history" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["wal-00000000000000000000.log.orphan"]


def test_batches_share_fsyncs(tmp_path, monkeypatch):
    """Batches appended while a write is under way share the next fsync (group commit). The log's first write is
    held until all 500 batches are appended, so on any machine, however loaded, they need at most two fsyncs (the
    group the thread took before the hold, then everything else); one fsync per batch would be 500."""
    t = table(capacity=100_000)
    log = WriteAheadLog(tmp_path)
    release = threading.Event()
    write_all = wal_module._write_all

    def held(fd, data):
        assert release.wait(30), "the test never released the log's writes"
        write_all(fd, data)

    monkeypatch.setattr(wal_module, "_write_all", held)
    log.open(t)
    for i in range(500):
        t.insert(cartpole_batch(10, 10 * i))
    release.set()
    wait_until(lambda: log.durable_key == 5000, "all durable")
    log.close()
    assert log.stats.wal_batches == 500 and 1 <= log.stats.wal_fsyncs <= 2
    assert log.stats.wal_bytes > 500 * 10 * 48


def three_segments(directory) -> tuple[ReplayTable, list]:
    """A table whose 90 rows (keys 0..89, 10 per batch) lie in three segments starting at keys 0, 30 and 60."""
    t, _ = logged(directory, 3)
    logged(directory, 3, t=t, start=3)
    logged(directory, 3, t=t, start=6)
    segments = sorted(directory.glob("wal-*.log"))
    assert [p.name[4:24] for p in segments] == [f"{k:020d}" for k in (0, 30, 60)]
    return t, segments


def test_a_missing_segment_is_a_gap_logged_as_an_error_and_counted(tmp_path, caplog):
    _, segments = three_segments(tmp_path)
    segments[1].unlink()
    log = WriteAheadLog(tmp_path)
    t = table()
    t.refuse_calls("restoring")
    with caplog.at_level(logging.ERROR, "apexrl.replay.wal"):
        assert log.replay(t, restored=False) == 30
    assert (
        f"WRITE-AHEAD LOG GAP: segment {segments[2]} starts at key 60, after key 30: rows 30..59 are lost"
        in caplog.text
    )
    assert log.stats.wal_replay_gaps == 1
    assert segments[2].with_name(segments[2].name + ".orphan").exists() and not segments[2].exists()


@pytest.mark.parametrize("record", ["empty", "short", "NaN priorities", "a key that does not follow"])
def test_a_record_whose_checksum_holds_but_cannot_be_replayed_is_a_gap_and_never_comes_back(
    tmp_path, caplog, record
):
    """A record with a valid CRC whose content is invalid (written by a bug or by someone else): the replay stops
    there, loudly (ERROR, counted), cuts the segment at it and sets the rest aside, so a later restart, whose
    checkpoint may cover that record's keys, never replays the old rows after it over the new rows that took
    their keys (before: an empty payload crashed the replay; NaN priorities stopped it, but a later replay skipped
    the covered record and went on with the old rows)."""
    import struct

    from tests.support.tampered import rewrite_wal_record, with_priority

    _, segments = three_segments(tmp_path)
    change = {
        "empty": lambda payload: b"",
        "short": lambda payload: payload[:-3],
        "NaN priorities": lambda payload: with_priority(payload, float("nan"), row=4),
        "a key that does not follow": lambda payload: struct.pack("<Q", 1000) + payload[8:],
    }[record]
    rewrite_wal_record(segments[0], 1, change)  # keys 10..19
    log = WriteAheadLog(tmp_path)
    t = table()
    t.refuse_calls("restoring")
    with caplog.at_level(logging.ERROR, "apexrl.replay.wal"):
        assert log.replay(t, restored=False) == 10
    assert f"WRITE-AHEAD LOG GAP: {segments[0]}: the record at byte " in caplog.text
    assert "the rows from key 10 on are lost" in caplog.text and log.stats.wal_replay_gaps == 1
    (aside,) = tmp_path.glob("wal-00000000000000000000.log.from-byte-*.orphan")
    assert sorted(p.name for p in tmp_path.glob("wal-*.log")) == [
        segments[0].name
    ]  # the later ones set aside
    # The shard goes on: new rows take keys 10.. in a new segment, and a checkpoint is taken at key 20 (it covers
    # the bad record, not the old one after it at key 20).
    t.refuse_calls(None)
    logged(tmp_path, 1, t=t, start=100)  # action ids 1000..1009 at keys 10..19
    checkpoint = _state_and_blocks(t)
    logged(tmp_path, 2, t=t, start=101)  # 1010..1029 at keys 20..39
    again = WriteAheadLog(tmp_path)
    t2 = table()
    t2.refuse_calls("r")
    t2.load_state(*checkpoint)
    again.replay(t2, restored=True)
    t2.refuse_calls(None)
    assert again.stats.wal_replay_gaps == 0
    assert [v[0] for v in rows(t2).values()] == [*range(10), *range(1000, 1030)]  # never the old rows 20..29


def test_a_failing_disk_answers_every_waiter_with_its_error(tmp_path):
    disk_full = threading.Event()

    def sync(fd: int) -> None:
        if disk_full.is_set():
            raise OSError(28, "No space left on device")
        os.fsync(fd)

    t = table()
    log = WriteAheadLog(tmp_path, sync=sync)
    log.open(t)
    t.insert(cartpole_batch(10))
    wait_until(lambda: log.durable_key == 10, "the first batch durable")
    disk_full.set()
    t.insert(cartpole_batch(10, 10))
    errors: list = []
    log.when_durable(20, errors.append)
    wait_until(lambda: errors, "the waiter answered")
    assert "No space left on device" in str(errors[0])
    log.when_durable(30, errors.append)  # later waiters too, at once
    assert len(errors) == 2 and errors[1] is errors[0]
    log.close()


def test_a_batch_the_log_cannot_append_is_not_stored_and_the_log_refuses_every_later_one(tmp_path):
    """The security review's reproduction, below the server: a 70,000-character writer id does not fit the
    record's 16-bit length. The server refuses such ids at decode (wire.MAX_WRITER_ID_BYTES); should a batch the log
    cannot append reach it anyway, it is not stored, the log fails for good (reported once), every later insert is
    refused, and a restart replays every batch appended before it: no acknowledged row is lost."""
    t = table()
    log = WriteAheadLog(tmp_path)
    failures: list = []
    log.on_failure(failures.append)
    log.open(t)
    for i in range(10):
        t.insert(cartpole_batch(10, 10 * i), writer_id="w0", sequence=i)
    before = t.info()
    with pytest.raises(UnavailableError, match="could not append this batch"):
        t.insert(cartpole_batch(10, 100), writer_id="x" * 70_000, sequence=1)
    with pytest.raises(UnavailableError, match="write-ahead log failed"):
        t.insert(cartpole_batch(10, 100), writer_id="w1", sequence=1)
    assert t.info() == before and set(t._writers) == {"w0"}
    assert len(failures) == 1 and log.stats.wal_failed == 1 and log.stats.wal_failures == 2
    late: list = []
    log.on_failure(late.append)  # registered after the failure: called at once
    assert late == failures
    log.close()
    assert len(failures) == 1  # closing is no second failure
    restarted = replayed(tmp_path)
    assert rows(restarted) == rows(t) and restarted.next_key == 100
    assert restarted.insert(cartpole_batch(10), writer_id="w0", sequence=9).duplicate


def test_after_a_failed_write_the_table_refuses_inserts_and_the_failure_is_reported_once(
    tmp_path, monkeypatch
):
    t = table()
    log = WriteAheadLog(tmp_path)
    failures: list = []
    log.on_failure(failures.append)
    log.open(t)
    t.insert(cartpole_batch(10))
    wait_until(lambda: log.durable_key == 10, "the first batch durable")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal_module, "_write_all", full)
    t.insert(cartpole_batch(10, 10))  # appended before the write fails: held in memory, never acknowledged
    wait_until(lambda: failures, "the failure reported")
    held = t.info()
    with pytest.raises(UnavailableError, match="No space left on device"):
        t.insert(cartpole_batch(10, 20))
    assert t.info() == held
    assert len(failures) == 1 and log.stats.wal_failed == 1 and log.stats.wal_failures == 2
    answers: list = []
    log.when_durable(10, answers.append)  # durable before the failure: still reported durable
    log.when_durable(20, answers.append)
    assert answers[0] is None and "No space left on device" in str(answers[1])
    monkeypatch.undo()
    log.close()


@pytest.fixture(autouse=True)
def _no_thread_left_behind():
    before = set(threading.enumerate())
    yield
    wait_until(
        lambda: not [t for t in threading.enumerate() if t not in before and t.name == "apexrl-wal"],
        "the log threads ended",
    )


def test_compressed_rows_are_logged_as_their_frames_and_replayed_with_their_writers(tmp_path):
    from tests.conftest import pixel_batch

    original = table()
    log = WriteAheadLog(tmp_path)
    log.open(original)
    for i in range(6):
        original.insert(pixel_batch(10, 10 * i), np.full(10, 1.0 + i), writer_id=f"w{i % 2}", sequence=i)
    done = threading.Event()
    log.when_durable(original.next_key, lambda error: done.set())
    assert done.wait(10)
    log.close()
    t = replayed(tmp_path)
    assert rows(t) == rows(original) and str(t.signature) == str(original.signature)
    assert list(t._storage["obs"][:60]) == list(original._storage["obs"][:60])  # frame for frame
    assert list(t._row_writers[:60]) == [f"w{i // 10 % 2}" for i in range(60)]
    assert t.info().stored_bytes == original.info().stored_bytes

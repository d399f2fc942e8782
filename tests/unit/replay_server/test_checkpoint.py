"""Checkpoints without a server: the file format (round trip, torn files, flipped bits), the snapshot's consistency
while the table keeps changing, restoring onto another capacity, and incarnation aliases after a restore."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from apexrl.common.errors import UnavailableError
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpoint import (
    CheckpointReader,
    CheckpointWriter,
    CorruptCheckpointError,
    write_snapshot,
)
from apexrl.replay_server.durability.snapshot import Snapshot
from tests.conftest import cartpole_batch


def table(**config) -> ReplayTable:
    return ReplayTable(TableConfig(**{"capacity": 100, "alpha": 0.5, "seed": 0, **config}))


def filled(rows: int = 130, **config) -> ReplayTable:
    """A table that wrapped around, with distinct priorities, two writers and some updates."""
    t = table(**config)
    for start in range(0, rows, 10):
        t.insert(
            cartpole_batch(10, start),
            np.arange(start, start + 10) + 1.0,
            writer_id=f"w{start % 20 // 10}",
            sequence=start,
        )
    batch = t.sample(16)
    t.update_priorities(batch.keys, np.full(16, 500.0))
    return t


def contents(t: ReplayTable) -> dict[int, tuple]:
    """key -> (action, obs[0], next_obs[0], leaf) of every held row, read from the table's arrays."""
    info = t.info()
    leaves = t._tree.leaf_values()
    out = {}
    for key in range(info.inserted_total - info.size, info.inserted_total):
        slot = key % info.capacity
        s = t._storage
        out[key] = (
            int(s["action"][slot]),
            float(s["obs"][slot, 0]),
            float(s["next_obs"][slot, 0]),
            float(leaves[slot]),
        )
    return out


def read_back(path: Path) -> dict[int, tuple]:
    """key -> the same tuple, from a checkpoint file."""
    out = {}
    with CheckpointReader(path) as reader:
        for first, columns, leaves in reader.blocks():
            for i in range(len(leaves)):
                out[first + i] = (
                    int(columns["action"][i]),
                    float(columns["obs"][i, 0]),
                    float(columns["next_obs"][i, 0]),
                    float(leaves[i]),
                )
    return out


def save(t: ReplayTable, path: Path, chunk_rows: int = 16) -> Path:
    with Snapshot.take(t, chunk_rows) as snapshot:
        write_snapshot(path, snapshot)
    return path


def restored(path: Path, **config) -> ReplayTable:
    t = table(**config)
    t.refuse_calls("restoring")
    with CheckpointReader(path) as reader:
        t.load_state(reader.state, reader.blocks())
    t.refuse_calls(None)
    return t


# --- format --------------------------------------------------------------------------------------------------------


def test_round_trip_keeps_every_row_key_priority_writer_and_counter(tmp_path):
    t = filled()
    before, info = contents(t), t.info()
    path = save(t, tmp_path / "c")
    with CheckpointReader(path) as reader:
        state = reader.state
        assert (state.next_key, state.size, state.capacity, state.alpha) == (130, 100, 100, 0.5)
        assert str(state.signature) == str(t.signature) and state.incarnation == t.incarnation
        assert dict(state.writers) == {"w0": 120, "w1": 110}
        reader.verify()
    assert read_back(path) == before
    r = restored(path)
    after = r.info()
    assert contents(r) == before
    for field in (
        "size",
        "inserted_total",
        "evicted_total",
        "sampled_total",
        "updated_total",
        "max_priority",
        "inserted_bytes_total",
        "total_priority",
        "min_priority",
    ):
        assert getattr(after, field) == getattr(info, field), field
    assert after.incarnation != info.incarnation  # a new process lifetime...
    assert r.insert(
        cartpole_batch(10, 0), writer_id="w0", sequence=120
    ).duplicate  # ...that knows the writers
    assert r.insert(cartpole_batch(10, 130), writer_id="w0", sequence=130).first_key == 130  # keys go on


def test_a_table_that_never_wrapped_saves_only_the_chunks_holding_rows(tmp_path):
    t = table(capacity=1000)
    t.insert(cartpole_batch(40))
    path = save(t, tmp_path / "c", chunk_rows=16)
    with CheckpointReader(path) as reader:
        assert [c.slot for c in reader.chunks] == [0, 16, 32]
        assert reader.size_bytes < 3 * 16 * (48 + 8) + 4096
    assert restored(path, capacity=1000).info().size == 40


@pytest.mark.parametrize("cut", [0, 10, 17, 0.5, -1, -24, -25])
def test_a_truncated_file_is_refused_naming_the_file(tmp_path, cut):
    path = save(filled(), tmp_path / "c")
    data = path.read_bytes()
    end = int(len(data) * cut) if isinstance(cut, float) else (cut if cut >= 0 else len(data) + cut)
    path.write_bytes(data[:end])
    with pytest.raises(
        CorruptCheckpointError, match=f"checkpoint {path} is corrupt: .*(trunc|trailer|short)"
    ):
        CheckpointReader(path)


def flip(path: Path, offset: int, bit: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_a_flipped_bit_anywhere_is_detected(tmp_path):
    original = save(filled(), tmp_path / "c").read_bytes()
    with CheckpointReader(tmp_path / "c") as reader:
        chunks = reader.chunks
    footer_len = struct.unpack("<Q", original[-24:-16])[0]
    where = {
        "header": (2, "magic"),
        "first chunk": (chunks[0].offset + 5, "chunk at slot 0: CRC32 mismatch"),
        "last leaves": (chunks[-1].offset + chunks[-1].length - 1, f"chunk at slot {chunks[-1].slot}: CRC32"),
        "footer": (len(original) - 24 - footer_len // 2, "footer CRC32 mismatch"),
        "footer length": (len(original) - 20, "footer"),
        "trailer magic": (len(original) - 3, "trailer"),
    }
    for name, (offset, message) in where.items():
        path = tmp_path / name.replace(" ", "-")
        path.write_bytes(original)
        flip(path, offset)
        with pytest.raises(CorruptCheckpointError, match=message), CheckpointReader(path) as reader:
            reader.verify()  # opening fails, or reading a chunk


def test_the_file_holds_no_pickle_and_a_footer_anyone_can_read(tmp_path):
    import json

    data = save(filled(), tmp_path / "c").read_bytes()
    footer_len = struct.unpack("<Q", data[-24:-16])[0]
    meta = json.loads(data[-24 - footer_len : -24])
    assert meta["format"] == 1 and meta["signature"].startswith("obs:float32[4]")
    assert data[:8] == b"APEXRLCK" and data[-8:] == b"APXRLEND"


# --- consistency while the table changes ---------------------------------------------------------------------------


def test_the_snapshot_is_the_table_at_its_instant_whatever_changes_while_it_is_read(tmp_path):
    t = filled(rows=250)
    before, info = contents(t), t.info()
    with Snapshot.take(t, 16) as snapshot:
        writer = CheckpointWriter(tmp_path / "c", snapshot.chunk_rows)
        next_id = 1000
        for i, (slot, columns, leaves) in enumerate(snapshot.chunks()):
            # Between chunks: inserts (overwriting chunks already read and chunks not read yet, one more than a
            # whole lap in all), priority updates and samples.
            rows = 7 if i % 2 else 13
            t.insert(cartpole_batch(rows, next_id), np.full(rows, 9.0))
            next_id += rows
            keys = t.sample(32).keys
            t.update_priorities(keys, np.full(32, 77.0))
            writer.add_chunk(slot, columns, leaves)
        t.insert(cartpole_batch(100, 5000))
        writer.finish(snapshot.state)
        assert snapshot.saved_rows > 0
    assert t.info().inserted_total > info.inserted_total + 100  # more than a lap went by during the snapshot
    assert read_back(tmp_path / "c") == before


def test_rows_an_insert_overwrites_while_their_chunk_is_being_copied_come_back(tmp_path):
    """Chunks are copied without the table lock, so an insert can land between a chunk's copy and the moment the
    snapshot marks it copied (or in the middle of the copy): the rows it overwrote were saved first and win."""
    t = filled()
    before = contents(t)
    next_id = [3000]

    class InsertThenLock:  # the snapshot's lock: an insert gets in just before each chunk is marked copied
        def __init__(self, lock) -> None:
            self.lock, self.inserting = lock, False

        def __enter__(self):
            if not self.inserting:  # the insert itself takes this lock to save the rows it overwrites
                self.inserting = True
                t.insert(cartpole_batch(9, next_id[0]), np.full(9, 5.0))
                next_id[0] += 9
                self.inserting = False
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    with Snapshot.take(t, 16) as snapshot:
        snapshot._lock = InsertThenLock(snapshot._lock)
        path = tmp_path / "c"
        write_snapshot(path, snapshot)
        assert snapshot.saved_rows > 0
    assert read_back(path) == before


def test_snapshots_may_overlap_and_none_is_taken_while_the_table_refuses_calls(tmp_path):
    """Each snapshot is a listener of its own: two open at once each come out as the table was when it began."""
    t = filled()
    first_contents = contents(t)
    with Snapshot.take(t, 16) as first:
        t.insert(cartpole_batch(30, 7000), np.full(30, 3.0))
        second_contents = contents(t)
        with Snapshot.take(t, 16) as second:
            t.insert(cartpole_batch(50, 8000), np.full(50, 4.0))
            write_snapshot(tmp_path / "second", second)
        t.insert(cartpole_batch(50, 9000), np.full(50, 5.0))
        write_snapshot(tmp_path / "first", first)
    assert read_back(tmp_path / "first") == first_contents
    assert read_back(tmp_path / "second") == second_contents
    assert first.saved_rows > 0 and second.saved_rows > 0
    t.refuse_calls("restoring its checkpoint")
    with pytest.raises(UnavailableError, match="restoring its checkpoint"):
        Snapshot.take(t, 16)
    with pytest.raises(UnavailableError):
        t.sample(1)
    assert t.info().size == 100  # Info keeps answering


# --- restore -------------------------------------------------------------------------------------------------------


def test_restore_onto_a_smaller_capacity_keeps_the_newest_rows_and_their_keys(tmp_path):
    t = filled()
    before = contents(t)
    r = restored(save(t, tmp_path / "c"), capacity=64)
    assert r.info().size == 64 and r.info().evicted_total == t.info().evicted_total + 36
    assert contents(r) == {k: v for k, v in before.items() if k >= 130 - 64}


def test_restore_onto_a_larger_capacity_keeps_every_row(tmp_path):
    t = filled()
    r = restored(save(t, tmp_path / "c"), capacity=1000)
    assert contents(r) == contents(t)
    r.insert(cartpole_batch(500, 2000))
    assert r.info().size == 600


def test_old_keys_update_the_same_rows_after_a_restore_and_never_others(tmp_path):
    t = filled()
    path = save(t, tmp_path / "c")
    sampled = t.sample(64)
    t.insert(cartpole_batch(10, 130))  # keys 130..139: after the checkpoint, lost with the old process
    r = restored(path)
    new = r.insert(cartpole_batch(10, 900))  # the restored shard gives keys 130..139 to other rows
    assert new.first_key == 130
    old_keys = np.concatenate([sampled.keys, np.arange(130, 140, dtype=np.uint64)])
    result = r.update_priorities(old_keys, np.full(len(old_keys), 3.0), incarnation=t.incarnation)
    held = [k for k in sampled.keys.tolist() if k >= 40]  # the insert above evicted keys 30..39
    # Applied to the rows both shards hold under the same keys; never to the new rows 130..139.
    assert (result.applied, result.stale) == (len(held), len(old_keys) - len(held))
    assert all(contents(r)[k][3] == pytest.approx(3.0**0.5) for k in held)
    assert all(contents(r)[k][3] == pytest.approx(500.0**0.5) for k in range(130, 140))  # the max priority
    unknown = r.update_priorities(sampled.keys, np.ones(64), incarnation=12345)
    assert unknown.stale == 64


def test_a_table_restored_twice_still_knows_the_first_incarnation(tmp_path):
    t = filled()
    r1 = restored(save(t, tmp_path / "c1"))
    r2 = restored(save(r1, tmp_path / "c2"))
    assert (
        r2.update_priorities(np.array([120], np.uint64), np.ones(1), incarnation=t.incarnation).applied == 1
    )
    assert (
        r2.update_priorities(np.array([120], np.uint64), np.ones(1), incarnation=r1.incarnation).applied == 1
    )


def test_a_failed_restore_leaves_an_empty_table_ready_for_the_next(tmp_path):
    good = save(filled(), tmp_path / "good")
    bad = tmp_path / "bad"
    bad.write_bytes(good.read_bytes())
    with CheckpointReader(bad) as reader:
        last = reader.chunks[-1]
    flip(bad, last.offset + 1)
    t = table()
    t.refuse_calls("restoring")
    with pytest.raises(CorruptCheckpointError), CheckpointReader(bad) as reader:
        t.load_state(reader.state, reader.blocks())
    assert t.info().size == 0
    with CheckpointReader(good) as reader:
        t.load_state(reader.state, reader.blocks())
    t.refuse_calls(None)
    assert contents(t) == read_back(good)


# --- compressed fields ---------------------------------------------------------------------------------------------


def compressed_filled(rows: int = 130, **config) -> ReplayTable:
    """As filled(), with compressed image observations (tests.conftest.pixel_batch)."""
    from tests.conftest import pixel_batch

    t = table(**config)
    for start in range(0, rows, 10):
        t.insert(
            pixel_batch(10, start),
            np.arange(start, start + 10) + 1.0,
            writer_id=f"w{start % 20 // 10}",
            sequence=start,
        )
    return t


def compressed_contents(t: ReplayTable) -> dict[int, tuple]:
    """key -> (action, obs frame, next_obs frame, writer, leaf) of every held row."""
    info = t.info()
    leaves = t._tree.leaf_values()
    s = t._storage
    return {
        key: (
            int(s["action"][key % 100]),
            s["obs"][key % 100],
            s["next_obs"][key % 100],
            t._row_writers[key % 100],
            float(leaves[key % 100]),
        )
        for key in range(info.inserted_total - info.size, info.inserted_total)
    }


def test_compressed_fields_and_row_writers_round_trip_frame_for_frame(tmp_path):
    from apexrl.common.compression import CompressedColumn
    from apexrl.replay_server.core.table_state import ROW_WRITER

    t = compressed_filled()
    before, info = compressed_contents(t), t.info()
    path = save(t, tmp_path / "c", chunk_rows=16)
    with CheckpointReader(path) as reader:
        assert struct.unpack("<8sII", path.read_bytes()[:16])[1] == 2  # files with frames say version 2
        reader.verify()
        seen = {}
        for first, columns, leaves in reader.blocks():
            assert isinstance(columns["obs"], CompressedColumn)
            for i in range(len(leaves)):
                seen[first + i] = (
                    int(columns["action"][i]),
                    columns["obs"].frame(i),
                    columns["next_obs"].frame(i),
                    columns[ROW_WRITER][i],
                    float(leaves[i]),
                )
    assert seen == before
    r = restored(path)
    assert compressed_contents(r) == before
    for field in ("size", "stored_bytes", "inserted_bytes_total", "total_priority", "evicted_total"):
        assert getattr(r.info(), field) == getattr(info, field), field
    assert r.sample(50).writers[0] in ("w0", "w1")
    assert path.stat().st_size < 130 * 200  # frames, not pixels (a raw row is 1,040 bytes)


def test_compressed_checkpoints_detect_flipped_bits_and_torn_files(tmp_path):
    path = save(compressed_filled(), tmp_path / "c")
    with CheckpointReader(path) as reader:
        chunk = reader.chunks[1]
    flip(path, chunk.offset + 3)  # inside the first frame lengths
    with pytest.raises(CorruptCheckpointError, match="CRC32 mismatch"), CheckpointReader(path) as reader:
        reader.verify()
    torn = tmp_path / "torn"
    torn.write_bytes(save(compressed_filled(), tmp_path / "d").read_bytes()[:-100])
    with pytest.raises(CorruptCheckpointError):
        CheckpointReader(torn)


def test_restore_with_max_bytes_keeps_the_newest_rows_that_fit(tmp_path):
    t = compressed_filled()
    before = compressed_contents(t)
    per_row = t.info().stored_bytes / t.info().size
    r = restored(save(t, tmp_path / "c"), max_bytes=int(40 * per_row))
    info = r.info()
    assert 35 <= info.size <= 45 and info.stored_bytes <= 40 * per_row
    assert info.evicted_total == t.info().evicted_total + 100 - info.size
    assert compressed_contents(r) == {k: v for k, v in before.items() if k >= 130 - info.size}

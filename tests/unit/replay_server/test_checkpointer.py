"""A shard's checkpoint directory (replay_server/durability/checkpointer.py) without a server: the newest good checkpoint is
restored, a torn or corrupt one (or one whose checksums hold over invalid content) is named in the log and skipped,
another signature or alpha refuses to start, the newest K are kept, and requests, periodic checkpoints and the final
one."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from apexrl.common.settings import SettingsError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.admission import NotReadyError
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.checkpointer import Checkpointer, signature_difference
from tests.conftest import cartpole_batch, wait_until

CARTPOLE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"


def table(**config) -> ReplayTable:
    return ReplayTable(TableConfig(**{"capacity": 100, "seed": 0, **config}))


def fresh(**config) -> ReplayTable:
    t = table(**config)
    t.refuse_calls("restoring")
    return t


def checkpoints_of(directory, rows_each: list[int], **options) -> Checkpointer:
    """A checkpointer that wrote one checkpoint after each insert of `rows_each` rows."""
    t = table()
    ck = Checkpointer(t, directory, keep=10, **options)
    start = 0
    for rows in rows_each:
        t.insert(cartpole_batch(rows, start))
        start += rows
        ck.checkpoint()
    return ck


def test_the_newest_checkpoint_is_restored(tmp_path):
    checkpoints_of(tmp_path, [10, 20, 30])
    t = fresh()
    state = Checkpointer(t, tmp_path).restore()
    assert state.next_key == 60 and t.info().size == 60


def test_an_empty_directory_restores_nothing(tmp_path):
    assert Checkpointer(fresh(), tmp_path / "new").restore() is None
    assert (tmp_path / "new").is_dir()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_corrupt_newest_checkpoint_is_named_in_the_log_and_skipped_for_the_previous(
    tmp_path, caplog, damage
):
    ck = checkpoints_of(tmp_path, [10, 20, 30])
    newest = ck.files()[-1]
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) * 2 // 3]
    elif damage == "flip":
        data[100] ^= 0x10
    else:
        data = bytearray()
    newest.write_bytes(bytes(data))
    t = fresh()
    checkpointer = Checkpointer(t, tmp_path)
    with caplog.at_level(logging.ERROR, "apexrl.replay.checkpoint"):
        state = checkpointer.restore()
    assert state.next_key == 30 and t.info().size == 30
    assert f"CORRUPT CHECKPOINT skipped: checkpoint {newest} is corrupt" in caplog.text
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()  # kept for inspection
    assert checkpointer.stats.corrupt_checkpoints == 1
    # The next checkpoint does not reuse the corrupt file's number.
    t.refuse_calls(None)
    assert checkpointer.checkpoint().path.endswith("checkpoint-0000000004.apexrl")


INVALID_CONTENT = {  # what a checkpoint with valid checksums may still hold: how to write it, what the log names
    "a NaN priority": (
        {"leaves": lambda leaves: np.where(np.arange(len(leaves)) == 3, np.nan, leaves)},
        "row 3 has priority ** alpha nan",
    ),
    "a negative priority": ({"leaves": lambda leaves: -leaves}, "row 0 has priority ** alpha -"),
    "an infinite priority": (
        {"leaves": lambda leaves: np.where(leaves > 0, np.inf, leaves)},
        "row 0 has priority ** alpha inf",
    ),
    "a NaN max_priority": ({"max_priority": float("nan")}, "max_priority must be finite"),
    "a NaN alpha": ({"alpha": float("nan")}, "alpha (nan) must be in [0, 10]"),
    "a key past 2**63": ({"next_key": 2**63 + 59}, f"next key {2**63 + 59}"),
    "an alias past the next key": ({"aliases": {5: 61}}, "alias of incarnation 5 up to key 61"),
    "a negative counter": ({"counters": {"evicted": -1}}, "negative counters"),
}


@pytest.mark.parametrize("content", list(INVALID_CONTENT))
def test_a_newest_checkpoint_with_valid_checksums_but_invalid_content_is_set_aside_like_a_corrupt_one(
    tmp_path, caplog, content
):
    """Checksums prove the file is the one written, not that it makes sense: such a file is named, renamed
    *.corrupt and counted, and the previous checkpoint is restored (before: the shard failed to start on it)."""
    from tests.support.tampered import rewrite_checkpoint

    changes, named = INVALID_CONTENT[content]
    ck = checkpoints_of(tmp_path, [10, 20, 30])
    newest = ck.files()[-1]
    rewrite_checkpoint(newest, **changes)
    t = fresh()
    checkpointer = Checkpointer(t, tmp_path)
    with caplog.at_level(logging.ERROR, "apexrl.replay.checkpoint"):
        state = checkpointer.restore()
    assert state.next_key == 30 and t.info().size == 30
    assert f"CORRUPT CHECKPOINT skipped: checkpoint {newest} holds invalid content: " in caplog.text
    assert named in caplog.text, caplog.text
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()
    assert checkpointer.stats.corrupt_checkpoints == 1
    t.refuse_calls(None)
    assert t.sample(64).keys.max() < 30  # the rows restored are the previous checkpoint's, and they serve


def test_every_checkpoint_invalid_starts_empty_loudly_and_takes_any_first_batch(tmp_path, caplog):
    from tests.support.tampered import rewrite_checkpoint

    ck = checkpoints_of(tmp_path, [10, 20])
    for path in ck.files():
        rewrite_checkpoint(path, leaves=lambda leaves: leaves - 2)
    t = fresh()
    with caplog.at_level(logging.ERROR, "apexrl.replay.checkpoint"):
        assert Checkpointer(t, tmp_path).restore() is None
    assert f"NO GOOD CHECKPOINT in {tmp_path}: all 2 were set aside as corrupt" in caplog.text
    t.refuse_calls(None)
    assert t.info().size == 0 and t.signature is None  # the bad files fixed nothing
    t.insert({"x": np.zeros((3, 2), np.uint8)})
    assert str(t.signature) == "x:uint8[2]"


def test_every_checkpoint_corrupt_starts_empty(tmp_path):
    ck = checkpoints_of(tmp_path, [10])
    ck.files()[0].write_bytes(b"APEXRLCK garbage")
    t = fresh()
    assert Checkpointer(t, tmp_path).restore() is None and t.info().size == 0


def test_a_leftover_temporary_file_is_removed(tmp_path):
    checkpoints_of(tmp_path, [10])
    stray = tmp_path / ".checkpoint-0000000002.apexrl.tmp"
    stray.write_bytes(b"half a checkpoint")
    assert Checkpointer(fresh(), tmp_path).restore().next_key == 10
    assert not stray.exists()


def test_another_signature_refuses_to_start_naming_the_difference(tmp_path):
    checkpoints_of(tmp_path, [10])
    other = Signature.parse(CARTPOLE.replace("obs:float32[4]", "obs:float32[8]", 1) + ",extra:uint8[]")
    with pytest.raises(SettingsError) as err:
        Checkpointer(fresh(signature=other), tmp_path).restore()
    message = str(err.value)
    assert "was made with signature obs:float32[4]" in message and "--signature obs:float32[8]" in message
    assert "field 'obs' is float32[4] there, float32[8] here; field 'extra' only here" in message
    # The same signature declared at start-up restores.
    assert Checkpointer(fresh(signature=Signature.parse(CARTPOLE)), tmp_path).restore().next_key == 10


def test_another_alpha_refuses_to_start(tmp_path):
    checkpoints_of(tmp_path, [10])
    with pytest.raises(SettingsError, match=r"priorities \*\* 0.6, this shard is started with --alpha 0.7"):
        Checkpointer(fresh(alpha=0.7), tmp_path).restore()


def test_signature_difference_names_order_changes():
    a = Signature.parse("a:int8[],b:int8[]")
    assert (
        signature_difference(a, Signature.parse("b:int8[],a:int8[]"))
        == "the fields are in another order (a, b there)"
    )


def test_only_the_newest_k_checkpoints_are_kept(tmp_path):
    t = table()
    ck = Checkpointer(t, tmp_path, keep=2)
    for i in range(4):
        t.insert(cartpole_batch(5, 5 * i))
        ck.checkpoint()
    assert [p.name for p in ck.files()] == ["checkpoint-0000000003.apexrl", "checkpoint-0000000004.apexrl"]


def test_requests_are_served_by_a_checkpoint_started_after_them(tmp_path):
    t = table()
    t.insert(cartpole_batch(10))
    ck = Checkpointer(t, tmp_path)
    ck.start()
    try:
        first = ck.request().result(10)
        t.insert(cartpole_batch(10, 10))
        futures = [ck.request() for _ in range(3)]
        results = [f.result(10) for f in futures]
        assert first.inserted_total == 10 and all(r.inserted_total == 20 for r in results)
        assert first.rows == 10 and first.bytes > 0 and first.incarnation == t.incarnation
    finally:
        ck.close(final=False)


def test_a_table_without_signature_cannot_be_checkpointed(tmp_path):
    ck = Checkpointer(table(), tmp_path)
    ck.start()
    with pytest.raises(Exception, match="no signature yet"):
        ck.request().result(10)
    assert ck.close() is None  # no final checkpoint of nothing


def test_periodic_checkpoints_only_when_the_table_changed(tmp_path):
    t = table()
    t.insert(cartpole_batch(10))
    ck = Checkpointer(t, tmp_path, every=0.05, keep=100)
    looked: list[bool] = []  # what each periodic look at the table found
    changed = ck._changed

    def look() -> bool:
        looked.append(changed())
        return looked[-1]

    ck._changed = look
    ck.start()
    try:
        wait_until(lambda: len(ck.files()) == 1, "the first periodic checkpoint")
        after_first = len(looked)
        wait_until(lambda: len(looked) >= after_first + 3, "three more periodic looks at the table")
        assert not any(looked[after_first:]) and len(ck.files()) == 1  # nothing changed since: no checkpoint
        t.update_priorities(np.array([3], np.uint64), np.ones(1))
        wait_until(lambda: len(ck.files()) == 2, "a checkpoint after an update")
    finally:
        ck.close(final=False)


def test_close_writes_a_final_checkpoint_and_answers_waiting_requests(tmp_path):
    t = table()
    t.insert(cartpole_batch(10))
    ck = Checkpointer(t, tmp_path)
    waiting = ck.request()  # no thread started: only the final checkpoint can answer it
    final = ck.close()
    assert waiting.result(1) == final and final.inserted_total == 10
    with pytest.raises(Exception, match="shutting down"):
        ck.request().result(1)


def test_stats_record_the_last_checkpoint(tmp_path):
    ck = checkpoints_of(tmp_path, [10, 20])
    s = ck.stats
    assert s.checkpoints_written == 2 and s.last_checkpoint_rows == 30 and s.last_checkpoint_bytes > 0
    assert s.last_checkpoint_unix_seconds > time.time() - 60


def test_durability_settings_are_checked():
    from apexrl.replay_server.server.config import ReplayConfig

    with pytest.raises(ValueError, match="wal needs checkpoint_dir"):
        ReplayConfig(wal="/tmp/wal")
    with pytest.raises(ValueError, match=r"checkpoint_keep \(0\) must be at least 1"):
        ReplayConfig(checkpoint_dir="/tmp/ck", checkpoint_keep=0)
    with pytest.raises(ValueError, match="checkpoint_every"):
        ReplayConfig(checkpoint_every=float("nan"))
    with pytest.raises(ValueError, match="checkpoint_max_mb_per_s"):
        ReplayConfig(checkpoint_max_mb_per_s=-1.0)


def test_the_rate_limiter_starts_afresh_after_a_restore(tmp_path):
    """Restored and replayed rows earn the learner no samples: the ratio counts from when the shard serves."""
    from apexrl.replay_server.durability.wal import WriteAheadLog

    limits = {"samples_per_insert": 1.0, "samples_per_insert_tolerance": 10.0, "min_size_to_sample": 1}
    t = table(**limits)
    wal = WriteAheadLog(tmp_path / "wal")
    wal.open(t)
    t.insert(cartpole_batch(50))
    wait_until(lambda: wal.durable_key == 50, "the batch logged")
    wal.close()
    restored = fresh(**limits)
    assert WriteAheadLog(tmp_path / "wal").replay(restored, restored=False) == 50
    restored.refuse_calls(None)
    restored.sample(10)
    restored.sample(
        10
    )  # 20 sampled for 0 inserted: at the tolerance (each call looks at the state before it)
    with pytest.raises(NotReadyError, match="rate limiter"):
        restored.sample(10)

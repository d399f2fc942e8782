"""[fleet] replay_durability (launcher/commands.py `replay_directories`): each shard gets its own checkpoint
directory under the run directory (and its write-ahead log there with wal); shards that would share a directory are
refused before anything starts; a resume says what each local role starts from (launcher/resume_state.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from apexrl.launcher.commands import check_commands, role_config
from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.resume_state import resume_lines
from apexrl.launcher.topology import Wiring, local_fleet, roles
from tests.unit.launcher.fleets import error, fleet


def shard_configs(config, run_dir: Path) -> dict:
    """Each shard's settings as the launcher starts it (a shard is wired to no other role)."""
    return {
        r.name: role_config(config, r, Wiring((), ""), run_dir) for r in roles(config) if r.kind == "replay"
    }


def test_each_shard_gets_its_own_directory_in_the_run_directory(tmp_path):
    off = shard_configs(local_fleet(num_shards=2), tmp_path)  # the default: no checkpoints
    assert [(s.checkpoint_dir, s.wal) for s in off.values()] == [(None, None), (None, None)]
    shards = shard_configs(local_fleet(num_shards=2, replay_durability="checkpoint"), tmp_path)
    assert {name: (s.checkpoint_dir, s.wal) for name, s in shards.items()} == {
        "shard-0": (str(tmp_path / "replay" / "shard-0"), None),
        "shard-1": (str(tmp_path / "replay" / "shard-1"), None),
    }
    logged = shard_configs(local_fleet(num_shards=2, replay_durability="wal"), tmp_path)
    assert {name: s.wal for name, s in logged.items()} == {
        "shard-0": str(tmp_path / "replay" / "shard-0" / "wal"),
        "shard-1": str(tmp_path / "replay" / "shard-1" / "wal"),
    }
    # The fleet-file key works the same; the shards' own settings are kept beside it.
    config = parse_config(
        fleet(
            fleet={"replay_durability": "checkpoint"},
            shard=[{"host": "m1", "port": 7000, "checkpoint_every": 30.0}],
        )
    )
    (shard,) = shard_configs(config, Path("/run")).values()
    assert (shard.checkpoint_dir, shard.checkpoint_every) == ("/run/replay/shard-0", 30.0)


def test_bad_values_and_a_shard_table_with_its_own_directory_are_refused():
    with pytest.raises(
        ConfigError, match=r"replay_durability \('always'\) must be one of off, checkpoint, wal"
    ):
        local_fleet(replay_durability="always")
    assert error(
        fleet(
            fleet={"replay_durability": "wal"},
            shard=[{"host": "m1", "port": 7000}, {"host": "m1", "port": 7001, "checkpoint_dir": "/ck"}],
        )
    ) == (
        "[[shard]] #1 sets checkpoint_dir and [fleet] replay_durability is 'wal', which gives each shard its own "
        "directory in the run directory (RUN_DIR/replay/shard-1): drop one of them"
    )


def test_shards_that_would_share_a_directory_are_refused_before_anything_starts(tmp_path):
    config = local_fleet(num_shards=2)
    shared = ["--checkpoint-dir", str(tmp_path / "ck")]
    with pytest.raises(ConfigError) as err:
        check_commands(config, "local", tmp_path, {"replay": shared})
    assert str(err.value) == (
        f"shard-0 and shard-1 would share the directory {tmp_path / 'ck'} (--checkpoint-dir): one shard's "
        f"checkpoints would replace the other's; give each shard its own ([[shard]] checkpoint_dir, or [fleet] "
        f"replay_durability, which keeps shard I's in RUN_DIR/replay/shard-I)"
    )
    assert not (tmp_path / "ck").exists()
    check_commands(local_fleet(num_shards=1), "local", tmp_path, {"replay": shared})  # one shard: its own
    # One shard's write-ahead log in another's checkpoint directory is a shared directory too.
    with pytest.raises(ConfigError, match="shard-0 and shard-1 would share the directory .*ck-0 \\(--wal\\)"):
        check_commands(
            parse_config(
                fleet(
                    shard=[
                        {"host": "m1", "port": 7000, "checkpoint_dir": str(tmp_path / "ck-0")},
                        {"host": "m1", "port": 7001, "checkpoint_dir": "ck-1", "wal": str(tmp_path / "ck-0")},
                    ]
                )
            ),
            "m1",
            tmp_path,
            {},
        )
    # The same path on two machines is two directories.
    two_machines = parse_config(
        fleet(
            shard=[
                {"host": "m1", "port": 7000, "checkpoint_dir": "/var/lib/apexrl/ck"},
                {"host": "m2", "port": 7001, "checkpoint_dir": "/var/lib/apexrl/ck"},
            ]
        )
    )
    check_commands(two_machines, "m1", tmp_path, {})
    # A pass-through arg may not move a shard away from the directory the setting gives it.
    with pytest.raises(ConfigError, match=r"shard-0: --checkpoint-dir /ck \(a --replay-arg\) and \[fleet\]"):
        check_commands(
            local_fleet(num_shards=1, replay_durability="checkpoint"),
            "local",
            tmp_path,
            {"replay": ["--checkpoint-dir", "/ck"]},
        )


def test_a_resume_says_what_each_role_starts_from(tmp_path):
    config = local_fleet(num_shards=2, replay_durability="checkpoint")
    assert resume_lines(config, "local", tmp_path, {}) == [
        (
            logging.WARNING,
            f"no checkpoint in {tmp_path / 'checkpoints'}: the learner starts from fresh weights",
        ),
        (logging.WARNING, f"no replay checkpoint in {tmp_path / 'replay' / 'shard-0'}: shard-0 starts empty"),
        (logging.WARNING, f"no replay checkpoint in {tmp_path / 'replay' / 'shard-1'}: shard-1 starts empty"),
    ]
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint.pt").write_bytes(b"")
    for i in range(2):
        (tmp_path / "replay" / f"shard-{i}").mkdir(parents=True)
        (tmp_path / "replay" / f"shard-{i}" / "checkpoint-0000000003.apexrl").write_bytes(b"")
    assert resume_lines(config, "local", tmp_path, {}) == [
        (
            logging.INFO,
            f"the learner resumes from {tmp_path / 'checkpoints' / 'checkpoint.pt'} (networks, optimiser, "
            f"update count)",
        ),
        (
            logging.INFO,
            f"the replay is restored: shard-0 from {tmp_path / 'replay' / 'shard-0'}, shard-1 from "
            f"{tmp_path / 'replay' / 'shard-1'}",
        ),
    ]
    assert resume_lines(local_fleet(num_shards=2), "local", tmp_path, {})[1:] == [
        (
            logging.INFO,
            "the replay starts empty on shard-0, shard-1 ([fleet] replay_durability is off; 'checkpoint' keeps "
            "it across a resume)",
        )
    ]


def test_a_write_ahead_log_alone_is_a_saved_replay(tmp_path):
    config = local_fleet(num_shards=1, replay_durability="wal")
    wal = tmp_path / "replay" / "shard-0" / "wal"
    wal.mkdir(parents=True)
    (wal / "wal-00000000000000000000.log").write_bytes(b"")
    assert resume_lines(config, "local", tmp_path, {})[-1] == (
        logging.INFO,
        f"the replay is restored: shard-0 from {tmp_path / 'replay' / 'shard-0'}",
    )

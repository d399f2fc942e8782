"""What a run records for --resume (launcher/record.py), the run directory's lock (launcher/run_dir.py) and where
a resumed run's progress continues from (launcher/progress.py): no fleet is started here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from apexrl.common.env_settings import EnvKwargs
from apexrl.launcher.fleet_config import ConfigError, FleetSettings
from apexrl.launcher.fleet_file import load_config, parse_config
from apexrl.launcher.progress import Progress, ProgressCsv, ProgressRow, last_row
from apexrl.launcher.record import RECORD_KEY, RESUMABLE, fleet_record, read_run, redacted
from apexrl.launcher.run_dir import RunLock, check_new
from apexrl.launcher.topology import local_fleet
from tests.unit.launcher.fleets import EXAMPLE, fleet

FLEETS = EXAMPLE.parent / "fleets"


def write_run(run_dir: Path, config, host: str = "local", extra: dict | None = None) -> None:
    """A config.json as Launch writes it (the keys read_run reads)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "host_name": host,
        "started_at": "2030-01-01T00:00:00",
        "launch_options": {"num_shards": len(config.shards)},
        "pass_through_args": extra or {"learner": ["--batch-size", "64"]},
        RECORD_KEY: fleet_record(config),
    }
    (run_dir / "config.json").write_text(json.dumps(redacted(doc)))


@pytest.mark.parametrize(
    "config",
    [
        local_fleet(num_shards=3, num_actors=2, env_kwargs=EnvKwargs({"sutton_barto_reward": True}), seed=4),
        load_config(EXAMPLE),
        load_config(FLEETS / "three_machines.toml"),
        parse_config(
            fleet(shard=[{"host": "m1", "port": 7000, "alpha": 0.5, "signature": "obs:float32[4]"}])
        ),
    ],
    ids=["local", "fleet.toml", "three_machines.toml", "role settings"],
)
def test_a_recorded_fleet_reads_back_as_the_same_fleet(config, tmp_path):
    config = dataclasses.replace(config, run_dir=str(tmp_path))
    write_run(tmp_path, config, host=config.learner.host)
    recorded = read_run(tmp_path, {})
    assert recorded.config == config
    assert recorded.host == config.learner.host and recorded.extra_args == {"learner": ["--batch-size", "64"]}
    assert recorded.started_at == "2030-01-01T00:00:00" and recorded.resumed_at == ()
    assert not recorded.needs_token


def test_a_resume_changes_only_what_steers_the_launch(tmp_path):
    config = local_fleet(num_shards=1, num_actors=1, run_dir=str(tmp_path))
    write_run(tmp_path, config)
    assert set(RESUMABLE) <= {f.name for f in dataclasses.fields(FleetSettings)}
    changed = read_run(tmp_path, {"max_seconds": 30.0, "target_return": 100.0}).config
    assert changed == dataclasses.replace(config, max_seconds=30.0, target_return=100.0)
    with pytest.raises(ConfigError, match="--env, --seed would change it"):
        read_run(tmp_path, {"env": "Acrobot-v1", "seed": 1})
    with pytest.raises(ConfigError, match=r"--resume: max_seconds \(-1.0\) must be positive"):
        read_run(tmp_path, {"max_seconds": -1.0})


def test_the_token_is_never_recorded_and_a_resume_must_be_given_it_again(tmp_path):
    config = local_fleet(num_shards=1, num_actors=1, token="s3cret")
    write_run(tmp_path, config)
    assert "s3cret" not in (tmp_path / "config.json").read_text()
    recorded = read_run(tmp_path, {})
    assert recorded.needs_token and recorded.config.token is None
    assert read_run(tmp_path, {"token": "again"}).config.token == "again"
    data = fleet(shard=[{"host": "m1", "port": 7000, "token": "own"}])
    write_run(tmp_path / "role", parse_config(data), host="m1")
    with pytest.raises(ConfigError, match=r"\[\[shard\]\] #0 had its own token"):
        read_run(tmp_path / "role", {})


def test_a_run_directory_without_a_run_or_its_record_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        read_run(tmp_path / "missing", {})
    with pytest.raises(ConfigError, match=r"holds no run \(config.json is missing\)"):
        read_run(tmp_path, {})
    (tmp_path / "config.json").write_text('{"host_name": "local"}')
    with pytest.raises(ConfigError, match="records no fleet to resume"):
        read_run(tmp_path, {})
    with pytest.raises(ConfigError, match="already holds a run .*--resume"):
        check_new(tmp_path)


def test_the_run_directory_lock_is_held_by_the_launcher_and_the_roles_it_passes_it_to(tmp_path):
    lock = RunLock.acquire(tmp_path / "run")
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    with pytest.raises(ConfigError, match="is in use by a running launch"):
        RunLock.acquire(tmp_path / "run")
    # A role started with the lock's descriptor keeps the run locked after the launcher let go (killed, say).
    role = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=(lock.fd,)
    )
    try:
        lock.release()
        with pytest.raises(ConfigError, match="is in use"):
            RunLock.acquire(tmp_path / "run")
    finally:
        role.communicate(b"", timeout=30)  # the role exits
    RunLock.acquire(tmp_path / "run").release()


def row(**changes) -> ProgressRow:
    values = dict(
        wall_seconds=30.0,
        env_steps=5_000,
        episodes=120,
        updates=300,
        updates_per_second=10.0,
        mean_return_100=None,
        mean_explore_return_100=20.5,
        weight_version=7,
        unix_time=1_900_000_000.0,
        eval_episodes=10,
    )
    return ProgressRow(**{**values, **changes})


def test_a_resumed_run_appends_to_progress_csv_and_counts_on_from_its_last_row(tmp_path):
    path = tmp_path / "progress.csv"
    first = ProgressCsv(path)
    first.write(row(env_steps=100, wall_seconds=1.0))
    first.write(row())
    first.close()
    with open(path, "a") as f:
        f.write("31.0,5100,12")  # a line cut short by a killed launcher
    assert last_row(path) == row()
    assert last_row(tmp_path / "none.csv") is None

    progress = Progress(tmp_path / "episodes", [], None, start_time=1_000.0, previous=row())
    resumed = progress.tick(1_004.0)
    assert resumed.wall_seconds == 34.0 and resumed.env_steps == 5_000 and resumed.updates is None
    again = ProgressCsv(path)
    again.write(resumed)
    again.close()
    assert path.read_text().count("wall_seconds") == 1  # one header
    assert last_row(path) == resumed  # the cut line is skipped, the appended row read

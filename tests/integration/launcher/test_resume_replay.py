"""What a resume keeps of the replay, with real fleets: with [fleet] replay_durability each shard checkpoints its
table in RUN_DIR/replay/shard-I and a resume restores it (the launch says so, each shard logs the rows it restored);
shards that would share one checkpoint directory are refused before anything starts; a resume of a run stopped
before its first checkpoint says that the learner starts from fresh weights and the shards empty."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import apexrl
from apexrl.launcher.api import pick_host, plan_new, plan_resume, start
from apexrl.replay_server.durability.checkpoint import CheckpointReader
from apexrl.replay_server.durability.checkpointer import Checkpointer
from tests.conftest import wait_until
from tests.integration.launcher.test_resume import launch_refused


def small_fleet(run_dir: Path, **settings) -> apexrl.FleetConfig:
    """Two shards keeping their replay, the learner, one actor; no evaluator (nothing here needs returns)."""
    return apexrl.local_fleet(
        num_shards=2,
        num_actors=1,
        evaluator=False,
        **{
            "run_dir": str(run_dir),
            "seed": 0,
            "replay_durability": "checkpoint",
            "progress_seconds": 1.0,
            "max_seconds": 120.0,
            **settings,
        },
    )


def launch_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "apexrl.launch"]


def saved_rows(directory: Path) -> int:
    """Rows of the newest checkpoint in a shard's directory."""
    with CheckpointReader(Checkpointer.list_files(directory)[-1]) as reader:
        return reader.state.size


@pytest.mark.timeout(150)
def test_a_resume_restores_the_replay_each_shard_kept_in_the_run_directory(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="apexrl.launch")
    run_dir = tmp_path / "run"
    shard_dirs = [run_dir / "replay" / f"shard-{i}" for i in range(2)]
    with apexrl.launch(small_fleet(run_dir, min_replay_size=400)) as run:
        # The learner trains only once the shards hold min_replay_size rows between them.
        wait_until(
            lambda: not run.running or ((run.progress() and run.progress().updates) or 0) > 0,
            "the learner made updates",
            timeout=90,
        )
        assert run.running, run.wait()
        run.stop(timeout=60)  # each shard writes its table once more at SIGTERM
    rows = [saved_rows(d) for d in shard_dirs]
    assert all(n > 0 for n in rows) and sum(rows) >= 400, rows

    caplog.clear()
    with apexrl.resume(run_dir, max_seconds=120.0) as resumed:
        logs = [run_dir / "logs" / f"shard-{i}.log" for i in range(2)]

        def restored() -> bool:
            return all(f"restored {n} rows" in log.read_text() for n, log in zip(rows, logs, strict=True))

        wait_until(lambda: not resumed.running or restored(), "both shards restored their rows", timeout=60)
        assert resumed.running, resumed.wait()
    lines = launch_lines(caplog)
    assert f"the replay is restored: shard-0 from {shard_dirs[0]}, shard-1 from {shard_dirs[1]}" in lines, (
        lines
    )
    assert any(line.startswith("the learner resumes from ") for line in lines), lines


def test_shards_sharing_one_checkpoint_directory_are_refused_before_anything_starts(tmp_path):
    shared = tmp_path / "ck"
    refused = launch_refused(
        "--num-shards", "2", f"--replay-arg=--checkpoint-dir={shared}", "--run-dir", str(tmp_path / "run")
    )
    assert refused.startswith(
        f"apexrl launch: error: shard-0 and shard-1 would share the directory {shared} (--checkpoint-dir)"
    ), refused
    assert not (tmp_path / "run").exists() and not shared.exists()  # nothing started, nothing written


def test_a_resume_of_a_run_stopped_before_its_first_checkpoint_says_what_starts_afresh(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="apexrl.launch")
    run_dir = tmp_path / "run"
    config = small_fleet(run_dir)
    stopped = threading.Event()
    stopped.set()  # a Ctrl-C before the first role started: the run is recorded, nothing was saved
    first = start(plan_new(config, pick_host(config, None), {}), stop=stopped).wait(60)
    assert first.reason == "signal" and (run_dir / "config.json").is_file()
    assert not (run_dir / "checkpoints" / "checkpoint.pt").exists() and not (run_dir / "replay").exists()

    caplog.clear()
    again = start(plan_resume(run_dir, {}), stop=stopped).wait(60)
    assert again.reason == "signal"
    lines = launch_lines(caplog)
    assert f"no checkpoint in {run_dir / 'checkpoints'}: the learner starts from fresh weights" in lines, (
        lines
    )
    for i in range(2):
        directory = run_dir / "replay" / f"shard-{i}"
        assert f"no replay checkpoint in {directory}: shard-{i} starts empty" in lines, lines

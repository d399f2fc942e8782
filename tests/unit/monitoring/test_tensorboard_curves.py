"""TensorBoard event files (common/tensorboard_curves.py), read back with TensorBoard's own EventAccumulator: the
launcher's returns against environment steps (written through progress.csv's writer) and the learner's loss,
mean Q and updates/s against updates."""

from __future__ import annotations

import csv
import sys
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from apexrl.common.spaces import EnvSpaces
from apexrl.common.tensorboard_curves import TensorBoardCurves
from apexrl.launcher.progress import ProgressCsv, ProgressRow


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(logdir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def row(env_steps: int, evaluation: float | None, exploration: float | None) -> ProgressRow:
    return ProgressRow(
        wall_seconds=1.0,
        env_steps=env_steps,
        episodes=3,
        updates=None,
        updates_per_second=None,
        mean_return_100=evaluation,
        mean_explore_return_100=exploration,
        weight_version=None,
        unix_time=time.time(),
    )


def test_the_progress_writer_puts_both_returns_against_env_steps_beside_progress_csv(tmp_path):
    progress = ProgressCsv(tmp_path / "progress.csv", tensorboard_dir=tmp_path / "tensorboard" / "episodes")
    progress.write(row(0, None, None))  # nothing known yet: no point
    progress.write(row(1_000, None, 21.5))
    progress.write(row(2_500, 30.0, 40.25))
    progress.close()
    assert read_scalars(tmp_path / "tensorboard" / "episodes") == {
        "return/exploration_mean_100": [(1_000, 21.5), (2_500, 40.25)],
        "return/evaluation_mean_100": [(2_500, 30.0)],
    }
    with open(tmp_path / "progress.csv", newline="") as f:
        assert [r["env_steps"] for r in csv.DictReader(f)] == ["0", "1000", "2500"]  # the CSV is unchanged


def test_points_are_on_disk_at_every_tick_while_the_run_goes_on(tmp_path):
    progress = ProgressCsv(tmp_path / "progress.csv", tensorboard_dir=tmp_path / "tb")
    try:
        progress.write(row(100, 9.0, 8.0))
        assert read_scalars(tmp_path / "tb")["return/evaluation_mean_100"] == [(100, 9.0)]
    finally:
        progress.close()


def test_without_a_directory_no_event_files_and_no_tensorboard_import(tmp_path):
    progress = ProgressCsv(tmp_path / "progress.csv")
    progress.write(row(100, 9.0, 8.0))
    progress.close()
    assert [p.name for p in tmp_path.iterdir()] == ["progress.csv"]


def test_the_launchers_curves_load_no_model_library(tmp_path):
    """The launcher must not load torch: its writer is tensorboard's own (checked in a fresh interpreter)."""
    import subprocess

    code = (
        "import sys, time; from apexrl.launcher.progress import ProgressCsv, ProgressRow; "
        f"p = ProgressCsv({str(tmp_path / 'p.csv')!r}, tensorboard_dir={str(tmp_path / 'tb')!r}); "
        "p.write(ProgressRow(1.0, 10, 1, None, None, 5.0, 6.0, None, time.time())); p.close(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
    assert read_scalars(tmp_path / "tb")["return/exploration_mean_100"] == [(10, 6.0)]


def test_tensorboard_is_imported_when_the_curves_are_built_or_at_their_first_point(tmp_path):
    """The learner imports it at start (never mid-training), the launcher at its first return (its start waits on
    nothing it does not need yet); neither writes a file before the first point (checked in a fresh interpreter)."""
    import subprocess

    code = (
        "import sys; from apexrl.common.tensorboard_curves import TensorBoardCurves\n"
        "loaded = lambda: 'tensorboard' in sys.modules\n"
        f"later = TensorBoardCurves({str(tmp_path / 'later')!r}, load_at_start=False)\n"
        "seen = [loaded()]\n"
        "later.add(1, x=None)\n"
        "seen.append(loaded())\n"
        "later.add(1, x=2.0)\n"
        "seen.append(loaded())\n"
        "later.close()\n"
        "print(seen)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[False, False, True]"
    code = (
        "import sys; from apexrl.common.tensorboard_curves import TensorBoardCurves\n"
        f"TensorBoardCurves({str(tmp_path / 'at_start')!r})\n"
        "print('tensorboard' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["later"]
    assert read_scalars(tmp_path / "later") == {"x": [(1, 2.0)]}


def test_the_learners_curves_are_loss_mean_q_and_updates_per_second_against_updates(tmp_path):
    curves = TensorBoardCurves(tmp_path / "learner", "learner/")  # as learner/main.py builds them
    assert not (tmp_path / "learner").exists()  # nothing until the first point
    curves.add(20, loss=0.5, mean_q=1.25)
    curves.add(40, loss=0.25, mean_q=2.5)
    curves.add(40, updates_per_second=80.0)
    curves.close()
    assert read_scalars(tmp_path / "learner") == {
        "learner/loss": [(20, 0.5), (40, 0.25)],
        "learner/mean_q": [(20, 1.25), (40, 2.5)],
        "learner/updates_per_second": [(40, 80.0)],
    }


@pytest.mark.timeout(120)
def test_a_learner_training_from_a_real_shard_leaves_its_curves_in_the_run_directory(tmp_path, make_shard):
    """Learner.run against an in-process shard over gRPC, as `apexrl learner` wires it (learner/main.py)."""
    pytest.importorskip("torch")
    import threading
    from pathlib import Path

    import numpy as np

    from apexrl.learner.config import LearnerConfig
    from apexrl.learner.learner import Learner, make_sampler
    from apexrl.parameter_server.store import WeightStore
    from apexrl.replay_server.client.replay_client import ReplayClient
    from apexrl.replay_server.core.table import TableConfig

    shard = make_shard(TableConfig(capacity=1000, seed=0))
    rng = np.random.default_rng(0)
    with ReplayClient(shard.address) as client:
        client.insert(
            {
                "obs": rng.normal(size=(400, 4)).astype(np.float32),
                "action": rng.integers(0, 2, 400),
                "reward": np.ones(400, np.float32),
                "discount": np.full(400, 0.97, np.float32),
                "next_obs": rng.normal(size=(400, 4)).astype(np.float32),
            }
        )
        client.flush()
    config = LearnerConfig(
        replay=(shard.address,),
        run_dir=str(tmp_path / "run"),
        device="cpu",
        seed=0,
        hidden_sizes=(16,),
        batch_size=16,
        min_replay_size=100,
        max_updates=60,
        sample_batches_per_call=1,
    )
    curves = TensorBoardCurves(Path(config.run_dir) / "tensorboard" / "learner", "learner/")
    learner = Learner(
        config, EnvSpaces.vector(4, 2), make_sampler(config), WeightStore().publish, curves=curves
    )
    runner = threading.Thread(target=learner.run, args=(threading.Event(),), kwargs={"progress_every": 0.01})
    runner.start()
    runner.join(90)
    assert not runner.is_alive() and learner.updates == 60
    learner.close()
    scalars = read_scalars(tmp_path / "run" / "tensorboard" / "learner")
    assert [step for step, _ in scalars["learner/loss"]] == [20, 40, 60]
    assert [step for step, _ in scalars["learner/mean_q"]] == [20, 40, 60]
    rates = scalars["learner/updates_per_second"]
    assert rates and all(rate > 0 for _, rate in rates) and rates[-1][0] <= 60

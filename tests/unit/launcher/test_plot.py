"""The learning-curve PNG from a run directory's progress.csv and episodes.csv (synthetic data)."""

from __future__ import annotations

import csv

import numpy as np

from apexrl.common.episodes import COLUMNS as EPISODE_COLUMNS
from apexrl.launcher.plot import plot_learning_curve, read_eval_returns, rolling_mean
from apexrl.launcher.progress import ProgressRow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
START = 1_700_000_000.0


def write_run(tmp_path, eval_episodes: int = 150):
    progress = tmp_path / "progress.csv"
    with open(progress, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=ProgressRow.columns())
        writer.writeheader()
        for tick in range(1, 31):
            writer.writerow(
                {
                    "wall_seconds": 5.0 * tick,
                    "env_steps": 1000 * tick,
                    "episodes": 10 * tick,
                    "updates": 100 * tick,
                    "updates_per_second": 20.0,
                    "mean_return_100": "",
                    "mean_explore_return_100": "",
                    "weight_version": tick,
                    "unix_time": START + 5.0 * tick,
                }
            )
    episodes = tmp_path / "episodes.csv"
    rng = np.random.default_rng(0)
    with open(episodes, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(EPISODE_COLUMNS)
        for k in range(eval_episodes):  # evaluation returns climbing to 500, interleaved with exploration
            t = START + 1.0 + k
            ret = min(500.0, 10.0 + 4.0 * k + rng.normal(0, 20))
            writer.writerow([f"{t:.3f}", 0, "evaluate", 100 * k, ret, int(ret), k // 5])
            writer.writerow([f"{t + 0.5:.3f}", 1, "explore", 90 * k, 20.0, 20, k // 5])
    return progress, episodes


def test_learning_curve_png(tmp_path):
    progress, episodes = write_run(tmp_path)
    out = plot_learning_curve(
        progress, episodes, tmp_path / "curve.png", target_return=475.0, title="CartPole-v1"
    )
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically


def test_plot_without_evaluation_episodes_still_writes_a_png(tmp_path):
    progress, episodes = write_run(tmp_path, eval_episodes=0)
    out = plot_learning_curve(progress, episodes, tmp_path / "empty.png", target_return=None)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_rolling_mean_and_eval_filter(tmp_path):
    assert rolling_mean(np.array([1.0, 3.0, 5.0]), window=2).tolist() == [1.0, 2.0, 4.0]
    assert rolling_mean(np.array([])).size == 0
    _, episodes = write_run(tmp_path, eval_episodes=3)
    times, returns = read_eval_returns(episodes)
    assert times.tolist() == [START + 1, START + 2, START + 3] and returns.size == 3

"""The learning curve of a run: mean evaluation return (rolling over 100 episodes) against environment steps and
against wall time, from the run directory's progress.csv and episodes.csv.

Episodes carry wall times, not the fleet's step count, so the fleet's env steps at each evaluation episode are
interpolated from the progress ticks (which pair wall time with the summed env steps of all exploring actors).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from apexrl.common.episodes import EVALUATE, SOLVE_WINDOW, read_episodes

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def read_progress(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unix_time, wall_seconds, env_steps) of every progress tick."""
    unix, wall, steps = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                unix.append(float(row["unix_time"]))
                wall.append(float(row["wall_seconds"]))
                steps.append(float(row["env_steps"]))
            except (KeyError, TypeError, ValueError):
                continue
    return np.array(unix), np.array(wall), np.array(steps)


def read_eval_returns(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(wall_time, return) of every evaluation episode, in time order."""
    evaluations = [r for r in read_episodes(path) if r.role == EVALUATE]
    times = [r.wall_time for r in evaluations]
    returns = [r.episode_return for r in evaluations]
    order = np.argsort(times, kind="stable")
    return np.array(times)[order], np.array(returns)[order]


def rolling_mean(values: np.ndarray, window: int = SOLVE_WINDOW) -> np.ndarray:
    """Mean of the last `window` values at every position (fewer at the start)."""
    if values.size == 0:
        return values.astype(float)
    sums = np.cumsum(np.insert(values.astype(float), 0, 0.0))
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def plot_learning_curve(
    progress_csv: str | os.PathLike,
    episodes_csv: str | os.PathLike,
    out: str | os.PathLike,
    *,
    target_return: float | None = None,
    title: str = "",
) -> Path:
    """Write a two-panel PNG (return vs env steps, return vs wall time); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unix, wall, steps = read_progress(progress_csv)
    times, returns = read_eval_returns(episodes_csv)
    mean = rolling_mean(returns)
    episode_steps, episode_wall = _episode_positions(unix, wall, steps, times)

    fig, (ax_steps, ax_wall) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    panels = (
        (ax_steps, episode_steps, "environment steps (all exploring actors)"),
        (ax_wall, episode_wall / 60.0, "wall time (minutes since launch)"),
    )
    for ax, x, xlabel in panels:
        _draw_panel(ax, x, returns, mean, xlabel, target_return)
    ax_steps.ticklabel_format(axis="x", style="sci", scilimits=(0, 4))
    fig.suptitle(f"{title} learning curve" if title else "learning curve")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp{os.getpid()}{out.suffix}")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def _episode_positions(
    unix: np.ndarray, wall: np.ndarray, steps: np.ndarray, times: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, wall seconds since launch) of each evaluation episode: episodes carry only wall times, so their
    steps are interpolated from the progress ticks; without ticks, time counts from the first episode and the
    steps are NaN (no step axis)."""
    if unix.size:
        start = unix[0] - wall[0]  # the launch time: unix time at wall_seconds 0
        # (0 s, 0 steps) anchors episodes finished before the first tick.
        tick_wall = np.concatenate([[0.0], wall]) if wall[0] > 0 else wall
        tick_steps = np.concatenate([[0.0], steps]) if wall[0] > 0 else steps
        episode_wall = times - start
        return np.interp(episode_wall, tick_wall, tick_steps), episode_wall
    episode_wall = times - (times[0] if times.size else 0.0)
    return np.full(times.shape, np.nan), episode_wall


def _draw_panel(
    ax: Axes, x: np.ndarray, returns: np.ndarray, mean: np.ndarray, xlabel: str, target_return: float | None
) -> None:
    """One panel: the evaluation episodes and their rolling mean against `x`, and the target line."""
    if returns.size:
        ax.scatter(x, returns, s=4, alpha=0.25, color="tab:blue", label="evaluation episode")
        ax.plot(x, mean, color="tab:blue", linewidth=2, label=f"mean of last {SOLVE_WINDOW}")
    else:
        ax.text(0.5, 0.5, "no evaluation episodes", transform=ax.transAxes, ha="center", va="center")
    if target_return is not None:
        ax.axhline(
            target_return,
            color="tab:red",
            linestyle="--",
            linewidth=1.2,
            label=f"target {target_return:g}",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episode return (greedy evaluation)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize="small")

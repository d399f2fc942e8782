"""What the launcher knows about a running fleet: Prometheus counters scraped from the roles' /metrics and the
episodes the actors append to their CSV files, summed into one progress row per tick.
"""

from __future__ import annotations

import csv
import logging
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from apexrl.common.episodes import EVALUATE, SOLVE_WINDOW, EpisodeTail
from apexrl.common.tensorboard_curves import TensorBoardCurves

MIN_RATE_SECONDS = 1.0  # the shortest interval a rate is measured over (see _Rate)


def scrape(url: str, timeout: float = 1.0) -> dict[str, float]:
    """Sample name -> value summed over labels, from a Prometheus text endpoint; raises OSError when unreachable."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode("utf-8", "replace")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


class MetricsScraper:
    """Remembers the last value every endpoint reported, so an endpoint that misses one scrape (busy, restarting)
    does not make the fleet's counters jump back."""

    def __init__(self, urls: Sequence[str], timeout: float = 1.0) -> None:
        self.urls = list(urls)
        self.timeout = timeout
        self.last: dict[str, dict[str, float]] = {}
        self._pool = (
            ThreadPoolExecutor(max_workers=max(1, min(16, len(self.urls))), thread_name_prefix="scrape")
            if self.urls
            else None
        )

    def refresh(self) -> None:
        if self._pool is None:
            return
        for url, values in zip(self.urls, self._pool.map(self._try, self.urls), strict=True):
            if values is not None:
                self.last[url] = values

    def total(self, name: str) -> float:
        return sum(values.get(name, 0.0) for values in self.last.values())

    def value(self, url: str, name: str) -> float | None:
        return self.last.get(url, {}).get(name)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _try(self, url: str) -> dict[str, float] | None:
        try:
            return scrape(url, self.timeout)
        except (OSError, ValueError):
            return None


@dataclass(frozen=True)
class ProgressRow:
    """One tick of the fleet as this machine sees it (the columns of progress.csv)."""

    wall_seconds: float
    env_steps: int
    episodes: int
    updates: int | None
    updates_per_second: float | None
    mean_return_100: float | None
    mean_explore_return_100: float | None
    weight_version: int | None
    unix_time: float
    restarts: int = 0  # role restarts by this machine's launcher so far
    env_steps_per_second: float | None = None  # since the last tick, as updates_per_second (_Rate)
    eval_episodes: int = 0  # evaluation episodes read so far (mean_return_100 is over the last 100 of them)

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_csv(cls, row: Mapping[str, str]) -> ProgressRow:
        """A row of progress.csv read back (an empty cell is None); ValueError for a row that is not one."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            text, kind = row.get(f.name) or "", str(f.type)  # types are text here (annotations are deferred)
            if text:
                values[f.name] = int(float(text)) if kind.startswith("int") else float(text)
            elif "None" in kind:
                values[f.name] = None
            elif f.default is not MISSING:  # a column newer than the file
                values[f.name] = f.default
            else:
                raise ValueError(f"progress.csv row without {f.name}: {dict(row)}")
        return cls(**values)


def last_row(path: Path) -> ProgressRow | None:
    """The last complete row of a progress.csv (None when there is none): where a resumed run continues from."""
    last = None
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    last = ProgressRow.from_csv(row)
                except ValueError:
                    continue  # a line cut short by a killed launcher
    except FileNotFoundError:
        return None
    return last


class Progress:
    """Collects scraped counters and episode returns into progress rows.

    Environment steps and exploration episodes count exploring actors only (the evaluator's play is not
    training data); returns come from the episode CSVs this machine can read. A resumed run continues from
    `previous`, the last row of the interrupted run: the actors' counters start again at 0 with their processes,
    so its env steps, episodes and wall seconds are added (the learner restores its own update count).
    """

    def __init__(
        self,
        episodes_dir: Path,
        actor_urls: Sequence[str],
        learner_url: str | None,
        start_time: float,
        previous: ProgressRow | None = None,
    ) -> None:
        self.episodes_dir = episodes_dir
        self.start_time = start_time - (previous.wall_seconds if previous else 0.0)
        self._base_steps = previous.env_steps if previous else 0
        self._base_episodes = previous.episodes if previous else 0
        self.actor_urls = list(actor_urls)
        self.learner_url = learner_url
        self.scraper = MetricsScraper(self.actor_urls + ([learner_url] if learner_url else []))
        self._tails: dict[Path, EpisodeTail] = {}
        self.eval_returns: deque[float] = deque(maxlen=SOLVE_WINDOW)
        self.explore_returns: deque[float] = deque(maxlen=SOLVE_WINDOW)
        self.eval_episodes = 0
        self.explore_episodes_read = 0
        self._env_steps_rate = _Rate()
        self._updates_rate = _Rate()

    def read_episodes(self) -> None:
        for path in sorted(self.episodes_dir.glob("*.csv")):
            tail = self._tails.setdefault(path, EpisodeTail(path))
            for record in tail.read_new():
                value = record.episode_return
                if record.role == EVALUATE:
                    self.eval_returns.append(value)
                    self.eval_episodes += 1
                else:
                    self.explore_returns.append(value)
                    self.explore_episodes_read += 1

    def eval_mean(self) -> float | None:
        return _mean(self.eval_returns)

    def tick(self, now: float) -> ProgressRow:
        self.scraper.refresh()
        self.read_episodes()
        env_steps = sum(self.scraper.value(u, "apexrl_actor_env_steps_total") or 0.0 for u in self.actor_urls)
        episodes = sum(self.scraper.value(u, "apexrl_actor_episodes_total") or 0.0 for u in self.actor_urls)
        updates = version = rate = None
        if self.learner_url is not None:
            value = self.scraper.value(self.learner_url, "apexrl_learner_updates_total")
            if value is not None:
                updates = int(value)
                rate = self._updates_rate.update(now, value)
            weight = self.scraper.value(self.learner_url, "apexrl_learner_weight_version")
            version = None if weight is None else int(weight)
        return ProgressRow(
            wall_seconds=now - self.start_time,
            env_steps=self._base_steps + int(env_steps),
            # Without actor metrics (remote actors without fixed ports) fall back to the CSVs read here (appended
            # to by a resumed run, so they count its whole history already).
            episodes=self._base_episodes + int(episodes) if self.actor_urls else self.explore_episodes_read,
            updates=updates,
            updates_per_second=rate,
            mean_return_100=self.eval_mean(),
            mean_explore_return_100=_mean(self.explore_returns),
            weight_version=version,
            unix_time=now,
            env_steps_per_second=self._env_steps_rate.update(now, env_steps) if self.actor_urls else None,
            eval_episodes=self.eval_episodes,
        )

    def close(self) -> None:
        self.scraper.close()


def format_row(row: ProgressRow, eval_episodes: int | None = None) -> str:
    """One human line: elapsed, env steps, episodes, returns, learner updates and weights. Both rates (env steps/s,
    updates/s) are over the last progress interval, so they show what the fleet does now."""

    eval_episodes = row.eval_episodes if eval_episodes is None else eval_episodes

    def num(value: float | None, spec: str = ",.0f") -> str:
        return "-" if value is None else format(value, spec)

    return (
        f"[{row.wall_seconds:6.0f}s] env steps {row.env_steps:,} ({num(row.env_steps_per_second)}/s) | "
        f"episodes {row.episodes:,} | eval return {num(row.mean_return_100, '.1f')} "
        f"(last {min(eval_episodes, SOLVE_WINDOW)} of {eval_episodes}) | "
        f"explore return {num(row.mean_explore_return_100, '.1f')} | "
        f"updates {num(row.updates)} ({num(row.updates_per_second, ',.1f')}/s) | "
        f"weights v{num(row.weight_version, 'd')}" + (f" | restarts {row.restarts}" if row.restarts else "")
    )


class ProgressCsv:
    """progress.csv, one row per tick, flushed as it goes so a killed launcher still leaves its history; with
    `tensorboard_dir`, the mean returns also go to TensorBoard event files there, on disk at every tick
    (`return/evaluation_mean_100` and `return/exploration_mean_100` against the fleet's environment steps,
    common/tensorboard_curves.py). A resumed run appends to the file it finds."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None) -> None:
        path = Path(path)
        new = not path.exists() or path.stat().st_size == 0
        self._file = open(path, "a", newline="")  # noqa: SIM115 (open for the run's lifetime)
        self._writer = csv.DictWriter(self._file, fieldnames=ProgressRow.columns())
        if new:
            self._writer.writeheader()
        elif not _ends_a_line(path):
            self._file.write("\n")  # a row cut short by a killed launcher stays a (skipped) line of its own
        self._curves = (
            TensorBoardCurves(
                tensorboard_dir,
                "return/",
                flush_seconds=0,
                load_at_start=False,
                logger=logging.getLogger("apexrl.launch"),
            )
            if tensorboard_dir is not None
            else None
        )

    def write(self, row: ProgressRow) -> None:
        self._writer.writerow({k: ("" if v is None else _round(v)) for k, v in asdict(row).items()})
        self._file.flush()
        if self._curves is not None:
            self._curves.add(
                row.env_steps,
                wall_time=row.unix_time,
                evaluation_mean_100=row.mean_return_100,
                exploration_mean_100=row.mean_explore_return_100,
            )

    def close(self) -> None:
        self._file.close()
        if self._curves is not None:
            self._curves.close()


class _Rate:
    """A counter's rate since the last tick at least `min_seconds` earlier (None until there is one). A tick sooner
    than that (the row written when the run stops, often a fraction of a second after the last) repeats the rate
    before it rather than measure one over a sliver of time; the next tick measures from the same earlier tick."""

    def __init__(self, min_seconds: float = MIN_RATE_SECONDS) -> None:
        self.min_seconds = min_seconds
        self._last: tuple[float, float] | None = None  # (unix time, value) the rate is measured from
        self._rate: float | None = None

    def update(self, now: float, value: float) -> float | None:
        if self._last is None:
            self._last = (now, value)
        elif now - self._last[0] >= self.min_seconds:
            self._rate = (value - self._last[1]) / (now - self._last[0])
            self._last = (now, value)
        return self._rate


def _ends_a_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _mean(values: Sequence[float] | deque[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | int) -> float | int:
    return round(value, 3) if isinstance(value, float) else value

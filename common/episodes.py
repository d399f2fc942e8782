"""The per-episode CSV: written by actors (one file each), tailed by the launcher while the fleet runs, merged
into the run directory's episodes.csv and read back for the learning curve. This module is its only owner: the
columns, the writer and the readers live here, with the window of episodes "solved" is defined on.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from apexrl.common.files import atomic_write

COLUMNS = ("wall_time", "actor", "role", "env_steps", "return", "length", "weight_version")
EXPLORE = "explore"
EVALUATE = "evaluate"
# Episodes a mean return is taken over: the last 100, the window Gymnasium's "solved" is defined on. The evaluator
# judges a run solved on it, the launcher's progress and plot average over it, a default evaluation round is it.
SOLVE_WINDOW = 100


@dataclass(frozen=True)
class EpisodeRecord:
    wall_time: float  # unix seconds at the episode's end
    actor: int  # actor index
    role: str  # EXPLORE or EVALUATE
    env_steps: int  # this actor's cumulative environment steps at the episode's end
    episode_return: float
    length: int
    weight_version: int  # the weights the episode ended with

    def to_row(self) -> list[str]:
        return [
            f"{self.wall_time:.3f}",
            str(self.actor),
            self.role,
            str(self.env_steps),
            repr(self.episode_return),
            str(self.length),
            str(self.weight_version),
        ]

    @classmethod
    def from_row(cls, row: list[str]) -> EpisodeRecord | None:
        """The record of one CSV line in COLUMNS order; None for a malformed line."""
        if len(row) != len(COLUMNS):
            return None
        try:
            return cls(
                float(row[0]), int(row[1]), row[2], int(row[3]), float(row[4]), int(row[5]), int(row[6])
            )
        except ValueError:
            return None


class EpisodeLog:
    """Appends one line per episode and flushes it, so readers see whole lines while the actor runs."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 (open for the actor's lifetime)
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(COLUMNS)
            self._file.flush()

    def write(self, record: EpisodeRecord) -> None:
        self._writer.writerow(record.to_row())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EpisodeTail:
    """Reads the records appended to an episode CSV since the last call; a half-written last line waits for the
    next call, a malformed line is skipped."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._offset = 0

    def read_new(self) -> list[EpisodeRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offset += end + 1
        records = []
        for line in csv.reader(io.StringIO(chunk[: end + 1].decode("utf-8", "replace"))):
            if not line or tuple(line) == COLUMNS:
                continue
            record = EpisodeRecord.from_row(line)
            if record is not None:
                records.append(record)
        return records


def read_episodes(path: str | os.PathLike) -> list[EpisodeRecord]:
    """Every complete record of an episode CSV."""
    return EpisodeTail(path).read_new()


def merge_episode_files(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> int:
    """Every complete record of `paths`, sorted by wall time, into one CSV (written atomically); return the count."""
    records = sorted((r for path in paths for r in read_episodes(path)), key=lambda r: r.wall_time)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    writer.writerows(r.to_row() for r in records)
    atomic_write(out, text.getvalue())
    return len(records)

"""Per-episode CSV written by actors and read by the launcher (progress, learning curve, run directory)."""

from __future__ import annotations

import csv
import os
from dataclasses import astuple, dataclass
from pathlib import Path


@dataclass(frozen=True)
class EpisodeRecord:
    wall_time: float      # unix seconds at the episode's end
    actor: int            # actor index
    role: str             # "explore" or "evaluate"
    env_steps: int        # this actor's cumulative environment steps at the episode's end
    episode_return: float
    length: int
    weight_version: int   # the weights the episode ended with


COLUMNS = ("wall_time", "actor", "role", "env_steps", "return", "length", "weight_version")


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
        row = list(astuple(record))
        row[0] = f"{record.wall_time:.3f}"
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_episodes(path: str | os.PathLike) -> list[EpisodeRecord]:
    """Every complete line of an episode CSV (a partly written last line is skipped)."""
    records = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                records.append(EpisodeRecord(
                    wall_time=float(row["wall_time"]), actor=int(row["actor"]), role=row["role"],
                    env_steps=int(row["env_steps"]), episode_return=float(row["return"]),
                    length=int(row["length"]), weight_version=int(row["weight_version"]),
                ))
            except (KeyError, TypeError, ValueError):
                continue
    return records


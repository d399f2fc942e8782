"""The evaluator's kept policy: the weights the evaluator itself scored, saved where `apexrl evaluate`, `load_policy`
and `apexrl export` read them by default (RUN_DIR/checkpoints/best.npz).

Why the evaluator keeps them and not the learner: the learner's last checkpoint is written after the solving round
and the stop, dozens of updates later, and DQN's greedy policy can swing far in a few updates (a CartPole run that
solved with weights v219 kept v233, which played 164). The evaluator holds exactly the weights each round played.

Which round is kept: once a round ends with the last 100 evaluation episodes averaging at least the target, and a
second round of the same weights from fresh start states keeps them there (the confirmation: a first crossing is
partly luck, and the kept policy must meet the target when its user evaluates it again), those weights (the run
solved with them), and nothing after; until then, the round with the best mean return of its own episodes. Beside the weights a JSON record (best.json) says which: the launcher reads it to decide that the
run solved, so the verdict and the kept weights are one and the same round. A record left by an earlier launch of
the run (a resume) sets the bar a new round must beat; only a round of this launch can solve it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apexrl.common.episodes import SOLVE_WINDOW
from apexrl.common.files import atomic_write

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptRecord:
    """What the kept weights scored (best.json; also inside the policy file as `kept`)."""

    weight_version: int
    round: int  # the evaluator's round number in its launch (1 = first round)
    mean_return: float  # mean return of that round's own episodes
    episodes: int  # that round's episodes
    mean_return_100: (
        float | None
    )  # mean of the last 100 evaluation episodes at that round's end (None: < 100)
    solved: bool  # mean_return_100 reached target_return
    target_return: float | None
    written_at: float  # Unix time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> KeptRecord | None:
        """The record at `path`, or None when there is none (or it cannot be read: a record is advisory)."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def record_path(policy_path: Path) -> Path:
    """Where the record of the policy file `policy_path` lives: beside it, same name, .json."""
    return policy_path.with_suffix(".json")


class KeptPolicy:
    """Decides, round by round, whether the evaluator's weights are kept, and writes them (`save(weights, record)`
    writes the policy file) then the record, each atomically: the record never names weights not yet on disk.

    With `confirm`, a round that reaches the target makes its weights a candidate (`confirming`: the evaluator
    plays the next round with the same weights, from fresh start states), and the run is solved only when that
    round keeps the last 100 evaluation episodes at the target too; a candidate that fails goes back to competing
    on its score. Without it, the first round that reaches the target solves."""

    def __init__(
        self,
        path: Path,
        target_return: float | None,
        save: Callable[[Mapping[str, np.ndarray], KeptRecord], None],
        *,
        confirm: bool = True,
    ) -> None:
        self.path = Path(path)
        self.record_path = record_path(self.path)
        self.target_return = target_return
        self.confirm = confirm
        self._save = save
        self.solved = False  # a round of this launch solved: the kept weights no longer change
        self.confirming: int | None = None  # the weights version whose confirmation round comes next
        earlier = KeptRecord.read(self.record_path)
        self._bar = earlier.mean_return if earlier is not None else None  # the score a round must beat
        if earlier is not None:
            log.info(
                "kept policy so far: weights v%d, mean return %.1f (%s); a round must beat it to replace it",
                earlier.weight_version,
                earlier.mean_return,
                self.path,
            )

    def offer(
        self,
        round_number: int,
        weight_version: int,
        weights: Mapping[str, np.ndarray],
        returns: Sequence[float],
        recent: Sequence[float],
    ) -> KeptRecord | None:
        """A finished round: its number, the weights it played and their version, its episodes' returns, and the
        evaluator's recent returns (this round's last). Returns the record written when the weights were kept."""
        if self.solved or not returns:
            return None
        window = list(recent)[-SOLVE_WINDOW:]
        mean_100 = float(np.mean(window)) if len(window) >= SOLVE_WINDOW else None
        reached = self.target_return is not None and mean_100 is not None and mean_100 >= self.target_return
        confirmed = reached and (not self.confirm or self.confirming == weight_version)
        if reached and not confirmed:
            self.confirming = weight_version
            log.info(
                "evaluation round %d (weights v%d) reached the target (last 100 average %.1f >= %g): playing "
                "one more round with these weights to confirm",
                round_number,
                weight_version,
                mean_100,
                self.target_return,
            )
        else:
            self.confirming = None
        mean = float(np.mean(returns))
        if not confirmed and self._bar is not None and mean <= self._bar:
            return None
        record = KeptRecord(
            weight_version=weight_version,
            round=round_number,
            mean_return=mean,
            episodes=len(returns),
            mean_return_100=mean_100,
            solved=confirmed,
            target_return=self.target_return,
            written_at=time.time(),
        )
        self._save(weights, record)
        atomic_write(self.record_path, json.dumps(record.as_dict(), indent=1) + "\n")
        self._bar, self.solved = mean, confirmed
        log.info(
            "kept weights v%d (round %d, mean return %.1f%s) in %s",
            weight_version,
            round_number,
            mean,
            f", solved: last 100 average {mean_100:.1f} >= {self.target_return:g}" if confirmed else "",
            self.path,
        )
        return record

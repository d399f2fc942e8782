"""When the evaluator plays its next round: rounds start at most every `round_seconds`, and over time take at most
`cpu_share` of one core, beyond a burst of `burst_seconds` of play (a token bucket: credit accrues at `cpu_share`
per second of wall time up to `burst_seconds`, a round spends its length).

Why a burst: a run's first rounds play barely trained policies, whose episodes are the longest (Acrobot: 500 steps
until it learns to swing up; one such round of 100 episodes took 15.8 s on 2 cores), and a rest proportional to
such a round (3x at a quarter of a core) hid the run's progress for ~35 s while the exploring actors were already
past the target. With the burst, rests stay within `round_seconds` until the evaluator has played `burst_seconds`;
a slow evaluator (Atari, hours of training) still averages its share.
"""

from __future__ import annotations

import logging

log = logging.getLogger("apexrl.actor")


class EvaluationPacer:
    """The rest after each round (`rest(started, ended)`, monotonic seconds of the round's start and end)."""

    def __init__(self, round_seconds: float, cpu_share: float, burst_seconds: float) -> None:
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share ({cpu_share}) must be in (0, 1]")
        self.round_seconds = round_seconds
        self.cpu_share = cpu_share
        self.burst_seconds = burst_seconds
        self.credit = burst_seconds  # seconds of play the evaluator may take now beyond its share
        self._last_end: float | None = None

    def rest(self, started: float, ended: float) -> float:
        """Seconds to wait after a round played from `started` to `ended`: until the next round is due, and, when
        the round spent more than the credit, until the credit is back to zero."""
        if self.round_seconds == 0:
            return 0.0
        took = ended - started
        if self._last_end is not None:  # credit accrued while resting (and waiting) since the last round
            idle = max(0.0, started - self._last_end)
            self.credit = min(self.burst_seconds, self.credit + self.cpu_share * idle)
        self.credit = min(self.burst_seconds, self.credit) - (1.0 - self.cpu_share) * took
        owed = -self.credit / self.cpu_share if self.credit < 0 else 0.0
        rest = max(self.round_seconds - took, owed, 0.0)
        self._last_end = ended
        return rest


def log_round(number: int, weight_version: int, returns: list[float], seconds: float) -> None:
    """The evaluator's one line per round: what the greedy policy of these weights scores now."""
    mean = sum(returns) / len(returns)
    log.info(
        "evaluation round %d (weights v%d): %d greedy episode%s, mean return %.1f (min %.1f, max %.1f) in %.1fs",
        number,
        weight_version,
        len(returns),
        "" if len(returns) == 1 else "s",
        mean,
        min(returns),
        max(returns),
        seconds,
    )

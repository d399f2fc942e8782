"""The learner's training curves as TensorBoard event files: RUN_DIR/tensorboard/learner, with `learner/loss`,
`learner/mean_q` (every 20 updates) and `learner/updates_per_second` (every progress interval) against updates.
The launcher writes the returns against environment steps beside them (RUN_DIR/tensorboard/episodes)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("apexrl.learner")

# Seconds between flushes to disk: curves of a running fleet stay current in TensorBoard.
FLUSH_SECONDS = 5


class TrainingCurves:
    """torch's SummaryWriter, imported when built (at the learner's start, not in the middle of training) and
    opened at the first point (a learner that never trains leaves no event file). Without the tensorboard
    package: a warning and no curves, never a failed learner."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self._writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            log.warning("no TensorBoard curves in %s: %s (pip install tensorboard)", self.logdir, err)
            SummaryWriter = None  # noqa: N806
        self._writer_class = SummaryWriter

    def add(self, updates: int, **scalars: float) -> None:
        """One point per scalar at x = `updates`; tags are learner/NAME."""
        if self._writer is None:
            if self._writer_class is None:
                return
            self._writer = self._writer_class(str(self.logdir), flush_secs=FLUSH_SECONDS)
        for name, value in scalars.items():
            self._writer.add_scalar(f"learner/{name}", value, updates)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

"""The fleet's returns as TensorBoard event files: RUN_DIR/tensorboard/episodes, written at every progress tick next
to progress.csv. Tags `return/evaluation_mean_100` and `return/exploration_mean_100` (mean return of the last 100
episodes) against the fleet's environment steps; the learner writes RUN_DIR/tensorboard/learner, so

    tensorboard --logdir RUN_DIR/tensorboard

shows both. Written with the tensorboard package's own event writer: no torch, no TensorFlow (the launcher loads no
model), and the tensorboard import is deferred to the first write.
"""

from __future__ import annotations

import logging
from pathlib import Path

from apexrl.launcher.progress import ProgressRow

log = logging.getLogger("apexrl.launch")

TAGS = {
    "mean_return_100": "return/evaluation_mean_100",
    "mean_explore_return_100": "return/exploration_mean_100",
}


class ReturnCurves:
    """Appends one scalar per known return and tick; a machine without the tensorboard package gets a warning and
    no event files, never a failed run."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self._writer = None
        self._disabled = False

    def write(self, row: ProgressRow) -> None:
        values = {tag: getattr(row, field) for field, tag in TAGS.items() if getattr(row, field) is not None}
        if not values or not self._open():
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
        self._writer.add_event(Event(wall_time=row.unix_time, step=int(row.env_steps), summary=summary))
        self._writer.flush()

    def _open(self) -> bool:
        if self._writer is None and not self._disabled:
            try:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError as err:
                log.warning("no TensorBoard curves in %s: %s (pip install tensorboard)", self.logdir, err)
                self._disabled = True
                return False
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.logdir))
        return self._writer is not None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

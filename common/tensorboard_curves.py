"""Scalar curves as TensorBoard event files, for every role that draws them: the learner's loss, mean Q and
updates/s against updates (RUN_DIR/tensorboard/learner, tags `learner/...`: learner/main.py) and the launcher's
mean returns of the last 100 episodes against the fleet's environment steps (RUN_DIR/tensorboard/episodes, tags
`return/...`: launcher/progress.py, at every progress tick), so

    tensorboard --logdir RUN_DIR/tensorboard

shows both. Written with the tensorboard package's own event writer: no torch and no TensorFlow (the launcher loads
no model), and importing this module imports neither tensorboard nor anything else beyond the standard library.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

# Seconds between flushes to disk when points are not flushed one by one: curves of a running fleet stay current.
FLUSH_SECONDS = 5.0


class TensorBoardCurves:
    """Appends points to one event file in `logdir`, opened at the first point (nothing written, no file); a
    point's tag is `prefix` + the scalar's name.

    `flush_seconds` 0 puts every point on disk at once (the launcher's, one point per progress tick); otherwise
    points reach disk within that many seconds (the learner's, a point every 20 updates). The tensorboard package
    is imported when the curves are built (`load_at_start`: a learner does not pause mid-training for it) or at the
    first point (the launcher's start waits for nothing it does not need yet). Without the package: one warning
    on `logger` and no curves, never a failed run."""

    def __init__(
        self,
        logdir: str | Path,
        prefix: str = "",
        *,
        flush_seconds: float = FLUSH_SECONDS,
        load_at_start: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        self.logdir = Path(logdir)
        self.prefix = prefix
        self.flush_seconds = flush_seconds
        self._log = logger if logger is not None else logging.getLogger(__name__)
        self._loaded: tuple | None = None  # (EventFileWriter, Event, Summary) once imported
        self._tried = False
        self._writer = None
        if load_at_start:
            self._load()

    def add(self, step: int, *, wall_time: float | None = None, **scalars: float | None) -> None:
        """One point per scalar at x = `step` (at `wall_time`, default now); scalars given as None are left out,
        and a call with none known writes nothing."""
        values = {self.prefix + name: float(v) for name, v in scalars.items() if v is not None}
        if not values or not self._load():
            return
        writer_class, event, summary = self._loaded
        if self._writer is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = writer_class(str(self.logdir), flush_secs=self.flush_seconds or FLUSH_SECONDS)
        points = summary(value=[summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        when = time.time() if wall_time is None else wall_time
        self._writer.add_event(event(wall_time=when, step=int(step), summary=points))
        if not self.flush_seconds:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _load(self) -> bool:
        """Import tensorboard's event writer once; False (after one warning) without the package."""
        if not self._tried:
            self._tried = True
            try:
                from tensorboard.compat.proto.event_pb2 import Event
                from tensorboard.compat.proto.summary_pb2 import Summary
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError as err:
                self._log.warning(
                    "no TensorBoard curves in %s: %s (pip install tensorboard)", self.logdir, err
                )
            else:
                self._loaded = (EventFileWriter, Event, Summary)
        return self._loaded is not None

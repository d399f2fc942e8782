"""SequenceWriter: one trajectory's steps written as sequence items (R2D2's overlapping windows) to a sequence table.

R2D2 trains on windows of `length` consecutive steps (burn-in plus training length), a new one starting every
`period` steps, never across an episode's end. The writer sends each step once, `windows_per_request * period` steps
per request at most, and each window in the request that holds its last step; the shard stores the step once and the
window as a reference to it (replay.proto, "Sequence tables"). At an episode's end the oldest window not yet complete
goes out cut short (the shard pads it, and says its length); the windows after it would be parts of it and are not
sent.

Why several windows per request: a shard's cost is mostly per request (gRPC, its insert lane, decoding, the table's
checks: ~300 us of CPU whether it carries 1 window or 8), and so is the SDK's; `windows_per_request = k` sends one
request per k windows (k * period steps), at the price of a completed window waiting up to (k - 1) * period steps
before it is sent (and sampleable). An episode's end or `flush` sends what is held at once.

It writes through a ShardedWriter, so it has its acknowledgement, resends and back pressure, and stays on one shard
while that shard's backlog has room (its items refer to the steps it sent there). When it moves to another shard
(failover), it first sends again the episode's steps that its open windows still need there. A shard that restarts
loses the steps it held (sequence tables are not persisted yet): a window sent after that which reaches back
before the restart is refused (INVALID_ARGUMENT, raised by a later `append` or `flush`).

Not thread-safe: one thread appends (an actor's loop for one environment).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from apexrl.common.compression import CompressedColumn, concatenate
from apexrl.common.errors import DeadlineExceededError
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.client.sharded_writer import ShardedWriter
from apexrl.replay_server.core.item_batch import ItemBatch

# An item's priority from its steps (each field [steps, ...], the extras given to `append` among them); None gives
# the shard's max priority.
PriorityFn = Callable[[Mapping[str, np.ndarray]], float]
# A complete window: (its first step of the episode, its length, its item fields).
Window = tuple[int, int, Mapping[str, np.ndarray]]
_NONE: dict[str, np.ndarray] = {}  # a step's extras when it has none (shared: never written to)
# Step values kept as given, without a call per value (an actor's steps are these; `_stack` joins them the same).
_KEPT_AS_GIVEN = frozenset((np.ndarray, np.float32, np.float64, np.int64, np.int32, np.bool_, np.uint8))
# With a stop event, how long one turn of a wait for room lasts before the stop is checked again.
_STOP_POLL_SECONDS = 1.0


class SequenceWriter:
    """Writes one trajectory (an actor's environment) as windows of `length` steps every `period` steps.

    Args:
        writer: the ShardedWriter to write through (shared by the trajectories of one actor).
        length: steps per window (the table's max_sequence_length at most).
        period: steps between window starts (1 .. length); length // 2 stores each step once for two windows.
        windows_per_request: complete windows held back to go out together in one request (1: each window as it
            completes; see the module docstring).
        trajectory: this trajectory's number among the writer's (replay.proto, InsertRequest.trajectory).
        priority: the item's priority from its steps (e.g. R2D2's eta-mix of TD errors); None: the shard's max.
        timeout: how long an append may wait for room on the shard (back pressure) or for a shard to be known;
            None: the writer's, or as long as it takes when `stop` is given.
        stop: ends such a wait (an actor's stop): the append returns with its windows unsent. It may be set later
            as the `stop` attribute.
    """

    def __init__(
        self,
        writer: ShardedWriter,
        *,
        length: int,
        period: int,
        windows_per_request: int = 1,
        trajectory: int = 0,
        priority: PriorityFn | None = None,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        if not 1 <= period <= length:
            raise ValueError(f"period ({period}) must be in [1, length ({length})]")
        if (
            isinstance(windows_per_request, bool)
            or not isinstance(windows_per_request, int)
            or windows_per_request < 1
        ):
            raise ValueError(f"windows_per_request ({windows_per_request!r}) must be an integer >= 1")
        self.length, self.period, self.trajectory = length, period, trajectory
        self.windows_per_request = windows_per_request
        self._writer = writer
        self._priority = priority
        self._timeout = timeout if timeout is not None or stop is not None else writer.timeout
        self.stop = stop
        self._client: ReplayClient | None = None  # the shard this trajectory writes to now
        self._steps: deque[dict[str, np.ndarray]] = deque()  # episode steps from _first on
        self._extras: deque[dict[str, np.ndarray]] = deque()  # what `priority` reads beside them (never sent)
        self._first = 0  # episode index of _steps[0]
        self._count = 0  # steps of the episode appended
        self._sent = 0  # steps of the episode the current shard was sent
        self._open: deque[tuple[int, Mapping[str, np.ndarray]]] = (
            deque()
        )  # windows not complete: (start, fields)
        self._ready: list[Window] = []  # complete windows held back until windows_per_request of them
        self.items_sent = 0

    def append(
        self,
        step: Mapping[str, np.ndarray],
        fields: Mapping[str, np.ndarray] | None = None,
        extras: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Add the episode's next step (each field one step's value); `fields` are the item fields of a window
        that starts here (e.g. the recurrent state before this step), kept only where a window starts; `extras`
        are values of this step the `priority` function reads and the shard never sees (the Q-values acted on).

        The newest step is held back until the next one (or the episode's end), so that a window cut short at the
        episode's end still travels with its last step."""
        t = self._count
        self._count += 1
        self._steps.append(
            {
                name: value if type(value) in _KEPT_AS_GIVEN else _one_step(value)
                for name, value in step.items()
            }
        )
        self._extras.append({name: np.asarray(value) for name, value in extras.items()} if extras else _NONE)
        if t % self.period == 0:
            self._open.append((t, {name: np.asarray(value) for name, value in (fields or {}).items()}))
        ready = self._ready
        while self._open and self._open[0][0] + self.length <= t:  # its last step, t - 1, can go now
            start, window_fields = self._open.popleft()
            ready.append((start, self.length, window_fields))
        k = self.windows_per_request
        if len(ready) >= k or t - self._sent >= k * self.period:
            self._send(t, self._take_ready())

    def end_episode(self) -> None:
        """The episode ended with the last appended step: its windows go out, the oldest unfinished one cut short
        (those after it would be parts of it), and the next episode starts afresh."""
        if self._count:
            windows = self._take_ready() + [
                (start, min(self.length, self._count - start), window_fields)
                for start, window_fields in list(self._open)[:1]
            ]
            self._open.clear()
            self._send(self._count, windows)
        self._steps.clear()
        self._extras.clear()
        self._open.clear()
        self._first = self._count = self._sent = 0

    def flush(self, timeout: float | None = None) -> None:
        """Send the complete windows held back (windows_per_request), then wait until everything sent is
        acknowledged (ShardedWriter.flush)."""
        if self._ready:
            self._send(self._count - 1, self._take_ready())  # the newest step stays held back
        self._writer.flush(timeout)

    @property
    def items_held(self) -> int:
        """Complete windows not sent yet (fewer than windows_per_request)."""
        return len(self._ready)

    def _take_ready(self) -> list[Window]:
        ready, self._ready = self._ready, []
        return ready

    # ------------------------------------------------------------------------------------------------- sending
    def _send(self, upto: int, windows: list[Window]) -> None:
        """Send the steps before `upto` not yet on the shard, with the `windows` (start, length, fields) that end
        in them."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            client = self._writer.pick(
                None if self._client is None else self._client.address, timeout=left, stop=self.stop
            )
            if client is None:  # stopped while no shard was known
                return
            needed = min(
                [start for start, _, _ in windows] + [start for start, _ in self._open] + [self._sent]
            )
            first = (
                self._sent if client is self._client else needed
            )  # a new shard gets the steps it will need
            rows = [self._steps[i - self._first] for i in range(first, upto)]
            columns = {name: _stack([row[name] for row in rows]) for name in rows[0]}
            items = self._items(windows, first) if windows else None
            if self.stop is None:
                client.insert(columns, items=items, trajectory=self.trajectory, timeout=left)
                break
            # With a stop to honour, wait in short turns: each turn may fail over to a shard that has room now.
            wait = _STOP_POLL_SECONDS if left is None else min(_STOP_POLL_SECONDS, left)
            try:
                client.insert(columns, items=items, trajectory=self.trajectory, timeout=wait)
                break
            except DeadlineExceededError:
                if self.stop.is_set():
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise
        self._client, self._sent = client, upto
        self.items_sent += len(windows)
        keep = min([start for start, _ in self._open] + [upto])
        while self._first < keep:  # steps no open window needs (nor the held-back newest one)
            self._steps.popleft()
            self._extras.popleft()
            self._first += 1

    def _items(self, windows: list[Window], first: int) -> ItemBatch:
        names = windows[0][2].keys()
        priorities = None
        if self._priority is not None:
            priorities = np.array(
                [self._priority(self._window(start, length)) for start, length, _ in windows]
            )
        return ItemBatch(
            ends=np.array([start + length - first for start, length, _ in windows], dtype=np.int64),
            lengths=np.array([length for _, length, _ in windows], dtype=np.int64),
            columns={name: _stack([fields[name] for _, _, fields in windows]) for name in names},
            priorities=priorities,
        )

    def _window(self, start: int, length: int) -> dict[str, np.ndarray]:
        """A window's steps and extras, each [length, ...] (what `priority` reads)."""
        indices = range(start - self._first, start - self._first + length)
        rows = [{**self._steps[i], **self._extras[i]} for i in indices]
        return {name: _stack([row[name] for row in rows]) for name in rows[0]}


def _one_step(value) -> np.ndarray | CompressedColumn:
    """A step's value as kept: an array, or a compressed column of one frame (a pixel observation)."""
    if isinstance(value, CompressedColumn):
        if len(value) != 1:
            raise ValueError(f"a compressed step value holds one frame, not {len(value)}")
        return value
    return np.asarray(value)


def _stack(values: list) -> np.ndarray | CompressedColumn:
    """Steps' values as one column ([steps, ...]; frames joined)."""
    if isinstance(values[0], CompressedColumn):
        return concatenate(values)
    # np.array, not np.stack: the same array for values of one shape (a ValueError otherwise), at a tenth of the
    # cost per request (bench/sequence_throughput.py: np.stack was a fifth of the writer's time per item).
    return np.array(values)

"""Sampling, decoding and batch assembly in a child process, handing batches to the learner through shared memory.

Why: in one process the sampler's work (gRPC calls, protobuf decoding, cutting answers into batches,
concatenating) competes with the train step for the GIL and took almost half of the learner's time
(bench/learner_bench.py). Here a child process runs the same `Prefetcher` over its own `ShardedReplayClient`
(several batches per Sample call, each stratified on its own) and copies each batch into one of a few fixed slots
of a shared-memory file; the learner reads the slot in place (no copy, no pickling of arrays) and sends back only
the batch's new priorities, which the child streams to the shards (priority write-back stays asynchronous).
Compressed columns (image frames) are decompressed here too, straight into the slot, so the learner's process
never pays for it; the slots' layout and their shared file are in `sampler_slots.py`. Sequence batches (R2D2) take
the same path: a slot row is an item (its steps [T, ...], length and own fields), and the learner reads the slot as
the thread feed's `for_learning` view; its priorities go back per item.

Protocol over one duplex pipe (small messages; arrays never cross it except the priorities):
  child -> parent: ("layout", columns, rows) once, after the first batch: (name, dtype, per-row shape) per column
                   (a row: a transition, or an item of a sequence batch);
                   ("batch", slot, batch_id, stats) for each filled slot; ("flushed", ok); ("error", text).
  parent -> child: ("slots", path) once (the shared file, sized for `slots` batches); ("release", slot) when the
                   learner is done with a slot; ("priorities", batch_id, priorities, beta); ("flush", timeout);
                   ("pause",) stops sampling; ("stop",) ends the child.
A batch returned by `get` stays valid until the next `get` (its slot is released then), so the train step and
whatever the loop does after it may read it. The child ignores SIGINT/SIGTERM (the parent stops it) and exits
when the pipe closes (the parent died).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from apexrl.learner.sampler_slots import (
    WEIGHTS,
    SlotLayout,
    columns_of,
    create_slots_file,
    map_slots_file,
    step_targets,
)

log = logging.getLogger("apexrl.learner.sampler")


@dataclass(frozen=True)
class SamplerStats:
    """The child's view of the shards and of its priority streams, sent with every batch."""

    fleet_size: int = 0
    updates_stale: int = 0
    updates_dropped: int = 0
    updates_outstanding: int = 0
    rows_rejected: int = 0  # sampled rows whose frames did not decompress (prefetch.BatchDecompressor)


@dataclass(frozen=True)
class FedBatch:
    """A batch in a shared-memory slot: columns and importance weights are views, valid until the next `get`."""

    columns: dict[str, np.ndarray]
    weights: np.ndarray
    fleet_size: int
    batch_id: int
    slot: int


class SamplerProcess:
    """The learner's batch feed from a child process (see the module docstring). Duck-types the surface the learner
    uses of a `ShardedReplayClient` plus a `Prefetcher`: get, update_priorities, flush_updates, depth, the update
    counters, stop, close."""

    def __init__(self, config, *, slots: int, batches_per_call: int = 1, start_timeout: float = 60.0) -> None:
        if slots < 2:
            raise ValueError(f"slots ({slots}) must be at least 2: one held by the learner, one being filled")
        self._config = config
        self._slots = max(slots, batches_per_call + 1)
        self.slots_path: str | None = (
            None  # the shared file of the batch slots, once made (unlinked once mapped)
        )
        self._batches_per_call = batches_per_call
        self._start_timeout = start_timeout
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn = None
        self._buffer: mmap.mmap | None = None
        self._layout: SlotLayout | None = None
        self._ready: deque[FedBatch] = deque()
        self._held: FedBatch | None = None
        self._stats = SamplerStats()
        self._flushed: list[bool] = []
        self._beta: Callable[[], float] = lambda: 0.4

    # --- life cycle -------------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The sampling process's pid while it runs (benchmarks read its CPU time), else None."""
        return None if self._process is None else self._process.pid

    def start(self, beta: Callable[[], float]) -> SamplerProcess:
        self._beta = beta
        context = multiprocessing.get_context("spawn")  # never fork a process that runs gRPC threads
        parent, child = context.Pipe(duplex=True)
        self._process = context.Process(
            target=_child_main,
            name="apexrl-sampler",
            daemon=True,
            args=(self._config, child, self._slots, self._batches_per_call, beta()),
        )
        self._process.start()
        child.close()
        self._conn = parent
        log.info("sampler process started (pid %d, %d batch slots)", self._process.pid, self._slots)
        return self

    def stop(self, wait: bool = False) -> None:
        """Stop sampling (priority updates still go out); `close` ends the process."""
        self._send(("pause",))

    def close(self) -> None:
        """End the child (it flushes what it can within a second) and unmap the shared file."""
        if self._process is not None:
            with contextlib.suppress(RuntimeError):  # already dead: nothing to tell it
                self._send(("stop",))
            self._process.join(timeout=5)
            if self._process.is_alive():
                log.warning("sampler process did not stop within 5 s; killing it")
                self._process.kill()
                self._process.join(timeout=5)
            self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._ready.clear()
        self._held = None
        if self._buffer is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: the mapping goes at exit
                self._buffer.close()
            self._buffer = None

    # --- the learner's side -----------------------------------------------------------------------------------
    def get(self, timeout: float) -> FedBatch | None:
        """The next batch, or None when none arrived within `timeout` seconds. The previous batch's slot is released
        once the next one is taken, so the learner always holds one slot and at most slots - 1 (prefetch_depth)
        batches wait ahead of the train step."""
        deadline = time.monotonic() + timeout
        self._drain(0.0)
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._drain(min(left, 0.5))
        previous, self._held = self._held, self._ready.popleft()
        if previous is not None:
            self._send(("release", previous.slot))
        return self._held

    def update_priorities(self, batch: FedBatch, priorities: np.ndarray) -> None:
        self._send(("priorities", batch.batch_id, np.asarray(priorities, dtype=np.float64), self._beta()))

    def flush_updates(self, timeout: float | None = None) -> None:
        """Wait until the child's priority updates are acknowledged; TimeoutError if they were not in time."""
        wait = 2.0 if timeout is None else timeout
        self._flushed.clear()
        self._send(("flush", wait))
        deadline = time.monotonic() + wait + 1.0
        while not self._flushed and time.monotonic() < deadline:
            self._drain(0.1)
        if not (self._flushed and self._flushed[0]):
            raise TimeoutError("priority updates still in flight")

    @property
    def depth(self) -> int:
        """Batches filled and waiting for the train step."""
        return len(self._ready)

    @property
    def fleet_size(self) -> int:
        return self._stats.fleet_size

    @property
    def updates_stale(self) -> int:
        return self._stats.updates_stale

    @property
    def updates_dropped(self) -> int:
        return self._stats.updates_dropped

    @property
    def updates_outstanding(self) -> int:
        return self._stats.updates_outstanding

    @property
    def rows_rejected(self) -> int:
        """Sampled rows whose compressed frames did not decompress (named in the child's log, never trained on)."""
        return self._stats.rows_rejected

    # --- messages ---------------------------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        if self._conn is None:
            return
        try:
            self._conn.send(message)
        except (BrokenPipeError, EOFError, OSError):
            self._raise_dead()

    def _drain(self, wait: float) -> None:
        """Handle every message that arrives within `wait` seconds (all that are already there, at least)."""
        if self._conn is None:
            raise RuntimeError("the sampler process is not running (start() was not called or close() was)")
        try:
            ready = self._conn.poll(wait)
            while ready:
                self._handle(self._conn.recv())
                ready = self._conn.poll(0)
        except (EOFError, OSError):
            self._raise_dead()
        if self._process is not None and not self._process.is_alive() and not self._conn.poll(0):
            self._raise_dead()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "batch":
            _, slot, batch_id, self._stats = message
            views = self._layout.views(self._buffer, slot)
            weights = views.pop(WEIGHTS)
            self._ready.append(FedBatch(views, weights, self._stats.fleet_size, batch_id, slot))
        elif kind == "layout":
            _, columns, rows = message
            self._layout = SlotLayout(columns, rows, self._slots)
            self._buffer, path = create_slots_file(self._layout)
            self.slots_path = path
            self._send(("slots", path))  # the child maps the file, then unlinks its name
            log.info("sampler slots: %d x %.1f KiB in %s", self._slots, self._layout.slot_bytes / 1024, path)
        elif kind == "flushed":
            self._flushed.append(message[1])
        elif kind == "error":
            raise RuntimeError(f"the sampler process failed:\n{message[1]}")
        else:
            raise RuntimeError(f"unexpected message from the sampler process: {kind!r}")

    def _raise_dead(self) -> None:
        code = self._process.exitcode if self._process is not None else None
        raise RuntimeError(f"the sampler process ended unexpectedly (exit code {code})")


def replay_sampler(config, shards=None):
    """The sharded replay client the learner's settings describe: over `config.replay`'s addresses, or over the
    given shard objects (in-process tables in a benchmark) with the same allocation and weights."""
    from apexrl.common.tls import tls_of
    from apexrl.learner.sharded_client import ShardedReplayClient

    targets = config.replay if shards is None else shards
    return ShardedReplayClient(
        targets,
        timeout=config.sample_timeout,
        seed=config.seed,
        token=config.token,
        tls=tls_of(config),
        resolve_every=config.replay_resolve_seconds,
        # about k batches of rows per shard (each batch spreads over the shards)
        coalesce_rows=(2 * config.priority_coalesce_batches - 1) * config.batch_size // (2 * len(targets)),
    )


# --- the child ------------------------------------------------------------------------------------------------------
def _child_main(config, conn, slots: int, batches_per_call: int, beta: float) -> None:
    """Sample with a Prefetcher into the shared slots until told to stop or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from apexrl.common.process import LOG_DATE_FORMAT, LOG_FORMAT

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    try:
        _ChildLoop(config, conn, slots, batches_per_call, beta).run()
    except (EOFError, BrokenPipeError):
        return  # the parent is gone
    except BaseException:  # noqa: BLE001 (reported to the parent, which raises it in the train loop)
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None


class _ChildLoop:
    def __init__(self, config, conn, slots: int, batches_per_call: int, beta: float) -> None:
        from apexrl.learner.prefetch import BatchDecompressor, Prefetcher

        self.conn = conn
        self.slots = slots
        self.beta = beta
        self.sampler = replay_sampler(config)
        self.prefetcher = Prefetcher(
            self.sampler,
            config.batch_size,
            lambda: self.beta,
            depth=max(1, batches_per_call),
            min_fleet_size=config.min_replay_size,
            batches_per_call=batches_per_call,
            seed=config.seed,
            decompress=False,
        )
        self.decompressor = BatchDecompressor(self.sampler, config.seed)
        self.free: deque[int] = deque(range(slots))
        self.pending: dict[int, object] = {}  # batch id -> PrioritizedBatch, until its priorities arrive
        self.next_id = 0
        self.layout: SlotLayout | None = None
        self.buffer: mmap.mmap | None = None
        self.sampling = True
        self.first = None

    def run(self) -> None:
        self.prefetcher.start()
        try:
            while True:
                if not self._handle_messages(wait=0.0 if self._can_fill() else 0.05):
                    return
                if self._can_fill():
                    batch = self.prefetcher.get(timeout=0.05)
                    if batch is not None:
                        self._deliver(batch)
        finally:
            self.prefetcher.stop(wait=False)
            with contextlib.suppress(TimeoutError):
                self.sampler.flush_updates(timeout=1.0)
            self.sampler.close()

    def _can_fill(self) -> bool:
        return self.sampling and self.first is None and (self.layout is None or bool(self.free))

    def _handle_messages(self, wait: float) -> bool:
        """Handle what the parent sent; False when told to stop."""
        ready = self.conn.poll(wait)
        while ready:
            message = self.conn.recv()
            kind = message[0]
            if kind == "release":
                self.free.append(message[1])
            elif kind == "priorities":
                _, batch_id, priorities, self.beta = message
                batch = self.pending.pop(batch_id, None)
                if batch is not None:
                    self.sampler.update_priorities(batch, priorities)
            elif kind == "slots":
                self._map(message[1])
            elif kind == "flush":
                try:
                    self.sampler.flush_updates(timeout=message[1])
                    self.conn.send(("flushed", True))
                except TimeoutError:
                    self.conn.send(("flushed", False))
            elif kind == "pause":
                self.sampling = False
                self.prefetcher.stop(wait=False)
            elif kind == "stop":
                return False
            ready = self.conn.poll(0)
        return True

    def _deliver(self, batch) -> None:
        if (
            self.layout is None
        ):  # the first batch fixes the layout; it is written once the parent mapped the file
            columns = columns_of(batch)
            self.layout = SlotLayout(columns, len(batch.weights), self.slots)
            self.first = batch
            self.conn.send(("layout", columns, len(batch.weights)))
            return
        slot = self.free.popleft()
        views = self.layout.views(self.buffer, slot)
        self.layout.check_fits(batch)
        # Decompress (and copy) every column straight into the slot; rows (items) with bad frames are replaced.
        batch = self.decompressor(batch, out=step_targets(views, batch))
        if batch is None:
            self.free.appendleft(slot)
            return
        self.layout.write(views, batch)
        batch_id, self.next_id = self.next_id, self.next_id + 1
        self.pending[batch_id] = batch
        self.conn.send(
            (
                "batch",
                slot,
                batch_id,
                SamplerStats(
                    self.sampler.fleet_size,
                    self.sampler.updates_stale,
                    self.sampler.updates_dropped,
                    self.sampler.updates_outstanding,
                    self.decompressor.rows_rejected,
                ),
            )
        )

    def _map(self, path: str) -> None:
        self.buffer = map_slots_file(path, self.layout)
        first, self.first = self.first, None
        self._deliver(first)

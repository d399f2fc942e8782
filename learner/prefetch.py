"""A background sampler that keeps a few prioritized batches ready, so the train step does not wait on the network
while the shards keep up (ARCHITECTURE §3)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from apexrl.common.errors import ApexError, FailedPreconditionError
from apexrl.learner.sharded_client import PrioritizedBatch, ShardedReplayClient

log = logging.getLogger(__name__)


class Prefetcher:
    """Samples batches with the current beta in a daemon thread into a bounded queue.

    With batches_per_call = k it draws k batches' rows in one Sample call per shard and splits them: a call costs
    about 1 ms of CPU on each side whatever its size, and the learner's share of that competes with the train step
    for the GIL (bench/README.md, learner benchmark)."""

    def __init__(self, sampler: ShardedReplayClient, batch_size: int, beta: Callable[[], float],
                 depth: int = 4, min_fleet_size: int = 1, batches_per_call: int = 1, seed: int | None = None) -> None:
        if batches_per_call < 1:
            raise ValueError(f"batches_per_call ({batches_per_call}) must be >= 1")
        self._sampler = sampler
        self._batch_size = batch_size
        self._batches_per_call = batches_per_call
        self._rng = np.random.default_rng(seed)
        self._beta = beta
        self._min_fleet_size = min_fleet_size
        self._queue: queue.Queue[PrioritizedBatch] = queue.Queue(maxsize=max(depth, batches_per_call))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apexrl-prefetch", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        backoff = 0.1
        last_warning = 0.0
        while not self._stop.is_set():
            try:
                if self._sampler.fleet_size < self._min_fleet_size:
                    self._sampler.refresh(timeout=5.0)
                    if self._sampler.fleet_size < self._min_fleet_size:
                        raise FailedPreconditionError(
                            f"replay holds {self._sampler.fleet_size} rows, waiting for {self._min_fleet_size}")
                drawn = self._sampler.sample(self._batch_size * self._batches_per_call, beta=self._beta())
                batches = [drawn] if self._batches_per_call == 1 else drawn.split(self._batches_per_call, self._rng)
                backoff = 0.1
            except ApexError as err:
                if time.monotonic() - last_warning > 10:
                    log.info("sampling not possible yet: %s", err)
                    last_warning = time.monotonic()
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            except BaseException as err:  # a bug: surface it in the train loop instead of dying silently
                self.error = err
                return
            for batch in batches:
                while not self._stop.is_set():
                    try:
                        self._queue.put(batch, timeout=0.2)
                        break
                    except queue.Full:
                        continue

    @property
    def depth(self) -> int:
        """Batches sampled and waiting for the train step (bounded by the queue's size)."""
        return self._queue.qsize()

    def get(self, timeout: float) -> PrioritizedBatch | None:
        """The next batch, or None when none arrived within `timeout` seconds."""
        if self.error is not None:
            raise RuntimeError("prefetch thread failed") from self.error
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self, wait: bool = True) -> None:
        """Stop sampling; with wait, join the thread (a Sample in flight ends at its deadline or on close)."""
        self._stop.set()
        if wait:
            self._thread.join(timeout=5)

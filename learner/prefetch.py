"""A background sampler that keeps a few prioritized batches ready, so the train step does not wait on the network
while the shards keep up (ARCHITECTURE §3), and the decompression of compressed columns, which belongs to this
data path too (here in the sampling thread, or in the sampler process straight into its shared slots)."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from apexrl.common.compression import CompressedColumn, decompress_into
from apexrl.common.errors import ApexError, FailedPreconditionError
from apexrl.learner.prioritized_batch import step_rows
from apexrl.learner.sharded_client import PrioritizedBatch, ShardedReplayClient

log = logging.getLogger(__name__)
# A writer whose rows keep failing to decompress is named in the log at most this often (with a count).
_BAD_ROW_LOG_SECONDS = 60.0


class BatchDecompressor:
    """Decompresses the compressed columns of sampled batches (the shards never do).

    Bad frames are found here, not at insert: a shard would have to decompress every frame to check it (the cost
    compression saves), while the learner decompresses every sampled row anyway. A row whose frame does not
    decompress to its field's dtype and shape (or a BOOL row holding bytes other than 0 and 1) is rejected: an
    error names its writer (shards return each row's writer id), its shard and key; its priority is set to 0 on
    its shard, so it is not drawn again; and in this batch a good row drawn at random takes its place (its key,
    probability and weight too), so the train step always gets whole batches. A batch with no good row is
    dropped. `rows_rejected` counts the rows rejected."""

    def __init__(self, sampler: ShardedReplayClient, seed: int | None = None) -> None:
        self._sampler = sampler
        self._rng = np.random.default_rng(seed)
        self._logged: dict[str, tuple[float, int]] = {}  # writer -> (last logged, rows rejected since)
        self.rows_rejected = 0

    def __call__(
        self, batch: PrioritizedBatch, out: dict[str, np.ndarray] | None = None
    ) -> PrioritizedBatch | None:
        """`batch` with its compressed columns decompressed: into new arrays, or with `out` (arrays of the
        decompressed shapes and dtypes, one per column, e.g. a shared-memory slot) every column written there.
        None when no row of the batch is good."""
        if out is None and not any(isinstance(c, CompressedColumn) for c in batch.columns.values()):
            return batch
        columns: dict[str, np.ndarray] = {}
        bad: dict[int, str] = {}
        for name, column in batch.columns.items():
            target = out[name] if out is not None else None
            if isinstance(column, CompressedColumn):
                if target is None:
                    target = np.empty(column.logical_shape, dtype=column.dtype)
                for row, reason in decompress_into(column, target).items():
                    bad.setdefault(row, f"column {name!r} ({column.describe()}): {reason}")
            elif target is not None:
                np.copyto(target, column, casting="no")
            columns[name] = column if target is None else target
        if bad:
            return self._reject(batch, columns, bad, in_place=out is not None)
        return dataclasses.replace(batch, columns=columns)

    def _reject(
        self, batch: PrioritizedBatch, columns: dict[str, np.ndarray], bad: dict[int, str], in_place: bool
    ) -> PrioritizedBatch | None:
        rows = np.fromiter(sorted(bad), dtype=np.int64, count=len(bad))
        self.rows_rejected += len(rows)
        self._log(batch, bad)
        if batch.sequence_length:  # a bad step rejects its whole item
            return self._reject_items(batch, columns, np.unique(rows // batch.sequence_length), in_place)
        self._sampler.zero_priorities(batch, rows)
        good = np.setdiff1d(np.arange(len(batch.keys)), rows)
        if good.size == 0:
            return None
        fix = np.arange(len(batch.keys))
        fix[rows] = self._rng.choice(good, size=rows.size)
        for name, array in columns.items():
            if in_place:
                array[rows] = array[fix[rows]]
            else:
                columns[name] = array[fix]
        writers = None if batch.writers is None else batch.writers[fix]
        return PrioritizedBatch(
            columns,
            batch.shard_ids[fix],
            batch.keys[fix],
            batch.probabilities[fix],
            batch.weights[fix],
            batch.incarnations,
            batch.fleet_size,
            writers,
        )

    def _reject_items(
        self, batch: PrioritizedBatch, columns: dict[str, np.ndarray], items: np.ndarray, in_place: bool
    ) -> PrioritizedBatch | None:
        """A sequence batch without the items at `items` (their priorities set to 0), each replaced by a good item
        drawn from the rest, as bad rows are (in place, in `columns`, when they are the caller's arrays)."""
        self._sampler.zero_priorities(batch, items)
        good = np.setdiff1d(np.arange(len(batch.keys)), items)
        if good.size == 0:
            return None
        fix = np.arange(len(batch.keys))
        fix[items] = self._rng.choice(good, size=items.size)
        if not in_place:
            return dataclasses.replace(batch, columns=columns).take(fix)
        steps, sources = (step_rows(i, batch.sequence_length) for i in (items, fix[items]))
        for array in columns.values():
            array[steps] = array[sources]
        return dataclasses.replace(dataclasses.replace(batch, columns={}).take(fix), columns=columns)

    def _log(self, batch: PrioritizedBatch, bad: dict[int, str]) -> None:
        now = time.monotonic()
        for row, reason in bad.items():
            writer = "" if batch.writers is None else batch.writers[row]
            last, count = self._logged.get(writer, (-np.inf, 0))
            if now - last < _BAD_ROW_LOG_SECONDS:
                self._logged[writer] = (last, count + 1)
                continue
            item = row // max(1, batch.sequence_length)  # a sequence's columns hold its steps
            shard = int(batch.shard_ids[item])
            address = (
                self._sampler.shards[shard].address if shard < len(self._sampler.shards) else f"#{shard}"
            )
            log.error(
                "rejected row (key %d of shard %s) written by writer %r: %s; its priority is set to 0 and "
                "it is left out of training%s",
                int(batch.keys[item]),
                address,
                writer,
                reason,
                f" ({count} more rows of this writer rejected since the last report)" if count else "",
            )
            self._logged[writer] = (now, 0)


class Prefetcher:
    """Samples batches with the current beta in a daemon thread into a bounded queue.

    With batches_per_call = k it draws k batches with `sample_batches`: one Sample call per shard carries all of
    them (a call costs about 1 ms of CPU on each side whatever its size, and the learner's share of that competes
    with the train step for the GIL: bench/README.md, learner benchmark), while each batch keeps its own
    allocation over the shards and its own strata on each shard."""

    def __init__(
        self,
        sampler: ShardedReplayClient,
        batch_size: int,
        beta: Callable[[], float],
        depth: int = 4,
        min_fleet_size: int = 1,
        batches_per_call: int = 1,
        seed: int | None = None,
        decompress: bool = True,
    ) -> None:
        if batches_per_call < 1:
            raise ValueError(f"batches_per_call ({batches_per_call}) must be >= 1")
        self._sampler = sampler
        self._batch_size = batch_size
        self._batches_per_call = batches_per_call
        self._beta = beta
        self._min_fleet_size = min_fleet_size
        self._queue: queue.Queue[PrioritizedBatch] = queue.Queue(maxsize=max(depth, batches_per_call))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apexrl-prefetch", daemon=True)
        # Compressed columns are decompressed in this thread, unless the caller does it (the sampler process
        # decompresses straight into its shared slots).
        self.decompressor = BatchDecompressor(sampler, seed) if decompress else None
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
                            f"replay holds {self._sampler.fleet_size} rows, waiting for {self._min_fleet_size}"
                        )
                batches = self._sampler.sample_batches(
                    self._batch_size, self._batches_per_call, beta=self._beta()
                )
                if self.decompressor is not None:
                    batches = [b.for_learning() for b in map(self.decompressor, batches) if b is not None]
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

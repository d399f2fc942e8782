"""`apexrl replay-reshard`: turn the checkpoints of M replay shards into checkpoints for N shards, offline (stop
the shards first; start the new ones with `apexrl replay --checkpoint-dir TARGET_i`). Every row of each source's
newest good checkpoint goes to exactly one target, with its stored priority bit for bit; rows are dealt out in
age order, interleaving the sources by relative age, so each new shard holds an even share (rows / N, rounded)
of every source and of every age, and FIFO eviction still drops the fleet's oldest rows first. Not carried
over: writers' de-duplication state, counters, incarnations (keys are renumbered 0, 1, ...: old keys are stale)
and write-ahead logs (a new lineage starts). Sources must agree on signature and alpha. Targets must hold no
checkpoint unless they are also sources (resharding in place, e.g. the volumes of a StatefulSet scaled from M
to N): their old checkpoints are deleted once every new one is durable. Example: --sources /ck/0,/ck/1 --targets
/ck/0,/ck/1,/ck/2.

Dealing: the sources are read in key order (oldest first) in R rounds; round t takes the next 1/R of every
source, and the fleet's rows, numbered in that order, go to target (number mod N). A target's rows get keys
0, 1, ... in that order, in a checkpoint of its own lineage, incarnation 0 and no writers.
"""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from apexrl.common.compression import CompressedColumn, concatenate, take_rows
from apexrl.common.settings import SettingsError, setting
from apexrl.replay_server.core.table_state import TableState
from apexrl.replay_server.durability.checkpoint import (
    CheckpointReader,
    CheckpointWriter,
    CorruptCheckpointError,
    chunk_rows_for,
)
from apexrl.replay_server.durability.checkpointer import Checkpointer, signature_difference
from apexrl.replay_server.durability.reshard_sequences import SequenceRouter, dealing_order, sequence_state

log = logging.getLogger("apexrl.replay.reshard")

HELP = (
    "offline: turn the checkpoints of M replay shards into checkpoints for N shards (every row, its priority)"
)
OUTPUT_NAME = "checkpoint-{:010d}.apexrl"


@dataclass(frozen=True)
class ReshardConfig:
    """`apexrl replay-reshard`: where the M saved shards' checkpoints are and where the N new ones go."""

    sources: tuple[str, ...] = setting(
        help="comma-separated checkpoint directories of the M saved shards (each one's newest good checkpoint is "
        "read)",
        metavar="DIR,DIR,...",
    )
    targets: tuple[str, ...] = setting(
        help="comma-separated checkpoint directories for the N new shards (created; no checkpoints in them "
        "unless they are also sources)",
        metavar="DIR,DIR,...",
    )
    capacity: int | None = setting(
        None,
        "capacity of each new shard (its --capacity); none: the sources' capacities summed, divided by N, "
        "rounded up. Refused when the rows do not fit",
    )

    def __post_init__(self) -> None:
        if not self.sources or not self.targets:
            raise ValueError("sources and targets each need at least one directory")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets ({','.join(self.targets)}) name a directory twice")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity ({self.capacity}) must be a positive integer")


CONFIG = ReshardConfig


@dataclass(frozen=True)
class ReshardResult:
    """What was written: per target its path, rows and sum of stored priorities."""

    paths: list[Path]
    rows: list[int]
    leaf_sums: list[float]
    source_rows: int


class _Rows:
    """The rows of one checkpoint in key order, taken a number at a time."""

    def __init__(self, reader: CheckpointReader) -> None:
        self.size = reader.state.size
        self._blocks = reader.blocks()
        self._columns: dict[str, np.ndarray] = {}
        self._leaves = np.zeros(0)
        self.taken = 0

    def take(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        parts, leaves = [self._columns], [self._leaves]
        have = len(self._leaves)
        while have < n:
            _, columns, block_leaves = next(self._blocks)
            parts.append(columns)
            leaves.append(block_leaves)
            have += len(block_leaves)
        names = list(parts[-1])
        joined = {k: concatenate([p[k] for p in parts if p]) for k in names}
        all_leaves = np.concatenate(leaves)
        self._columns = {k: take_rows(v, slice(n, None)) for k, v in joined.items()}
        self._leaves = all_leaves[n:]
        self.taken += n
        return {k: take_rows(v, slice(None, n)) for k, v in joined.items()}, all_leaves[:n]


class _Target:
    """One new shard's checkpoint, filled row by row and written chunk by chunk."""

    def __init__(self, path: Path, state: TableState, chunk_rows: int) -> None:
        self.path, self.state, self.chunk_rows = path, state, chunk_rows
        self.writer = CheckpointWriter(path, chunk_rows)
        self._columns: list[dict[str, np.ndarray]] = []
        self._leaves: list[np.ndarray] = []
        self._buffered = 0
        self.rows = 0
        self.leaf_sum = 0.0

    def add(self, columns: dict[str, np.ndarray], leaves: np.ndarray) -> None:
        self._columns.append(columns)
        self._leaves.append(leaves)
        self._buffered += len(leaves)
        while self._buffered >= self.chunk_rows:
            self._flush(self.chunk_rows)

    def _flush(self, rows: int) -> None:
        columns = {k: concatenate([c[k] for c in self._columns]) for k in self._columns[0]}
        leaves = np.concatenate(self._leaves)
        chunk_rows = min(self.chunk_rows, self.state.capacity - self.rows)  # the last chunk may be short
        pad = chunk_rows - rows
        out = {k: _padded(take_rows(v, slice(None, rows)), pad) for k, v in columns.items()}
        self.writer.add_chunk(self.rows, out, np.concatenate([leaves[:rows], np.zeros(pad)]))
        self.leaf_sum += float(leaves[:rows].sum())
        self.rows += rows
        self._columns = [{k: take_rows(v, slice(rows, None)) for k, v in columns.items()}]
        self._leaves = [leaves[rows:]]
        self._buffered -= rows

    def finish(self) -> int:
        if self._buffered:
            self._flush(self._buffered)
        return self.writer.finish(replace(self.state, next_key=self.rows, size=self.rows))


def reshard(sources: list[Path], targets: list[Path], capacity: int | None = None) -> ReshardResult:
    """Write one checkpoint per target from the newest good checkpoint of every source (see the module
    docstring). SettingsError when the sources disagree, a target is not empty, or the rows do not fit."""
    newest = []
    for directory in sources:
        files = Checkpointer.list_files(directory) if directory.is_dir() else []
        if not files:
            raise SettingsError(f"{directory} holds no checkpoint")
        newest.append(_newest_good(files))
    readers = [CheckpointReader(p) for p in newest]
    try:
        return _reshard(readers, sources, targets, capacity)
    finally:
        for r in readers:
            r.close()


def _newest_good(files: list[Path]) -> Path:
    for path in reversed(files):
        try:
            with CheckpointReader(path) as reader:
                reader.verify()
            return path
        except (CorruptCheckpointError, OSError) as err:
            log.error("CORRUPT CHECKPOINT skipped: %s", err)
    raise SettingsError(f"no good checkpoint among {', '.join(map(str, files))}")


def _reshard(
    readers: list[CheckpointReader], sources: list[Path], targets: list[Path], capacity: int | None
) -> ReshardResult:
    first = readers[0].state
    for reader in readers[1:]:
        s = reader.state
        if s.signature != first.signature:
            raise SettingsError(
                f"{reader.path} has signature {s.signature}, {readers[0].path} has "
                f"{first.signature}: {signature_difference(s.signature, first.signature)}"
            )
        if s.alpha != first.alpha:
            raise SettingsError(f"{reader.path} has alpha {s.alpha}, {readers[0].path} has {first.alpha}")
    resolved_sources = {p.resolve() for p in sources}
    for directory in targets:
        if (
            directory.resolve() not in resolved_sources
            and directory.exists()
            and Checkpointer.list_files(directory)
        ):
            raise SettingsError(f"target {directory} already holds checkpoints (and is not a source)")
    n = len(targets)
    total = sum(r.state.size for r in readers)
    capacity = capacity or -(-sum(r.state.capacity for r in readers) // n)
    if -(-total // n) > capacity:
        raise SettingsError(
            f"{total} rows do not fit in {n} shards of capacity {capacity}: each needs "
            f"{-(-total // n)}; give a larger --capacity"
        )
    stored = sum(r.size_bytes for r in readers) / max(1, total)  # a compressed row's bytes, roughly
    chunk_rows = chunk_rows_for(first.signature, stored)
    sequences = sequence_state([r.state for r in readers])
    base = TableState(
        signature=first.signature,
        capacity=capacity,
        alpha=first.alpha,
        next_key=0,
        size=0,
        max_priority=max(r.state.max_priority for r in readers),
        incarnation=0,
        **sequences,
    )
    outs = []
    for directory in targets:
        directory.mkdir(parents=True, exist_ok=True)
        number = (
            max((int(p.name[11:21]) for p in Checkpointer.list_files(directory, corrupt_too=True)), default=0)
            + 1
        )
        outs.append(
            _Target(
                directory / OUTPUT_NAME.format(number),
                replace(base, lineage=secrets.randbits(63) | 1),
                chunk_rows,
            )
        )
    streams = [_Rows(r) for r in readers]
    rounds = max(1, -(-max(s.size for s in streams) // chunk_rows))
    # A sequence table's trajectories go whole to one target each (reshard_sequences.py).
    router = SequenceRouter(readers, n, rounds, capacity) if sequences["max_sequence_length"] else None
    dealt = 0
    try:
        # The next 1/rounds of every source in turn: interleaved by relative age.
        for s, start, count in dealing_order([stream.size for stream in streams], rounds):
            columns, leaves = streams[s].take(count)
            if router is not None:
                columns = router.relinked(s, start, columns)
            for i, out in enumerate(outs):  # row j of the fleet goes to target j mod N (or its chain's)
                pick = slice((i - dealt) % n, None, n) if router is None else router.pick(s, start, count, i)
                out.add({k: take_rows(v, pick) for k, v in columns.items()}, leaves[pick])
            dealt += count
        for out in outs:
            out.finish()
    finally:
        for out in outs:
            out.writer.close()
    for directory, out in zip(targets, outs, strict=True):
        if directory.resolve() in resolved_sources:
            for old in Checkpointer.list_files(directory, corrupt_too=True):
                if old != out.path:
                    old.unlink()
    return ReshardResult([o.path for o in outs], [o.rows for o in outs], [o.leaf_sum for o in outs], total)


def run(config: ReshardConfig, stop: threading.Event) -> int:
    result = reshard([Path(p) for p in config.sources], [Path(p) for p in config.targets], config.capacity)
    for path, rows, leaf_sum in zip(result.paths, result.rows, result.leaf_sums, strict=True):
        log.info("wrote %s: %d rows, stored priorities summing to %.6g", path, rows, leaf_sum)
    log.info(
        "resharded %d rows from %d shards onto %d (%d rows written)",
        result.source_rows,
        len(config.sources),
        len(config.targets),
        sum(result.rows),
    )
    return 0


def _padded(column: np.ndarray | CompressedColumn, pad: int) -> np.ndarray | CompressedColumn:
    """`column` followed by `pad` empty slots (zeros; empty frames; no writer)."""
    if isinstance(column, CompressedColumn):
        return CompressedColumn(
            column.compression,
            column.dtype,
            column.shape,
            column.data,
            np.concatenate([column.lengths, np.zeros(pad, dtype=np.int64)]),
        )
    if column.dtype == object:
        return np.concatenate([column, np.full(pad, None, dtype=object)])
    return np.concatenate([column, np.zeros((pad, *column.shape[1:]), column.dtype)])

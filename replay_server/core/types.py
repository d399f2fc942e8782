"""The replay shard's results as plain Python types: what the table returns, the servicer encodes (wire.py) and
the client decodes back. No gRPC and no protobuf here, so the table and its callers stay below the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from apexrl.common.compression import CompressedColumn, take_rows
from apexrl.common.signature import Signature
from apexrl.replay_server.core.probabilities import within_shard


@dataclass(frozen=True)
class ShardTotals:
    """What a sampler needs to know of a shard to weigh it against the others (carried by every Sample answer)."""

    total_priority: float  # sum of stored priorities p**alpha
    size: int  # rows held
    min_priority: float  # smallest positive stored priority (0 when none is positive)
    incarnation: int  # random per shard process; keys of another incarnation are stale


@dataclass(frozen=True)
class ShardInfo:
    """A snapshot of one shard's state and counters: the InfoResponse message (same field names)."""

    signature: Signature | None  # None until declared or fixed by the first insert
    capacity: int
    size: int
    total_priority: float  # sum of stored priorities p**alpha
    min_priority: float  # smallest positive stored priority (0 when none is positive)
    max_priority: float  # largest raw priority seen; rows inserted without priorities get it
    alpha: float
    incarnation: int
    inserted_total: int  # rows stored since start (resent duplicates not counted)
    inserted_bytes_total: int  # bytes of row data stored since start (compressed fields as their frames)
    evicted_total: int
    sampled_total: int
    updated_total: int
    stale_updates_total: int
    duplicate_batches_total: int
    min_size_to_sample: int
    samples_per_insert: float
    max_sample_batch_size: int
    stored_bytes: int = 0  # bytes of row data held now (stored_bytes / size: bytes per stored row)
    max_bytes: int = 0  # the most bytes of row data held (0: no limit but the capacity)
    # Sequence tables (0, None for a table of transitions): `size` then counts items, `steps` the rows held.
    max_sequence_length: int = 0
    item_signature: Signature | None = None
    steps: int = 0
    items_inserted_total: int = 0  # items stored (those dropped on arrival, their first step gone, included)
    items_evicted_total: int = 0  # items gone with their first step

    @property
    def totals(self) -> ShardTotals:
        return ShardTotals(self.total_priority, self.size, self.min_priority, self.incarnation)


@dataclass(frozen=True)
class SampledBatch:
    """Rows drawn from one shard (the SampleResponse message), with what a sampler needs to weight them and to
    send their new priorities back."""

    keys: np.ndarray  # uint64 [B]
    priorities: np.ndarray  # float64 [B]: stored priorities p**alpha
    columns: dict[str, np.ndarray | CompressedColumn]  # compressed fields as their frames, never decompressed
    total_priority: float  # the shard's sum of stored priorities when the batch was drawn
    size: int  # the shard's rows when the batch was drawn
    min_priority: float  # the shard's smallest positive stored priority
    incarnation: int
    # Tables with compressed fields only (else empty): the writer id that stored each row, so a reader that finds
    # a frame that does not decompress can name who wrote it.
    writers: tuple[str, ...] = ()
    # Several batches in one answer (replay.proto, SampleRequest.batch_rows): the rows of each, back to back.
    # Empty: one batch (also what an older shard answers to a request for several).
    batch_rows: tuple[int, ...] = ()
    # Sequence tables only (a table of transitions leaves them so): each key names an item of up to
    # `sequence_length` steps; `columns` hold the steps item-major ([items * sequence_length, ...]: item i's steps
    # are rows i * T .. i * T + T - 1, those past lengths[i] a copy of its last step), `item_columns` the items'
    # own fields ([items, ...]), `lengths` each item's steps (int32 [items]).
    sequence_length: int = 0
    lengths: np.ndarray | None = None
    item_columns: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def totals(self) -> ShardTotals:
        return ShardTotals(self.total_priority, self.size, self.min_priority, self.incarnation)

    def take(self, idx: np.ndarray | slice) -> SampledBatch:
        """The rows (items) at `idx` (an index array or a slice) as a one-batch SampledBatch with the same
        totals."""
        steps = idx
        if self.sequence_length:  # an item's steps are sequence_length rows of the columns
            items = np.arange(len(self.keys))[idx]
            steps = (items[:, None] * self.sequence_length + np.arange(self.sequence_length)).reshape(-1)
        return replace(
            self,
            keys=self.keys[idx],
            priorities=self.priorities[idx],
            columns={name: take_rows(column, steps) for name, column in self.columns.items()},
            writers=tuple(np.asarray(self.writers, dtype=object)[steps]) if self.writers else (),
            batch_rows=(),
            lengths=None if self.lengths is None else self.lengths[idx],
            item_columns={name: column[idx] for name, column in self.item_columns.items()},
        )

    @property
    def probabilities(self) -> np.ndarray:
        """Probability each row was drawn with within this shard (probabilities.within_shard)."""
        return within_shard(self.priorities, self.total_priority, self.size)


@dataclass(frozen=True)
class InsertResult:
    """What the shard reports for one stored (or recognised duplicate) batch: the InsertAck's payload."""

    first_key: int  # key of the first stored row; 0 for a duplicate
    rows: int  # rows stored by this batch; 0 for a duplicate
    duplicate: bool
    items: int = 0  # a sequence table's items stored with it (those dropped on arrival not counted)


@dataclass(frozen=True)
class UpdateResult:
    """The UpdatePrioritiesResponse: `applied` counts entries set (a key repeated twice counts twice); `totals`
    are the shard's right after the update."""

    applied: int
    stale: int
    totals: ShardTotals


@dataclass(frozen=True)
class CheckpointResult:
    """A checkpoint that is durable on the shard's disk: the CheckpointResponse message (same field names)."""

    path: str
    rows: int
    inserted_total: (
        int  # the insert counter at the checkpoint's instant: every lower key is in it (or evicted)
    )
    bytes: int
    seconds: float  # from the checkpoint's instant until durable
    incarnation: int

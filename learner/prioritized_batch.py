"""A batch drawn across shards (`PrioritizedBatch`), and its assembly from the shards' answers with P(i) over the
whole fleet and PER/Ape-X importance weights.

Row i of shard s was drawn with P(i) = share_s * (p_i / T_s'), share_s being the shard's share of the allocation
and T_s' its total when it answered. w_i = (N * P(i))^-beta / max_j w_j with N the rows of the shards the
allocation covered and the maximum taken over all of their rows through each shard's minimum priority
(replay_server/core/probabilities.py), so a shard left out of the allocation counts neither in N nor in the maximum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from apexrl.common.compression import CompressedColumn, concatenate, take_rows
from apexrl.replay_server.core.probabilities import importance_weights, smallest_probability
from apexrl.replay_server.core.types import SampledBatch, ShardTotals


@dataclass(frozen=True)
class PrioritizedBatch:
    """A batch drawn across shards. Row j came from shard `shard_ids[j]` with key `keys[j]`. Compressed fields
    are CompressedColumns (the learner's data path decompresses them: learner/prefetch.py)."""

    columns: dict[str, np.ndarray | CompressedColumn]
    shard_ids: np.ndarray  # int32 [B]
    keys: np.ndarray  # uint64 [B]
    probabilities: np.ndarray  # float64 [B]: P(i) over the whole fleet
    weights: np.ndarray  # float32 [B]: normalised importance weights, max over the fleet = 1
    incarnations: tuple[int, ...]  # per shard: the incarnation its keys belong to (0 if not sampled)
    fleet_size: int
    writers: np.ndarray | None = (
        None  # object [B]: each row's writer id, when the batch has compressed fields
    )
    # Sequence tables only (replay.proto, "Sequence tables"): each key names an item; `columns` hold the items'
    # steps item-major ([B * sequence_length, ...]), `lengths` each item's steps, `item_columns` its own fields.
    sequence_length: int = 0
    lengths: np.ndarray | None = None  # int32 [B]
    item_columns: dict[str, np.ndarray] = field(default_factory=dict)

    def take(self, idx: np.ndarray) -> PrioritizedBatch:
        """The rows (items) at `idx`, in that order."""
        steps = step_rows(idx, self.sequence_length) if self.sequence_length else idx
        return PrioritizedBatch(
            {name: take_rows(col, steps) for name, col in self.columns.items()},
            self.shard_ids[idx],
            self.keys[idx],
            self.probabilities[idx],
            self.weights[idx],
            self.incarnations,
            self.fleet_size,
            None if self.writers is None else self.writers[steps],
            self.sequence_length,
            None if self.lengths is None else self.lengths[idx],
            {name: column[idx] for name, column in self.item_columns.items()},
        )

    def for_learning(self) -> PrioritizedBatch:
        """The batch as an algorithm's learning reads it: a sequence batch's step columns as [B, T, ...] beside its
        items' `lengths` and own fields (its columns decompressed first); a batch of transitions as it is."""
        if not self.sequence_length:
            return self
        items, steps = len(self.keys), self.sequence_length
        columns = {
            name: np.asarray(column).reshape(items, steps, *column.shape[1:])
            for name, column in self.columns.items()
        }
        return replace(self, columns={**columns, "lengths": self.lengths, **self.item_columns})

    def split(self, parts: int, rng: np.random.Generator) -> list[PrioritizedBatch]:
        """Cut into `parts` batches of random rows. Rows arrive grouped by shard and stratum, so they are
        shuffled first; every part is then a fair draw with the same probabilities and weights."""
        order = rng.permutation(len(self.keys))
        return [self.take(idx) for idx in np.array_split(order, parts)]


def step_rows(items: np.ndarray, sequence_length: int) -> np.ndarray:
    """The column rows of `items` when each item is `sequence_length` consecutive rows (item-major)."""
    return (np.asarray(items)[:, None] * sequence_length + np.arange(sequence_length)).reshape(-1)


AnswerRows = tuple[SampledBatch, slice]  # rows `slice` of one shard's answer: one batch's piece, not copied


def assemble(
    parts: Mapping[int, Sequence[AnswerRows]],
    shares: Mapping[int, float],
    covered: Mapping[int, ShardTotals],
    shard_count: int,
    beta: float,
) -> PrioritizedBatch:
    """One batch from the pieces each shard answered (`parts`, by shard id): rows in shard order, P(i) scaled by
    the shard's share, weights normalised over the `covered` shards (every shard of the allocation, with the
    totals the sampler last saw, sampled from or not). `shard_count` sizes the incarnations tuple."""
    pieces = [(s, answer, rows) for s in sorted(parts) for answer, rows in parts[s]]
    sequence_length = pieces[0][1].sequence_length
    if sequence_length:  # an item's steps are sequence_length rows of the columns: take them whole
        pieces = [(s, answer.take(rows), slice(None)) for s, answer, rows in pieces]
    keys = np.concatenate([answer.keys[rows] for _, answer, rows in pieces])
    shard_ids = np.concatenate(
        [np.full(len(answer.keys[rows]), s, dtype=np.int32) for s, answer, rows in pieces]
    )
    probabilities = np.concatenate([shares[s] * answer.probabilities[rows] for s, answer, rows in pieces])
    columns = {
        name: concatenate([take_rows(answer.columns[name], rows) for _, answer, rows in pieces])
        for name in pieces[0][1].columns
    }
    writers = None
    if any(answer.writers[rows] for _, answer, rows in pieces):  # one per column row (a sequence's: per step)
        per_item = max(1, sequence_length)
        names = [
            w
            for _, answer, rows in pieces
            for w in (answer.writers[rows] or ("",) * (len(answer.keys[rows]) * per_item))
        ]
        writers = np.empty(len(names), dtype=object)
        writers[:] = names
    fleet_size = sum(covered[s].size for s in shares)
    smallest = smallest_probability(
        (share, covered[s].total_priority, covered[s].min_priority, covered[s].size)
        for s, share in shares.items()
    )
    weights = importance_weights(probabilities, fleet_size, min(probabilities.min(), smallest), beta)
    incarnations = tuple(parts[s][0][0].incarnation if s in parts else 0 for s in range(shard_count))
    item_columns = {
        name: np.concatenate([answer.item_columns[name] for _, answer, _ in pieces])
        for name in pieces[0][1].item_columns
    }
    return PrioritizedBatch(
        columns,
        shard_ids,
        keys,
        probabilities,
        weights.astype(np.float32),
        incarnations,
        fleet_size,
        writers,
        sequence_length,
        pieces[0][1].lengths if not sequence_length else np.concatenate([a.lengths for _, a, _ in pieces]),
        item_columns,
    )

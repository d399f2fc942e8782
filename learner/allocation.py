"""How a draw of batches is spread over the shards and cut back into batches (ARCHITECTURE §3), pure numpy.

Each batch gets its own allocation k_s ~ Multinomial(B, share_s) over the sampleable shards (one multinomial per
batch, shares from replay_server/core/probabilities.py); a shard's rows of every batch then travel in as few Sample
calls as its largest batch allows (`plan_calls`), each call asking for its pieces as separately stratified batches
(SampleRequest.batch_rows), and each answer is cut back into its pieces (`cut`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apexrl.learner.prioritized_batch import AnswerRows
from apexrl.replay_server.core.probabilities import shard_shares
from apexrl.replay_server.core.types import SampledBatch, ShardTotals

Piece = tuple[int, int]  # (batch, rows): one batch's rows from one shard


def allocate(
    rng: np.random.Generator, totals: Mapping[int, ShardTotals], batch_size: int, batches: int
) -> tuple[dict[int, float], dict[int, np.ndarray]]:
    """Each shard's share of the probability mass (by shard id, from `totals` of the sampleable shards), and its
    rows in each batch (one multinomial draw per batch)."""
    live = list(totals)
    share = shard_shares(
        np.array([totals[s].total_priority for s in live]),
        np.array([float(totals[s].size) for s in live]),
    )
    counts = (
        rng.multinomial(batch_size, share)[None, :]
        if batches == 1
        else rng.multinomial(batch_size, share, size=batches)
    )
    shares = {s: float(sh) for s, sh in zip(live, share, strict=True)}
    return shares, {s: counts[:, j] for j, s in enumerate(live)}


def plan_calls(
    counts: Mapping[int, np.ndarray], max_batch: Mapping[int, int]
) -> list[tuple[int, list[Piece]]]:
    """(shard, pieces) of every Sample call: each shard's batches in order, as few calls as its largest batch
    (`max_batch[s]`) allows (a batch above it is cut into pieces, each drawn on its own)."""
    calls = []
    for s, rows in counts.items():
        limit, pieces, used = max_batch[s], [], 0
        for b, k in enumerate(rows.tolist()):
            while k > 0:
                take = min(k, limit - used)
                pieces.append((b, take))
                used, k = used + take, k - take
                if used == limit:
                    calls.append((s, pieces))
                    pieces, used = [], 0
        if pieces:
            calls.append((s, pieces))
    return calls


def call_rows(pieces: list[Piece]) -> tuple[int, tuple[int, ...]]:
    """The rows of one Sample call and its `batch_rows` (empty for a single piece: a plain request)."""
    rows = tuple(k for _, k in pieces)
    return sum(rows), (rows if len(rows) > 1 else ())


def cut(part: SampledBatch, pieces: list[Piece], rng: np.random.Generator) -> list[tuple[int, AnswerRows]]:
    """The answer to one call as (batch, its rows of the answer) pieces. An answer without the batches asked for (an
    older shard: one stratified batch of all the rows) is shuffled first, so each piece is a fair draw."""
    if len(pieces) == 1:
        return [(pieces[0][0], (part, slice(None)))]
    rows = tuple(k for _, k in pieces)
    if part.batch_rows != rows:
        part = part.take(rng.permutation(len(part.keys)))
    ends = np.cumsum(rows)
    return [(b, (part, slice(end - k, end))) for (b, k), end in zip(pieces, ends.tolist(), strict=True)]

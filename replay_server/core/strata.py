"""Several stratified batches in one draw (replay.proto, SampleRequest.batch_rows): pure numpy, no locks.

One Sample answer may hold several batches, each drawn on its own: batch i of k_i rows cuts the shard's mass into
k_i equal strata and draws once in each, exactly as a one-batch Sample of k_i rows would. The targets of all the
batches go through the sum tree in one descent, so a shard pays for one call whatever the number of batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from apexrl.common.errors import InvalidArgumentError


def check_batch_rows(batch_rows: Sequence[int], batch_size: int) -> tuple[int, ...]:
    """The batches' sizes as a tuple; InvalidArgumentError unless every entry is >= 1 and they sum to
    `batch_size` (whose own range the caller checks)."""
    rows = tuple(int(k) for k in batch_rows)
    for i, k in enumerate(rows):
        if k < 1:
            raise InvalidArgumentError(f"batch_rows[{i}] is {k}; each batch needs >= 1 row")
    if sum(rows) != batch_size:
        raise InvalidArgumentError(
            f"batch_rows ({len(rows)} batches) sum to {sum(rows)}, not to batch_size ({batch_size})"
        )
    return rows


def stratified_targets(batch_rows: Sequence[int], total: float, rng: np.random.Generator) -> np.ndarray:
    """Prefix-sum targets for the batches back to back: for a batch of k rows, (j + U_j) * total / k for
    j = 0 .. k-1, U_j uniform in [0, 1)."""
    sizes = np.asarray(batch_rows, dtype=np.int64)
    n = int(sizes.sum())
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)  # the first position of each row's batch
    stratum = np.arange(n, dtype=np.float64) - starts  # j within its batch
    targets = rng.random(n)
    targets += stratum
    targets *= np.repeat(total / sizes, sizes)
    return targets

"""A shard seen with total priority 0 is probed again and sampled in proportion once it gains mass (issue 17).

The client first sees shard b holding only rows of priority 0 (total 0: it is allocated nothing, so no Sample
answer refreshes its view); b then gains 5 rows of priority 60, 27% of the fleet's mass. Within the staleness
bound b must be drawn, and from then on in proportion to its mass (chi-square at the significance the other
fleet tests use). Real shard processes; the test waits on conditions, each with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import time

import pytest

from apexrl.learner.sharded_client import ShardedReplayClient
from tests.integration.learner.test_sampling_while_fleet_changes import (
    BOUND,
    assert_proportional,
    draw,
    fill,
    sampler_for,
    shard,  # noqa: F401 (the fixture)
)

BATCH = 64


def batches_until_drawn(sampler: ShardedReplayClient, shard_id: int, deadline: float) -> int:
    """Sample batches until one holds a row of `shard_id`; how many it took. Fails at the deadline."""
    batches = 0
    while time.monotonic() < deadline:
        batches += 1
        if (sampler.sample(BATCH, beta=1.0).shard_ids == shard_id).any():
            return batches
    pytest.fail(f"shard {shard_id} not drawn in {batches} batches before the staleness bound")


@pytest.mark.timeout(120)
def test_a_shard_seen_at_total_zero_is_drawn_in_proportion_once_it_gains_rows(shard):  # noqa: F811
    a, b = shard("a"), shard("b")
    fill(a.address, 400, 2.0)
    fill(b.address, 400, 0.0, start=400)
    with sampler_for([a.address, b.address]) as sampler:
        counts = draw(sampler, 20)
        assert counts[1] == 0 and sampler.sample(8).fleet_size == 800  # seen: 400 rows, total 0
        fill(b.address, 5, 60.0, start=800)  # now 5 * 60 = 300 of the fleet's 1100
        batches_until_drawn(sampler, 1, time.monotonic() + BOUND)
        assert sampler.sample(BATCH).fleet_size == 805
        assert_proportional(draw(sampler, 200), [400 * 2.0, 5 * 60.0])

"""replay_server/durability/restore_checks.py: the content of a checkpoint whose checksums hold is checked before a table trusts
it; each fault is named (the key, the value), and good content passes untouched."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import Signature
from apexrl.replay_server.core.table_state import TableState
from apexrl.replay_server.durability.restore_checks import check_state, checked_blocks
from tests.conftest import cartpole_batch

SIGNATURE = Signature.parse(
    "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
)
STATE = TableState(
    signature=SIGNATURE,
    capacity=100,
    alpha=0.6,
    next_key=130,
    size=100,
    max_priority=3.0,
    incarnation=7,
    aliases={5: 120},
    writers=(("w0", 12),),
    counters={"evicted": 30},
    lineage=9,
)


def blocks(state: TableState = STATE, leaves: float | None = 1.0, sizes=(40, 60)):
    key = state.first_key
    for size in sizes:
        yield key, cartpole_batch(size, key), np.full(size, leaves)
        key += size


def test_a_state_a_table_could_have_saved_passes_and_so_do_its_blocks():
    check_state(STATE)
    assert sum(len(leaves) for _, _, leaves in checked_blocks(STATE, blocks())) == 100
    check_state(dataclasses.replace(STATE, alpha=0.0, incarnation=0, size=0, next_key=0, aliases={}))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"alpha": math.nan}, "alpha (nan)"),
        ({"alpha": 11.0}, "alpha (11.0)"),
        ({"capacity": 0}, "capacity (0)"),
        ({"max_priority": math.nan}, "max_priority must be finite"),
        ({"max_priority": -1.0}, "(first: index 0 = -1.0)"),
        ({"max_priority": math.inf}, "max_priority must be finite"),
        ({"size": 101}, "size 101 and next key 130"),
        ({"next_key": 50}, "size 100 and next key 50"),
        ({"next_key": 2**63}, f"next key {2**63}"),
        ({"incarnation": -1}, "incarnation -1"),
        ({"aliases": {5: 131}}, "up to key 131"),
        ({"writers": (("w0", -1),)}, "sequence -1"),
        ({"counters": {"evicted": -3}}, "negative counters {'evicted': -3}"),
    ],
)
def test_each_number_no_table_could_have_saved_is_named(change, named):
    with pytest.raises(InvalidArgumentError) as err:
        check_state(dataclasses.replace(STATE, **change))
    assert named in str(err.value)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (math.nan, "row 30 has priority ** alpha nan"),
        (-0.5, "row 30 has priority ** alpha -0.5"),
        (math.inf, "row 30 has priority ** alpha inf"),
        (1e25**0.6 * 1.01, "<= 1e+15"),
    ],
)
def test_a_leaf_no_priority_could_give_is_named_with_its_key(value, named):
    with pytest.raises(InvalidArgumentError) as err:
        list(checked_blocks(STATE, blocks(leaves=value)))
    assert named in str(err.value)


def test_blocks_must_cover_the_keys_the_state_holds_exactly():
    with pytest.raises(InvalidArgumentError, match="rows end at key 100, the state says 130"):
        list(checked_blocks(STATE, blocks(sizes=(40, 30))))
    gap = [b for i, b in enumerate(blocks(sizes=(40, 30, 30))) if i != 1]
    with pytest.raises(InvalidArgumentError, match="rows from key 100 follow key 69"):
        list(checked_blocks(STATE, gap))
    key, columns, leaves = next(blocks(sizes=(100,)))
    with pytest.raises(InvalidArgumentError, match="100 rows, 99 leaves"):
        list(checked_blocks(STATE, [(key, columns, leaves[:99])]))
    columns["action"] = columns["action"].astype(np.int32)
    with pytest.raises(InvalidArgumentError, match="column 'action' is int32"):
        list(checked_blocks(STATE, [(key, columns, leaves)]))

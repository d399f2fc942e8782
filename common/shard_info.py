"""ShardInfo: a snapshot of one replay shard's state and counters.

The table produces it, the Info RPC carries it field for field (InfoResponse has the same field names), and the
client SDK returns it, so the three never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from apexrl.common.signature import Signature


@dataclass(frozen=True)
class ShardInfo:
    signature: Signature | None   # None until declared or fixed by the first insert
    capacity: int
    size: int
    total_priority: float         # sum of stored priorities p**alpha
    min_priority: float           # smallest positive stored priority (0 when none is positive)
    max_priority: float           # largest raw priority seen; rows inserted without priorities get it
    alpha: float
    incarnation: int
    inserted_total: int           # rows stored since start (resent duplicates not counted)
    inserted_bytes_total: int
    evicted_total: int
    sampled_total: int
    updated_total: int
    stale_updates_total: int
    duplicate_batches_total: int
    min_size_to_sample: int
    samples_per_insert: float
    max_sample_batch_size: int


# Every field except the signature maps one to one onto an InfoResponse field of the same name.
SCALAR_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ShardInfo) if f.name != "signature")

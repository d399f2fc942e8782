"""`TableConfig`: one replay table's settings (the shard process adds its server settings in config.py's
ReplayConfig), each checked when made. Plain data: no numpy, no gRPC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.common.settings import setting
from apexrl.common.signature import Signature


@dataclass(frozen=True)
class TableConfig:
    """Configuration of one replay table (the shard process adds its server settings in ReplayConfig).

    Attributes:
        capacity: rows kept; the oldest row is evicted first (FIFO, as in Ape-X).
        max_bytes: bytes of row data kept (compressed fields counted as stored); the oldest rows are evicted first
            when an insert would exceed it. None: only the capacity in rows bounds the table.
        alpha: priority exponent; rows are sampled with probability p**alpha / sum(p**alpha).
        signature: fields every row has; None lets the first insert fix it.
        min_size_to_sample: rows the table must hold before Sample answers.
        samples_per_insert: target ratio of sampled rows to inserted rows; 0 turns the ratio limiter off.
        samples_per_insert_tolerance: how many sampled rows the ratio may run ahead of or behind its target.
        max_sample_batch_size: largest batch one Sample may ask for.
        max_tracked_writers: writers whose last sequence number is remembered for de-duplication (LRU).
        seed: seed for sampling; None draws one from the OS.
    """

    capacity: int = setting(
        1_000_000,
        "rows the shard keeps; the oldest is evicted first",
        wiring="[fleet] replay_capacity / number of shards",
    )
    max_bytes: int | None = setting(
        None,
        "bytes of row data the shard keeps besides --capacity rows (compressed fields counted as stored, "
        "apexrl_replay_stored_bytes); an insert that would exceed it evicts the oldest rows first; none: rows "
        "only",
    )
    alpha: float = setting(0.6, "priority exponent: rows are sampled with probability p**alpha / sum")
    signature: Signature | None = setting(
        None,
        "fields of every row, e.g. 'obs:float32[4],action:int64[],reward:float32[]'; none: the first "
        "insert fixes them",
        metavar="SIGNATURE",
    )
    # Rate limiting
    min_size_to_sample: int = setting(
        1,
        "rows the shard must hold before Sample answers",
        wiring="[fleet] min_replay_size / number of shards",
    )
    samples_per_insert: float = setting(
        0.0,
        "target ratio of sampled to inserted rows; 0 turns the ratio limiter off",
        wiring="[fleet] samples_per_insert",
    )
    samples_per_insert_tolerance: float = setting(
        10_000.0,
        "sampled rows the ratio may run ahead or behind before a side blocks",
        wiring="the shard's minimum size (4x, at least 1024)",
    )
    # Limits
    max_sample_batch_size: int = setting(4096, "largest batch one Sample may ask for")
    max_tracked_writers: int = setting(
        100_000,
        "writers whose last sequence number the shard remembers for "
        "de-duplication (when full, the least recently used writer of the identity holding the most is forgotten)",
    )
    seed: int | None = setting(None, "sampling seed (none: from the OS)", wiring="[fleet] seed + shard index")
    # Sequence tables (R2D2)
    max_sequence_length: int = setting(
        0,
        "0: rows are transitions, each sampled on its own; above 0: rows are steps and the shard samples items, "
        "windows of up to this many consecutive steps of one writer (burn-in plus training length), each step "
        "stored once however many items refer to it; --capacity and --min-size-to-sample then count steps and "
        "items",
    )
    item_signature: Signature | None = setting(
        None,
        "a sequence table's item fields, e.g. the recurrent state at each item's first step "
        "'state:float32[2,64]'; none: the first items fix them",
        metavar="SIGNATURE",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity ({self.capacity}) must be a positive integer")
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or self.max_bytes < 1):
            raise ValueError(f"max_bytes ({self.max_bytes}) must be a positive integer (or none)")
        if not 0 <= self.alpha <= 10:
            raise ValueError(f"alpha ({self.alpha}) must be in [0, 10]")
        if self.min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({self.min_size_to_sample}) must be a positive integer")
        if self.min_size_to_sample > self.capacity:
            raise ValueError(
                f"min_size_to_sample ({self.min_size_to_sample}) exceeds capacity ({self.capacity})"
            )
        if not (math.isfinite(self.samples_per_insert) and self.samples_per_insert >= 0):
            raise ValueError(f"samples_per_insert ({self.samples_per_insert}) must be finite and >= 0")
        if not self.samples_per_insert_tolerance > 0:
            raise ValueError(
                f"samples_per_insert_tolerance ({self.samples_per_insert_tolerance}) must be > 0"
            )
        if self.max_sample_batch_size < 1:
            raise ValueError(
                f"max_sample_batch_size ({self.max_sample_batch_size}) must be a positive integer"
            )
        if not isinstance(self.max_sequence_length, int) or not 0 <= self.max_sequence_length < 1 << 16:
            raise ValueError(
                f"max_sequence_length ({self.max_sequence_length}) must be an integer in [0, 65535]"
            )
        if self.max_sequence_length and self.capacity >= 1 << 31:
            raise ValueError(f"a sequence table's capacity ({self.capacity}) must be below 2**31 steps")
        if self.max_tracked_writers < 1:
            raise ValueError(f"max_tracked_writers ({self.max_tracked_writers}) must be a positive integer")

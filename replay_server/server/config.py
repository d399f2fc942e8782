"""`apexrl replay` settings: the table's (TableConfig) plus the server's, declared once (see common/settings.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.common.call_limits import CallLimitSettings
from apexrl.common.connections import ConnectionPolicy
from apexrl.common.process import metrics_port_setting
from apexrl.common.serving_settings import ServingSettings
from apexrl.common.settings import setting
from apexrl.replay_server.core.table import TableConfig
from apexrl.replay_server.server.quotas import QuotaSettings

DEFAULT_PORT = 7000
DEFAULT_METRICS_PORT = 9000


@dataclass(frozen=True)
class ReplayConfig(ServingSettings, CallLimitSettings, ConnectionPolicy, QuotaSettings, TableConfig):
    """One replay shard process: its table, and where and how it serves (ServingSettings)."""

    port: int = setting(DEFAULT_PORT, "gRPC port of the ReplayService; 0 picks a free port (see --port-file)")
    metrics_port: int = metrics_port_setting(DEFAULT_METRICS_PORT)
    max_message_bytes: int = setting(
        64 * 1024 * 1024,
        "largest gRPC message received or sent; larger ones are refused with RESOURCE_EXHAUSTED (an Insert "
        "message may be this large; every other request: max_request_bytes)",
    )
    max_request_bytes: int = setting(
        4 * 1024 * 1024,
        "largest request message of every method but Insert (Sample, UpdatePriorities, Info, ...); a larger one "
        "is refused with RESOURCE_EXHAUSTED",
    )
    # Durability
    checkpoint_dir: str | None = setting(
        None,
        "directory of this shard's checkpoints: restored at start (health NOT_SERVING until done; a torn or "
        "corrupt file is skipped for the previous one), written every --checkpoint-every seconds, on the "
        "Checkpoint RPC and at SIGTERM, without stopping the shard (`apexrl replay-reshard` moves a fleet's "
        "checkpoints onto another number of shards); one shard per directory: a second shard given one in use "
        "is refused (`apexrl launch --replay-durability` gives each its own); none: no checkpoints",
        metavar="DIR",
    )
    checkpoint_every: float = setting(
        300.0,
        "seconds between checkpoints when the table changed; 0: only on the Checkpoint RPC and at shutdown",
    )
    checkpoint_max_mb_per_s: float = setting(
        200.0,
        "pace of checkpoint writing in MB/s (a checkpoint then takes its size / this, plus the final "
        "fsync) so it takes a bounded share of the CPU inserts and samples need; 0: as fast as possible",
    )
    checkpoint_keep: int = setting(
        2, "newest checkpoints kept (older ones deleted): a corrupt newest one falls back to the one before"
    )
    wal: str | None = setting(
        None,
        "directory of a write-ahead log: every insert batch is appended and fsynced (grouped) before it is "
        "acknowledged and replayed at start after the newest checkpoint, so a SIGKILL loses no acknowledged "
        "row (priority updates since the checkpoint are lost); needs --checkpoint-dir",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        TableConfig.__post_init__(self)
        QuotaSettings.__post_init__(self)
        ConnectionPolicy.__post_init__(self)
        CallLimitSettings.__post_init__(self)
        self.check_serving()
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes ({self.max_message_bytes}) must be at least 1024")
        if self.max_request_bytes < 1024:  # above max_message_bytes, max_message_bytes is the limit
            raise ValueError(f"max_request_bytes ({self.max_request_bytes}) must be at least 1024")
        if not (math.isfinite(self.checkpoint_every) and self.checkpoint_every >= 0):
            raise ValueError(
                f"checkpoint_every ({self.checkpoint_every}) must be a finite number of seconds >= 0"
            )
        if not (math.isfinite(self.checkpoint_max_mb_per_s) and self.checkpoint_max_mb_per_s >= 0):
            raise ValueError(
                f"checkpoint_max_mb_per_s ({self.checkpoint_max_mb_per_s}) must be finite and >= 0"
            )
        if self.checkpoint_keep < 1:
            raise ValueError(f"checkpoint_keep ({self.checkpoint_keep}) must be at least 1")
        if self.wal is not None and self.checkpoint_dir is None:
            raise ValueError("wal needs checkpoint_dir: the log is truncated after each checkpoint")

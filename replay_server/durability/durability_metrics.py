"""What the shard's checkpoints and write-ahead log report to Prometheus: one mutable record they update and a
collector that reads it at scrape time (all zero on a shard started without them)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


@dataclass
class DurabilityStats:
    """Updated by the checkpointer and the write-ahead log (under `lock` when a field pair must agree)."""

    checkpoints_written: int = 0
    checkpoints_failed: int = 0
    last_checkpoint_unix_seconds: float = 0.0  # when the last checkpoint became durable
    last_checkpoint_bytes: int = 0
    last_checkpoint_seconds: float = 0.0  # from the snapshot's start to durable
    last_checkpoint_rows: int = 0
    restore_seconds: float = 0.0
    restored_rows: int = 0
    corrupt_checkpoints: int = 0  # skipped at start
    wal_bytes: int = 0
    wal_fsyncs: int = 0
    wal_batches: int = 0
    wal_replayed_rows: int = 0
    wal_failures: int = 0  # failed appends and writes, and inserts refused after them
    wal_failed: int = 0  # 1 once the log failed for good (until the shard restarts)
    wal_replay_gaps: int = 0  # gaps the start-up replay found (rows after them not replayed)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class DurabilityCollector:
    def __init__(self, stats: DurabilityStats) -> None:
        self._stats = stats

    def describe(self):
        return []

    def collect(self):
        s = self._stats
        for name, doc, value in (
            ("checkpoints", "Checkpoints written (durable: fsynced and renamed)", s.checkpoints_written),
            (
                "checkpoint_failures",
                "Checkpoints that failed to be written (the shard goes on serving)",
                s.checkpoints_failed,
            ),
            (
                "corrupt_checkpoints",
                "Checkpoints set aside at start (renamed *.corrupt) for an older one: torn, a "
                "failed checksum, or content no shard could have saved (NaN or negative priorities, keys that do not "
                "fit)",
                s.corrupt_checkpoints,
            ),
            (
                "wal_replay_gaps",
                "Gaps the write-ahead log's replay found at start: a segment missing or stopped "
                "early, or a record that cannot be replayed; the rows from there on were not replayed (lost) and the "
                "later log was set aside (*.orphan)",
                s.wal_replay_gaps,
            ),
            ("wal_bytes", "Bytes appended to the write-ahead log", s.wal_bytes),
            (
                "wal_fsyncs",
                "fsync calls of the write-ahead log (each commits a group of insert batches)",
                s.wal_fsyncs,
            ),
            ("wal_batches", "Insert batches appended to the write-ahead log", s.wal_batches),
            (
                "wal_failures",
                "Inserts the write-ahead log failed (count of table inserts, each one batch or a run "
                "of a merged request's batches): the append or the write/fsync that failed, and every insert refused "
                "after it until the shard restarts; none was acknowledged (see apexrl_replay_wal_failed)",
                s.wal_failures,
            ),
        ):
            yield CounterMetricFamily(f"apexrl_replay_{name}", doc, value=value)
        for name, doc, value in (
            (
                "last_checkpoint_timestamp_seconds",
                "Unix time at which the last checkpoint became durable (0: none yet)",
                s.last_checkpoint_unix_seconds,
            ),
            ("last_checkpoint_bytes", "Size of the last checkpoint file", s.last_checkpoint_bytes),
            (
                "last_checkpoint_duration_seconds",
                "Time the last checkpoint took, from its snapshot to durable",
                s.last_checkpoint_seconds,
            ),
            ("last_checkpoint_rows", "Rows in the last checkpoint", s.last_checkpoint_rows),
            (
                "restore_duration_seconds",
                "Time the start-up restore took (checkpoint and write-ahead log)",
                s.restore_seconds,
            ),
            ("restored_rows", "Rows restored at start (checkpoint and write-ahead log)", s.restored_rows),
            ("wal_replayed_rows", "Rows replayed from the write-ahead log at start", s.wal_replayed_rows),
            (
                "wal_failed",
                "Whether the write-ahead log has failed (0 or 1): at 1 the shard refuses every insert "
                "(UNAVAILABLE), reports gRPC health NOT_SERVING and must be restarted, which replays the log",
                s.wal_failed,
            ),
        ):
            yield GaugeMetricFamily(f"apexrl_replay_{name}", doc, value=value)

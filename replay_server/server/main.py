"""`apexrl replay`: run one replay shard until SIGTERM or Ctrl-C. With --checkpoint-dir it restores its newest
good checkpoint first (gRPC health NOT_SERVING until then), checkpoints without stopping (periodically, on the
Checkpoint RPC, and once more after SIGTERM) and, with --wal, acknowledges only logged inserts. It holds its
directories for as long as it runs: a second shard given one of them is refused (exit status 2)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from apexrl.common.serving import Serving
from apexrl.replay_server.durability.durability_metrics import DurabilityCollector, DurabilityStats
from apexrl.replay_server.server.config import ReplayConfig

if TYPE_CHECKING:
    from apexrl.replay_server.core.table import ReplayTable

log = logging.getLogger("apexrl.replay")

CONFIG = ReplayConfig
HELP = "run one prioritized replay shard (gRPC ReplayService)"


def metrics_registry(table: ReplayTable, durability: DurabilityStats | None = None) -> CollectorRegistry:
    """The shard's registry before create_replay_server adds the servicer's and table's metrics: the time the
    rate limiter held calls back (read from the table at scrape time), checkpoints and write-ahead log."""
    registry = CollectorRegistry()
    registry.register(_BlockedTimeCollector(table))
    registry.register(DurabilityCollector(durability if durability is not None else DurabilityStats()))
    return registry


class _BlockedTimeCollector:
    def __init__(self, table: ReplayTable) -> None:
        self._table = table

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            "apexrl_replay_rate_limiter_blocked_seconds",
            "Seconds during which calls were held back by the rate limiter (samples: also below "
            "min_size_to_sample), by call (insert, sample); concurrent waiters count once, so the rate is the "
            "fraction of time that side was blocked",
            labels=["call"],
        )
        for call, seconds in self._table.blocked_seconds().items():
            family.add_metric([call], seconds)
        yield family


def run(config: ReplayConfig, stop: threading.Event) -> int:
    from apexrl.replay_server.durability.directory_lock import lock_directories

    # Before anything is read or written there: another shard's files are never touched.
    locks = lock_directories((("--checkpoint-dir", config.checkpoint_dir), ("--wal", config.wal)))
    try:
        return _serve(config, stop)
    finally:
        for lock in locks:
            lock.release()


def _serve(config: ReplayConfig, stop: threading.Event) -> int:
    from apexrl.replay_server.core.table import ReplayTable
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(config)
    durability = _Durability.of(config, table)
    shard = create_replay_server(
        table,
        config.address(),
        registry=metrics_registry(table, durability.stats),
        max_message_bytes=config.max_message_bytes,
        tls=config.tls(),
        access=config.access(),
        quotas=config,
        connections=config,
        limits=config,
        max_request_bytes=config.max_request_bytes,
        health_address=config.health_address(),
        serving=durability.checkpointer is None,
        checkpointer=durability.checkpointer,
        wal=durability.wal,
    )
    serving = Serving(shard.server, shard.port, config, shard.registry, log).announce(
        "replay shard", _table_line(config)
    )
    durability.restore_and_start(shard.server)
    serving.until_stopped(stop, before_stop=table.close)
    durability.close()
    _log_stopped(table)
    return 0


def _table_line(config: ReplayConfig) -> str:
    """The table's part of the start line."""
    return (
        f"capacity {config.capacity}"
        + ("" if config.max_bytes is None else f" rows or {config.max_bytes} bytes")
        + f", alpha {config.alpha:.2f}, signature {config.signature or 'from first insert'}"
    )


def _log_stopped(table: ReplayTable) -> None:
    info = table.info()
    log.info(
        "replay shard stopped: %d rows held, %d inserted, %d sampled; %d bytes held (%.0f per row), "
        "signature %s",
        info.size,
        info.inserted_total,
        info.sampled_total,
        info.stored_bytes,
        info.stored_bytes / max(1, info.size),
        info.signature,
    )


class _Durability:
    """The shard's checkpointer and write-ahead log, when its settings ask for them: built refusing calls until
    the restore, restored (health NOT_SERVING meanwhile) before the shard serves, closed after it stopped."""

    def __init__(self, config: ReplayConfig, table: ReplayTable, checkpointer, wal, stats: DurabilityStats):
        self.config, self.table, self.checkpointer, self.wal, self.stats = (
            config,
            table,
            checkpointer,
            wal,
            stats,
        )

    @classmethod
    def of(cls, config: ReplayConfig, table: ReplayTable) -> _Durability:
        from apexrl.replay_server.durability.checkpointer import Checkpointer
        from apexrl.replay_server.durability.wal import WriteAheadLog

        stats = DurabilityStats()
        if config.checkpoint_dir is None:
            return cls(config, table, None, None, stats)
        wal = WriteAheadLog(config.wal, stats) if config.wal is not None else None
        checkpointer = Checkpointer(
            table,
            config.checkpoint_dir,
            keep=config.checkpoint_keep,
            every=config.checkpoint_every,
            max_mb_per_s=config.checkpoint_max_mb_per_s,
            stats=stats,
            on_written=None if wal is None else wal.truncate,
        )
        table.refuse_calls("the shard is restoring its checkpoint")
        return cls(config, table, checkpointer, wal, stats)

    def restore_and_start(self, server) -> None:
        """Restore, then serve (health SERVING) and checkpoint periodically; a failed restore stops the server."""
        if self.checkpointer is None:
            return
        try:
            _restore(self.table, self.checkpointer, self.wal, self.config)
        except BaseException:
            server.stop(0).wait()
            raise
        self.table.refuse_calls(None)
        server.set_serving()
        self.checkpointer.start()

    def close(self) -> None:
        """The last checkpoint (at SIGTERM), then the log."""
        if self.checkpointer is not None:
            self.checkpointer.close(final=True)
        if self.wal is not None:
            self.wal.close()


def _restore(table, checkpointer, wal, config: ReplayConfig) -> None:
    """Restore the newest good checkpoint, then replay the write-ahead log past it (health NOT_SERVING
    meanwhile), and start logging."""
    log.info("restoring from %s (health NOT_SERVING until done)", config.checkpoint_dir)
    start = time.monotonic()
    state = checkpointer.restore()
    if state is None:
        log.info(
            "no checkpoint in %s: the shard starts %s",
            config.checkpoint_dir,
            "empty" if wal is None else "from its write-ahead log alone",
        )
    if wal is not None:
        wal.replay(table, restored=state is not None)
        wal.open(table)
        stats = checkpointer.stats
        stats.restore_seconds, stats.restored_rows = time.monotonic() - start, table.info().size

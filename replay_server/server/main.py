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

from apexrl.common import grpc_util
from apexrl.common.access import AccessPolicy, describe_access
from apexrl.common.addresses import join_host_port
from apexrl.common.files import atomic_write
from apexrl.common.metrics import serve_metrics
from apexrl.common.tls import describe, tls_of
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
    from apexrl.replay_server.durability.checkpointer import Checkpointer
    from apexrl.replay_server.durability.wal import WriteAheadLog
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(config)
    stats = DurabilityStats()
    checkpointer = wal = None
    if config.checkpoint_dir is not None:
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
    tls = tls_of(config, serves=True)
    shard = create_replay_server(
        table,
        join_host_port(config.host, config.port),
        registry=metrics_registry(table, stats),
        max_message_bytes=config.max_message_bytes,
        tls=tls,
        access=AccessPolicy.from_settings(config.token, config.role_tokens, config.certificate_roles),
        quotas=config,
        connections=config,
        health_address=None
        if config.health_port is None
        else join_host_port(config.host, config.health_port),
        serving=checkpointer is None,
        checkpointer=checkpointer,
        wal=wal,
    )
    server, port, registry = shard.server, shard.port, shard.registry
    metrics = serve_metrics(registry, config.metrics_port, config.host)
    log.info(
        "replay shard serving on %s:%d (capacity %d%s, alpha %.2f, signature %s, %s, %s%s); metrics %s",
        config.host,
        port,
        config.capacity,
        "" if config.max_bytes is None else f" rows or {config.max_bytes} bytes",
        config.alpha,
        config.signature or "from first insert",
        describe_access(config),
        describe(tls),
        "" if server.health_port is None else f", plaintext health on port {server.health_port}",
        metrics,
    )
    if config.port_file:
        atomic_write(config.port_file, f"{port}\n")
    if checkpointer is not None:
        try:
            _restore(table, checkpointer, wal, config)
        except BaseException:
            server.stop(0).wait()
            raise
        table.refuse_calls(None)
        server.set_serving()
        checkpointer.start()
    grpc_util.serve_until(stop, server, before_stop=table.close)
    if checkpointer is not None:
        checkpointer.close(final=True)
    if wal is not None:
        wal.close()
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
    return 0


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

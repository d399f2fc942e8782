"""The replay table's metrics, read from the table at scrape time (`apexrl_replay_*`): the hot path keeps one set
of counters, the table's own. The servicer's per-RPC metrics are common/metrics.py's RpcMetrics.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from apexrl.replay_server.core.table import ReplayTable


class TableCollector:
    """Exports the table's own counters at scrape time, so the hot path keeps a single set of counters."""

    def __init__(self, table: ReplayTable) -> None:
        self._table = table

    def describe(self):
        return []

    def collect(self):
        info = self._table.info()
        for name, doc, value in (
            ("inserted_rows", "Rows stored (resent duplicates not counted)", info.inserted_total),
            (
                "inserted_bytes",
                "Bytes of row data stored (compressed fields as their frames)",
                info.inserted_bytes_total,
            ),
            ("evicted_rows", "Rows overwritten by FIFO eviction", info.evicted_total),
            ("sampled_rows", "Rows returned by Sample", info.sampled_total),
            ("priority_updates", "Priority updates applied", info.updated_total),
            (
                "stale_priority_updates",
                "Priority updates ignored: key evicted, unknown or of another incarnation",
                info.stale_updates_total,
            ),
            (
                "duplicate_batches",
                "Resent batches acknowledged without storing",
                info.duplicate_batches_total,
            ),
        ):
            yield CounterMetricFamily(f"apexrl_replay_{name}", doc, value=value)
        for name, doc, value in (
            ("size_rows", "Rows held", info.size),
            ("capacity_rows", "Rows the table can hold", info.capacity),
            (
                "stored_bytes",
                "Bytes of row data held, compressed fields as stored (divided by size_rows: bytes per "
                "stored row)",
                info.stored_bytes,
            ),
            (
                "max_bytes",
                "Bytes of row data the table holds at most (setting max_bytes; 0: no limit but the "
                "capacity in rows)",
                info.max_bytes,
            ),
            ("total_priority", "Sum of stored priorities (p**alpha)", info.total_priority),
            ("min_priority", "Smallest positive stored priority (p**alpha)", info.min_priority),
            ("max_priority", "Largest raw priority seen", info.max_priority),
        ):
            yield GaugeMetricFamily(f"apexrl_replay_{name}", doc, value=value)

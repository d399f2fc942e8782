"""Result rows: one figure with its unit, the raw gRPC ceiling of the same shape, ratio, target and the CPU
both processes used; `Results` keeps them in order under stable keys (the JSON's `figures`); `print_rows`
prints them as the table."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from harness.report import format_rate, progress, render_table
from harness.timing import Measurement

CEILING_SECTION = "raw gRPC ceilings (bytes-only server, same message sizes)"
HEADERS = (
    "figure",
    "value",
    "unit",
    "MB/s",
    "ceiling",
    "ratio",
    "target",
    "met",
    "cores cli+srv",
    "CPU us/call cli/srv",
)


@dataclass
class Row:
    section: str
    name: str
    value: float  # the figure, in `unit`
    unit: str
    mb_per_s: float | None = None  # payload (row data) MB/s, 1 MB = 1e6 bytes
    ceiling: float | None = None  # the raw gRPC figure of the same shape and message size, in `unit`
    ceiling_name: str | None = None
    ratio: float | None = None  # value / ceiling
    target: float | None = None
    target_text: str | None = None
    met: bool | None = None
    calls: int = 0
    seconds: float = 0.0
    client_cpu: float | None = None  # cores used by this (client) process during the figure, warm-up included
    server_cpu: float | None = None  # cores used by the server process during the figure
    note: str = ""
    # The same call shape against the bytes-only handlers on grpc.aio, the shard's own runtime (issue 32, item 4):
    # that ceiling's key in `Results.by_key`, value / its value, and the share the issue asks for.
    aio_ceiling_key: str | None = None
    aio_ratio: float | None = None
    aio_target: float | None = None
    aio_met: bool | None = None

    def compare(
        self,
        ceiling: float | None,
        ceiling_name: str | None = None,
        target: float | None = None,
        target_text: str | None = None,
        ratio_target: float | None = None,
    ) -> None:
        """Set the ceiling (and ratio) and the target (and whether it is met): an absolute `target` in the
        figure's unit, or a `ratio_target` that the ratio to the ceiling must reach."""
        if ceiling:
            self.ceiling, self.ceiling_name, self.ratio = ceiling, ceiling_name, self.value / ceiling
        if target is not None:
            self.target, self.met = target, self.value >= target
            self.target_text = target_text or f">= {target:,}"
        if ratio_target is not None and self.ratio is not None:
            self.target, self.met = ratio_target, self.ratio >= ratio_target
            self.target_text = target_text or f">= {ratio_target:.2f}x"

    def compare_aio(self, key: str, ceiling: Row, target: float) -> None:
        """Set the ratio to the grpc.aio ceiling row `ceiling` (stored under `key`) and whether it meets `target`."""
        self.aio_ceiling_key, self.aio_target = key, target
        if ceiling.value > 0:
            self.aio_ratio = self.value / ceiling.value
            self.aio_met = self.aio_ratio >= target

    def server_us_per_call(self) -> float | None:
        """The server's CPU microseconds per call (message, batch), warm-up included; None without a server."""
        if self.server_cpu is None or not self.calls:
            return None
        return self.server_cpu * self.seconds / self.calls * 1e6


class Results:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.by_key: dict[str, Row] = {}

    def figure(
        self,
        key: str,
        section: str,
        name: str,
        m: Measurement,
        unit: str,
        *,
        per_call: int = 1,
        row_bytes: int | None = None,
        ceiling: float | None = None,
        ceiling_name: str | None = None,
        target: float | None = None,
        ratio_target: float | None = None,
        note: str = "",
    ) -> Row:
        """Add a figure measured as `m`: value = calls/s x `per_call` (rows per call for transitions/s)."""
        value = m.rate * per_call
        mb_per_s = None if row_bytes is None else value * row_bytes / 1e6
        row = Row(
            section,
            name,
            value,
            unit,
            mb_per_s=mb_per_s,
            calls=m.calls,
            seconds=m.seconds,
            client_cpu=m.client_cpu,
            server_cpu=m.server_cpu,
            note=note,
        )
        row.compare(ceiling, ceiling_name, target, ratio_target=ratio_target)
        return self.add(key, row)

    def ceiling(self, key: str, name: str, m: Measurement, unit: str, message_bytes: int) -> float:
        """Add a raw gRPC ceiling row; return its rate (messages or calls per second)."""
        self.figure(
            key, CEILING_SECTION, name, m, unit, row_bytes=message_bytes, note=f"message {message_bytes:,} B"
        )
        return m.rate

    def add(self, key: str, row: Row) -> Row:
        self.rows.append(row)
        self.by_key[key] = row
        extra = f", {row.mb_per_s:,.1f} MB/s" if row.mb_per_s is not None else ""
        ratio = f", {row.ratio:.2f} of ceiling" if row.ratio is not None else ""
        progress(f"  {row.name}: {row.value:,.0f} {row.unit}{extra}{ratio}")
        return row


def _cells(row: Row) -> list[str]:
    cpu = per_call = ""
    if row.client_cpu is not None and row.calls:
        cpu = f"{row.client_cpu:.2f}" + ("" if row.server_cpu is None else f"+{row.server_cpu:.2f}")
        per_call = f"{row.client_cpu * row.seconds / row.calls * 1e6:,.0f}"
        if row.server_cpu is not None:
            per_call += f"/{row.server_cpu * row.seconds / row.calls * 1e6:,.0f}"
    mb_per_s = "" if row.mb_per_s is None else f"{row.mb_per_s:,.1f}"
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
    met = "" if row.met is None else ("yes" if row.met else "NO")
    return [
        row.name,
        format_rate(row.value),
        row.unit,
        mb_per_s,
        format_rate(row.ceiling),
        ratio,
        row.target_text or "",
        met,
        cpu,
        per_call,
    ]


def print_rows(results: Results, file=sys.stdout) -> None:
    """The apexrl (and cpprb) figures grouped by section, then the raw ceilings they refer to."""
    ordered = [r for r in results.rows if r.section != CEILING_SECTION]
    ordered += [r for r in results.rows if r.section == CEILING_SECTION]
    lines: list[list[str] | str] = []
    section = None
    for row in ordered:
        if row.section != section:
            section = row.section
            lines.append(f"-- {section}")
        lines.append(_cells(row))
    for line in render_table(HEADERS, lines, left={0, 2, 6, 7}):
        print(line, file=file)


AIO_HEADERS = (
    "figure",
    "value",
    "grpc.aio ceiling",
    "ratio",
    "target",
    "met",
    "server CPU us/call: figure / ceiling",
)


def print_aio_rows(results: Results, file=sys.stdout) -> None:
    """The figures compared with the grpc.aio ceiling of the same shape (issue 32, item 4), if any were."""
    compared = [row for row in results.rows if row.aio_ceiling_key is not None]
    if not compared:
        return
    lines: list[list[str] | str] = [
        "-- against grpc.aio's own ceiling (the same bytes-only handlers on the shard's runtime)"
    ]
    for row in compared:
        ceiling = results.by_key[row.aio_ceiling_key]
        figure_us, ceiling_us = row.server_us_per_call(), ceiling.server_us_per_call()
        lines.append(
            [
                row.name,
                format_rate(row.value),
                format_rate(ceiling.value),
                "" if row.aio_ratio is None else f"{row.aio_ratio:.2f}",
                f">= {row.aio_target:.2f}x",
                "" if row.aio_met is None else ("yes" if row.aio_met else "NO"),
                f"{figure_us or 0:,.0f} / {ceiling_us or 0:,.0f}",
            ]
        )
    for line in render_table(AIO_HEADERS, lines, left={0, 4, 5}):
        print(line, file=file)

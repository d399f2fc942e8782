"""Progress lines, plain-text tables, the load-average footer, run metadata and JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence

_T0 = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the run started."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def format_rate(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def render_table(headers: Sequence[str], lines: Sequence[Sequence[str] | str], left: set[int]) -> list[str]:
    """Columns padded to their widest cell, left-aligned where listed in `left`, right-aligned otherwise; a
    line given as a string (a section title) is printed as it is."""
    cells = [line for line in lines if not isinstance(line, str)]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    out = [fmt(headers), "  ".join("-" * w for w in widths)]
    out += [line if isinstance(line, str) else fmt(line) for line in lines]
    return out


def autogroup() -> str | None:
    """This process's scheduler autogroup and its nice value when autogroups are on (then `nice` only ranks
    processes within the group; `echo -10 > /proc/$$/autogroup` ranks the group against other sessions)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return None
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def load_line(
    before: float, after: float, *, show_autogroup: bool = False, nice_label: str = "niceness"
) -> str:
    """The footer line with the 1-minute load average before and after the run, flagging a busy machine."""
    group = autogroup() if show_autogroup else None
    return (
        f"Load average (1 min) before / after: {before:.2f} / {after:.2f} on {os.cpu_count()} CPUs"
        + ("  ** other processes were busy: figures are disturbed **" if max(before, after) > 1.5 else "")
        + (f"; {nice_label} {os.nice(0)}" if os.nice(0) else "")
        + (f"; scheduler autogroup {group}" if group else "")
    )


def metadata(args: argparse.Namespace) -> dict:
    """Versions, machine and arguments of this run."""
    import grpc
    import numpy as np

    meta = {
        "argv": sys.argv,
        "args": vars(args),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "nice": os.nice(0),
    }
    with contextlib.suppress(ImportError):
        import google.protobuf

        meta["protobuf"] = google.protobuf.__version__
    with contextlib.suppress(OSError):
        meta["git"] = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    return meta


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
    progress(f"wrote {path}")

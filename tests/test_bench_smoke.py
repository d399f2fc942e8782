"""The benchmark script runs end to end in its quick mode and reports every figure with its ceiling (no timing
is asserted: speed is measured in bench/, never in tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "replay_bench.py"


@pytest.mark.timeout(300)
def test_replay_bench_quick_mode_reports_figures(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)], check=True, timeout=240,
                   capture_output=True, text=True)
    figures = json.loads(out.read_text())["figures"]
    for key in ("grpc_insert_cartpole_256", "ceiling_stream_cartpole_256"):
        assert figures[key]["value"] > 0, key
    # Every apexrl figure over gRPC is reported next to its raw-gRPC ceiling, as a ratio.
    compared = [f for f in figures.values() if f["ceiling"] is not None]
    assert len(compared) >= 6
    for f in compared:
        assert f["value"] > 0 and f["ratio"] == f["value"] / f["ceiling"], f["name"]

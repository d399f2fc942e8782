"""The Grafana dashboards: the committed JSON is what monitoring/grafana/build.py builds (like the generated
protobuf code), it has the structure Grafana 11 imports, every required row is there, and every PromQL
expression parses (promtool checks them as recording rules)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.unit.monitoring.expressions import DASHBOARDS, dashboard_expressions
from tests.unit.monitoring.tools import load_script, needs_promtool, promtool

ROWS = [
    "Fleet",
    "Replay shards",
    "Learner",
    "Episode return",
    "Weights",
    "RPC latency",
    "Where the time goes",
    "Queues (flow control)",
]


def test_committed_files_are_what_the_generator_builds():
    build = load_script("monitoring/grafana/build.py")
    assert build.main(["--check"]) == 0, "run .venv/bin/python monitoring/grafana/build.py"
    assert {p.name for p in DASHBOARDS.glob("*.json")} == set(build.dashboards())


DPG_ROWS = ["Critic and policy", "Actions and exploration", "Returns and pace"]


@pytest.mark.parametrize(("name", "rows"), [("apexrl-fleet", ROWS), ("apexrl-dpg", DPG_ROWS)])
def test_each_dashboard_has_every_row_and_importable_panels(name, rows):
    dashboard = json.loads((DASHBOARDS / f"{name}.json").read_text())
    assert dashboard["uid"] == name and dashboard["schemaVersion"] == 41
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    panels = dashboard["panels"]
    assert [p["title"] for p in panels if p["type"] == "row"] == rows
    assert panels[0]["type"] == "row"  # every panel sits in a row
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat") and panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids == [chr(ord("A") + i) for i in range(len(ref_ids))], panel["title"]
        for target in panel["targets"]:
            assert target["expr"] and "legendFormat" in target, panel["title"]
    # Positions tile the 24-column grid without overlap.
    cells = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area


def test_latency_rows_use_histogram_quantiles_over_the_request_histograms():
    panels = json.loads((DASHBOARDS / "apexrl-fleet.json").read_text())["panels"]
    latency = [t["expr"] for p in panels if "p50 / p99" in p["title"] for t in p["targets"]]
    assert latency and all(e.startswith("histogram_quantile(") and "_bucket{" in e for e in latency)
    assert any("apexrl_replay_request_duration_seconds_bucket" in e for e in latency)
    assert any("apexrl_params_request_duration_seconds_bucket" in e for e in latency)


@needs_promtool
def test_every_dashboard_expression_parses(tmp_path):
    expressions = dashboard_expressions()
    assert len(expressions) >= 30
    for e in expressions:
        assert "$" not in e.query, f"unfilled variable in {e.where}: {e.query}"
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:expr:{i}", "expr": e.query} for i, e in enumerate(expressions)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"SUCCESS: {len(expressions)} rules found", result.stdout)

"""docs/metrics.md is generated from the roles' own registries (scripts/metrics_doc.py) and up to date, and it
documents every series with its type, unit, labels and meaning."""

from __future__ import annotations

from tests.unit.monitoring.expressions import rules
from tests.unit.monitoring.tools import load_script


def test_the_committed_reference_is_what_the_code_defines():
    doc = load_script("scripts/metrics_doc.py")
    assert doc.main(["--check"]) == 0, "run .venv/bin/python scripts/metrics_doc.py"


def test_every_family_of_every_role_is_documented_with_type_unit_labels_and_meaning():
    doc = load_script("scripts/metrics_doc.py")
    metrics = doc.collect_metrics()
    text = doc.OUT.read_text()
    for metric in metrics.values():
        assert metric.help, metric.family
        assert f"| `{metric.series[0]}`" in text, metric.family
    blocked = metrics["apexrl_replay_rate_limiter_blocked_seconds"]
    assert (blocked.kind, blocked.unit, blocked.labels, blocked.jobs) == (
        "counter",
        "seconds",
        {"call"},
        ["apexrl-replay"],
    )
    latency = metrics["apexrl_replay_request_duration_seconds"]
    assert latency.kind == "histogram" and latency.labels == {"method"}
    assert latency.series == [
        "apexrl_replay_request_duration_seconds_bucket",
        "apexrl_replay_request_duration_seconds_sum",
        "apexrl_replay_request_duration_seconds_count",
    ]
    # The hosted parameter service's series come from the learner's process as well as from `apexrl params`.
    assert metrics["apexrl_params_current_version"].jobs == ["apexrl-learner", "apexrl-params"]
    assert metrics["apexrl_actor_weight_version"].jobs == ["apexrl-actor", "apexrl-evaluator"]
    for rule in rules():
        assert (rule.get("record") or rule["alert"]) in text

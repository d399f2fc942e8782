"""monitoring/prometheus/rules.yml: valid for promtool, its unit tests pass (each alert fires on the series it is
about and stays quiet on healthy neighbours), every alert has the shape the end-to-end test relies on, and every
series and job it names exists: in the code's metric registries and in the launcher's file-SD labels."""

from __future__ import annotations

import pytest
import yaml

from apexrl.launcher.prometheus_targets import JOBS, PARAMS_JOB
from tests.unit.monitoring.expressions import (
    RULES,
    alert_without_comparison,
    all_expressions,
    job_names,
    rules,
    series_names,
)
from tests.unit.monitoring.tools import ROOT, load_script, needs_promtool, promtool

# What issue 7 asks the alerts to cover -> the alert that does.
REQUIRED_ALERTS = {
    "a shard down": "ApexrlReplayShardDown",
    "the learner stalled": "ApexrlLearnerStalled",
    "actors not inserting": "ApexrlActorNotInserting",
    "replay not growing": "ApexrlReplayNotGrowing",
    "a high stale-update ratio": "ApexrlHighStaleUpdateRatio",
    "actors' weight version lagging": "ApexrlActorWeightVersionLag",
    "the rate limiter blocking": "ApexrlRateLimiterBlocking",
    "a failed write-ahead log": "ApexrlReplayWriteAheadLogFailed",
    "a checkpoint set aside at start, corrupt or invalid (issue 16)": "ApexrlReplayCheckpointSetAside",
    "a gap in the write-ahead log's replay (issue 16)": "ApexrlReplayWriteAheadLogGap",
    "a TLS certificate near its expiry (issue 16)": "ApexrlCertificateExpiresIn7Days",
    "a TLS certificate about to expire (issue 16)": "ApexrlCertificateExpiresIn1Day",
}


@needs_promtool
def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_fire_and_stay_quiet_as_written():
    result = promtool("test", "rules", "monitoring/prometheus/rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = yaml.safe_load((ROOT / "monitoring/prometheus/rules_test.yml").read_text())["tests"]
    cases = [case for test in tested for case in test.get("alert_rule_test", [])]
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    # Every alert is tested both firing (expected alerts) and not firing (an empty expectation).
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts


def test_every_required_condition_has_an_alert_with_severity_and_text():
    by_name = {rule["alert"]: rule for rule in rules() if "alert" in rule}
    assert set(REQUIRED_ALERTS.values()) <= set(by_name)
    for name, rule in by_name.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule.get("for"), f"{name} fires on a single evaluation"


def test_alerts_compare_one_expression_with_a_number():
    assert alert_without_comparison('up{job="apexrl-replay"} == 0') == 'up{job="apexrl-replay"} == bool 0'
    assert alert_without_comparison("a:b:c > 0.9") == "a:b:c > bool 0.9"
    with pytest.raises(ValueError):
        alert_without_comparison("a > b")
    for rule in rules():
        if "alert" in rule:
            alert_without_comparison(rule["expr"])  # raises when an alert does not have the shape


def test_every_series_named_by_a_rule_or_dashboard_is_exported_by_the_code():
    exported = load_script("scripts/metrics_doc.py").exported_series()
    missing = {}
    for expression in all_expressions():
        unknown = series_names(expression.expr) - exported
        if unknown:
            missing[expression.where] = sorted(unknown)
    assert not missing, missing


def test_jobs_named_by_rules_and_dashboards_are_the_launchers_labels():
    known = set(JOBS.values()) | {PARAMS_JOB}
    named = set().union(*(job_names(e.expr) for e in all_expressions()))
    assert named <= known, named - known
    assert set(JOBS.values()) <= named  # every role the launcher labels is watched


def test_the_prometheus_operator_rule_wraps_exactly_these_groups():
    build = load_script("monitoring/grafana/build.py")
    doc = yaml.safe_load(build.PROMETHEUS_RULE.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]

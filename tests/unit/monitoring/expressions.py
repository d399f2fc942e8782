"""Every PromQL expression the project ships, collected from the committed files themselves: the dashboards' JSON
(monitoring/grafana/dashboards/*.json) and the rules (monitoring/prometheus/rules.yml). Shared by the unit tests
(parse, names) and the end-to-end test (run against a live fleet)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "monitoring" / "grafana" / "dashboards"
RULES = ROOT / "monitoring" / "prometheus" / "rules.yml"
# Grafana's built-in interval variables, as Grafana would fill them in for a 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "20s", "$__interval": "2s", "$__range": "5m"}
# An alert is `<expression> <comparison> <number>`; the expression without its comparison must return data.
_ALERT = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<rhs>-?[0-9]+(?:\.[0-9]+)?)$", re.DOTALL)


@dataclass(frozen=True)
class Expression:
    where: str  # "dashboard apexrl-fleet.json / Loss / A", "rule job:...", "alert ApexrlLearnerStalled"
    expr: str  # as written
    query: str  # what to run in Prometheus: variables filled in, an alert's comparison turned into `bool`


def _fill(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def dashboard_expressions() -> list[Expression]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append(
                    Expression(
                        f"dashboard {path.name} / {panel['title']} / {target['refId']}",
                        target["expr"],
                        _fill(target["expr"]),
                    )
                )
    return found


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alert_without_comparison(expr: str) -> str:
    """`A > 0.9` -> `A > bool 0.9`: every series of A, valued 0 or 1, instead of only those past the threshold."""
    match = _ALERT.match(" ".join(expr.split()))
    if match is None:
        raise ValueError(f"alert expression is not '<expression> <comparison> <number>': {expr!r}")
    return f"{match['lhs']} {match['op']} bool {match['rhs']}"


def rule_expressions() -> list[Expression]:
    found = []
    for rule in rules():
        if "record" in rule:
            found.append(Expression(f"rule {rule['record']}", rule["expr"], rule["expr"]))
        else:
            found.append(
                Expression(f"alert {rule['alert']}", rule["expr"], alert_without_comparison(rule["expr"]))
            )
    return found


def all_expressions() -> list[Expression]:
    return dashboard_expressions() + rule_expressions()


def series_names(expr: str) -> set[str]:
    """apexrl_* series an expression reads (recording rules' names, which hold a colon, excluded)."""
    return {name for name in re.findall(r"(?<![\w:])apexrl_[a-z0-9_]+(?![\w:])", expr)}


def job_names(expr: str) -> set[str]:
    """Job label values an expression selects (`job="x"` or the alternatives of `job=~"x|y"`)."""
    names = set()
    for value in re.findall(r'job=~?"([^"]*)"', expr):
        names.update(part for part in value.split("|") if part and ".+" not in part and "*" not in part)
    return names

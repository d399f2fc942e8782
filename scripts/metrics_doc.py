"""Write docs/metrics.md, the reference of every Prometheus series apexrl exports (name, type, unit, labels,
meaning, which jobs export it) and of the rules in monitoring/prometheus/rules.yml, from the code itself: each
role's registry is built as its process builds it (servers bind 127.0.0.1 port 0 for a moment and stop), and the
metadata is read back from the registry, so the reference cannot drift from the code.

    .venv/bin/python scripts/metrics_doc.py           # regenerate docs/metrics.md
    .venv/bin/python scripts/metrics_doc.py --check   # exit 1 when docs/metrics.md is stale (CI runs this)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from apexrl.common.files import write_or_check
from apexrl.common.metrics import add_process_metrics

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "metrics.md"
RULES = ROOT / "monitoring" / "prometheus" / "rules.yml"


# --- each role's registry, built by the role's own code ------------------------------------------------------------


def replay_registry() -> CollectorRegistry:
    """`apexrl replay`: replay_server/server/main.py's registry, completed by create_replay_server."""
    from apexrl.replay_server.core.table import ReplayTable, TableConfig
    from apexrl.replay_server.server.main import metrics_registry
    from apexrl.replay_server.server.service import create_replay_server

    table = ReplayTable(TableConfig(capacity=1))
    shard = create_replay_server(table, "127.0.0.1:0", registry=metrics_registry(table))
    shard.server.stop(0).wait(10)
    return shard.registry


def params_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """`apexrl params`, and the parameter service a learner hosts."""
    from apexrl.parameter_server.service import create_parameter_server

    registry = registry if registry is not None else CollectorRegistry()
    create_parameter_server("127.0.0.1:0", registry=registry).server.stop(None)
    return registry


def learner_registry() -> CollectorRegistry:
    """`apexrl learner`: its own metrics and those of the parameter service it hosts."""
    from apexrl.learner.learner_metrics import LearnerMetrics

    registry = CollectorRegistry()
    LearnerMetrics(registry)
    return params_registry(registry)


def actor_registry() -> CollectorRegistry:
    """`apexrl actor` (with --evaluate: the evaluator, same metrics)."""
    from apexrl.actor.apex_actor import ActorMetrics

    registry = CollectorRegistry()
    ActorMetrics(registry)
    return registry


# Prometheus job label (as `apexrl launch` writes it in its file-SD file) -> the registry of that process.
JOBS: dict[str, Callable[[], CollectorRegistry]] = {
    "apexrl-replay": replay_registry,
    "apexrl-learner": learner_registry,
    "apexrl-params": params_registry,
    "apexrl-actor": actor_registry,
    "apexrl-evaluator": actor_registry,
}
SECTIONS = [  # metric name prefix -> section title
    ("apexrl_replay_", "Replay shards"),
    ("apexrl_learner_", "Learner"),
    ("apexrl_params_", "Parameter service (hosted by the learner, or standalone)"),
    ("apexrl_actor_", "Actors and the evaluator"),
    ("apexrl_tls_", "TLS certificates (every process that serves or dials TLS)"),
    ("apexrl_refused_", "Refused calls (every process that serves)"),
]


# --- metadata -------------------------------------------------------------------------------------------------------


@dataclass
class MetricDoc:
    family: str  # the family name; counters are exposed as family + "_total"
    kind: str
    help: str
    labels: set[str] = field(default_factory=set)
    jobs: list[str] = field(default_factory=list)

    @property
    def series(self) -> list[str]:
        """The names PromQL queries use."""
        if self.kind == "counter":
            return [f"{self.family}_total"]
        if self.kind == "histogram":
            return [f"{self.family}_bucket", f"{self.family}_sum", f"{self.family}_count"]
        return [self.family]

    @property
    def unit(self) -> str:
        name = self.family
        for suffix, unit in (
            ("_seconds", "seconds"),
            ("_bytes", "bytes"),
            ("_rows", "rows"),
            ("_batches", "batches"),
            ("_per_second", "1/s"),
            ("_version", "version number"),
            ("_versions", "versions"),
            ("_priority", "priority"),
        ):
            if name.endswith(suffix):
                return unit
        if "_return" in name:
            return "return (sum of rewards)"
        return "count" if self.kind == "counter" else "-"


def declared_labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Label names of the registry's metric objects, children created or not (prometheus_client keeps them in
    `_labelnames`; custom collectors' labels are read from their samples instead)."""
    found: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):  # noqa: SLF001 (no public listing of collectors)
        if isinstance(collector, MetricWrapperBase):
            found.setdefault(collector._name, set()).update(collector._labelnames)  # noqa: SLF001
        elif hasattr(
            collector, "label_names"
        ):  # a custom collector that may have no sample yet (TlsExpiryCollector)
            found.setdefault(collector.name, set()).update(collector.label_names)
    return found


def collect_metrics() -> dict[str, MetricDoc]:
    docs: dict[str, MetricDoc] = {}
    for job, build in JOBS.items():
        registry = build()
        add_process_metrics(registry)  # as serve_metrics does in every process
        labels = declared_labels(registry)
        for family in registry.collect():
            doc = docs.setdefault(family.name, MetricDoc(family.name, family.type, family.documentation))
            doc.labels |= labels.get(family.name, set())
            for sample in family.samples:
                doc.labels |= set(sample.labels) - {"le"}
            if job not in doc.jobs:
                doc.jobs.append(job)
    return docs


def exported_series() -> set[str]:
    """Every series name a PromQL expression may use (counters with _total, histograms' _bucket/_sum/_count)."""
    return {name for doc in collect_metrics().values() for name in doc.series}


# --- rendering ------------------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """One table cell: whitespace folded, pipes escaped (GitHub markdown keeps `\\|` as `|`, in code too)."""
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    docs = collect_metrics()
    lines = [
        "# Metrics",
        "",
        "Generated by `python scripts/metrics_doc.py` from the metric definitions in the code (each role's registry,",
        "built as its process builds it); do not edit by hand. Every process serves them at",
        "`http://HOST:METRICS_PORT/metrics` (`--metrics-port`; `apexrl launch` picks free ports and lists them in",
        "`RUN_DIR/prometheus/targets.json`). Rules, alerts and dashboards: `monitoring/`.",
        "",
        "## Target labels",
        "",
        "Prometheus adds these to every series; the rules and dashboards select on `job` and name series by `role`.",
        "",
        "| label | values | set by |",
        "|---|---|---|",
        "| job | "
        + ", ".join(f"`{job}`" for job in JOBS)
        + " | the file-SD file `apexrl launch` writes (Kubernetes: "
        "the ServiceMonitor/PodMonitor relabelling) |",
        "| role | `shard-0`.., `learner`, `actor-0`.., `evaluator` | the same |",
        "| host | the fleet file's machine name (`local` for the local fleet) | the same |",
        "| instance | the scraped `host:port` | Prometheus |",
        "",
        "Types: a *counter* is exposed as `NAME_total` (query it with `rate()`), a *histogram* as `NAME_bucket`",
        "(with `le`), `NAME_sum` and `NAME_count`; latency buckets run from 50 µs to 10 s.",
        "",
    ]
    for prefix, title in SECTIONS:
        members = sorted((d for d in docs.values() if d.family.startswith(prefix)), key=lambda d: d.family)
        if not members:
            continue
        jobs = sorted({job for d in members for job in d.jobs}, key=list(JOBS).index)
        lines += [
            f"## {title}",
            "",
            f"Exported by job {', '.join(f'`{j}`' for j in jobs)}.",
            "",
            "| name | type | unit | labels | meaning |",
            "|---|---|---|---|---|",
        ]
        for d in members:
            name = "<br>".join(f"`{s}`" for s in d.series)
            labels = ", ".join(f"`{label}`" for label in sorted(d.labels)) or "-"
            lines.append(f"| {name} | {d.kind} | {d.unit} | {labels} | {_cell(d.help)} |")
        lines.append("")
    others = sorted(d.family for d in docs.values() if not any(d.family.startswith(p) for p, _ in SECTIONS))
    if others:
        lines += ["## Other", "", ", ".join(f"`{name}`" for name in others), ""]
    lines += render_rules()
    return "\n".join(lines)


def render_rules() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    lines = [
        "## Recording rules (monitoring/prometheus/rules.yml)",
        "",
        "| series | expression |",
        "|---|---|",
    ]
    lines += [f"| `{r['record']}` | `{_cell(r['expr'])}` |" for r in rules if "record" in r]
    lines += [
        "",
        "## Alerts (monitoring/prometheus/rules.yml)",
        "",
        "| alert | severity | fires when | for |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['alert']} | {r['labels']['severity']} | `{_cell(r['expr'])}` | {r.get('for', '0s')} |"
        for r in rules
        if "alert" in r
    ]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail when docs/metrics.md is out of date")
    args = parser.parse_args(argv)
    return write_or_check(OUT, render(), check=args.check, regenerate="python scripts/metrics_doc.py")


if __name__ == "__main__":
    sys.exit(main())

"""Build the Grafana dashboards and the prometheus-operator PrometheusRule from code, so that what is committed is
what this file says.

    .venv/bin/python monitoring/grafana/build.py           # write monitoring/grafana/dashboards/*.json and
                                                           #   k8s/components/prometheus-operator/prometheusrule.yaml
    .venv/bin/python monitoring/grafana/build.py --check   # exit 1 when a committed file is stale (CI runs this)

The dashboards use grafana-foundation-sdk (the `monitoring` extra, pinned: its version decides the JSON schema).
Every query selects targets by the job labels of monitoring/prometheus/rules.yml (apexrl-replay, apexrl-learner,
apexrl-params, apexrl-actor, apexrl-evaluator) and names series by their `role` label (shard-0, learner, actor-3,
evaluator); `apexrl launch` writes a file-SD file with those labels (RUN_DIR/prometheus/targets.json).
tests/e2e/test_prometheus.py runs every expression found in the JSON against a real fleet and requires data.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "monitoring" / "grafana" / "dashboards"
RULES = ROOT / "monitoring" / "prometheus" / "rules.yml"
PROMETHEUS_RULE = ROOT / "k8s" / "components" / "prometheus-operator" / "prometheusrule.yaml"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
ACTORS = 'job="apexrl-actor"'
ACTORS_AND_EVALUATOR = 'job=~"apexrl-actor|apexrl-evaluator"'
SHARDS = 'job="apexrl-replay"'
LEARNER = 'job="apexrl-learner"'
PARAMS = (
    'job=~"apexrl-learner|apexrl-params"'  # the learner hosts the parameter service unless one runs alone
)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    span: int = 12
    kind: str = "timeseries"  # or "stat"
    stacked: bool = False
    minimum: float | None = 0


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: list[PanelSpec] = field(default_factory=list)


def quantiles(metric: str, selector: str, by: str, what: str) -> tuple[Query, ...]:
    """p50 and p99 of a latency histogram, one series per `by` label value."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"p{round(q * 100)} {what}",
        )
        for q in (0.5, 0.99)
    )


def mean_time(metric: str, selector: str, by: str, legend: str) -> Query:
    """Mean seconds per observation of a histogram over the rate window."""
    group = f"sum by ({by}) " if by else "sum "
    return Query(
        f"{group}(rate({metric}_sum{{{selector}}}[{RATE}])) / {group}(rate({metric}_count{{{selector}}}[{RATE}]))",
        legend,
    )


FLEET = [
    RowSpec(
        "Fleet",
        [
            PanelSpec(
                "Targets up",
                "Scraped processes answering, by job (the file-SD file lists every role).",
                "short",
                (Query('sum by (job) (up{job=~"apexrl-.+"})', "{{job}}"),),
                span=8,
                kind="stat",
            ),
            PanelSpec(
                "Environment steps /s",
                "Steps taken by the exploring actors (training data) and the evaluator.",
                "suffix: steps/s",
                (
                    Query(
                        f"sum by (job) (rate(apexrl_actor_env_steps_total{{{ACTORS_AND_EVALUATOR}}}[{RATE}]))",
                        "{{job}}",
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Rows /s: inserted, sampled, trained",
                "Rows the shards stored and returned, and rows the learner trained on, summed over the fleet.",
                "suffix: rows/s",
                (
                    Query(f"sum(rate(apexrl_replay_inserted_rows_total{{{SHARDS}}}[{RATE}]))", "inserted"),
                    Query(f"sum(rate(apexrl_replay_sampled_rows_total{{{SHARDS}}}[{RATE}]))", "sampled"),
                    Query(f"sum(rate(apexrl_learner_trained_rows_total{{{LEARNER}}}[{RATE}]))", "trained"),
                ),
                span=8,
            ),
            PanelSpec(
                "Environment steps /s per actor",
                "Each actor's pace; an actor held back by the shards' rate limiter slows down here.",
                "suffix: steps/s",
                (
                    Query(
                        f"sum by (role) (rate(apexrl_actor_env_steps_total{{{ACTORS_AND_EVALUATOR}}}[{RATE}]))",
                        "{{role}}",
                    ),
                ),
            ),
            PanelSpec(
                "Replay ratio (rows sampled per row inserted)",
                "Compare with the samples_per_insert setting the shards enforce.",
                "short",
                (
                    Query(
                        f"sum(rate(apexrl_replay_sampled_rows_total{{{SHARDS}}}[{RATE}])) / "
                        f"sum(rate(apexrl_replay_inserted_rows_total{{{SHARDS}}}[{RATE}]))",
                        "sampled / inserted",
                    ),
                ),
            ),
        ],
    ),
    RowSpec(
        "Replay shards",
        [
            PanelSpec(
                "Rows held per shard",
                "Rows stored in each shard (FIFO: flat at capacity once full).",
                "short",
                (
                    Query(f"apexrl_replay_size_rows{{{SHARDS}}}", "{{role}}"),
                    Query(f"sum(apexrl_replay_capacity_rows{{{SHARDS}}})", "capacity, all shards"),
                ),
                span=8,
            ),
            PanelSpec(
                "Total priority per shard",
                "Sum of p**alpha in each shard: the learner draws from each shard in proportion to it.",
                "short",
                (Query(f"apexrl_replay_total_priority{{{SHARDS}}}", "{{role}}"),),
                span=8,
            ),
            PanelSpec(
                "Stale priority updates (share)",
                "Priority updates that arrived after their rows were evicted, "
                "as a share of all updates, per shard.",
                "percentunit",
                (
                    Query(
                        f"rate(apexrl_replay_stale_priority_updates_total{{{SHARDS}}}[{RATE}]) / "
                        f"(rate(apexrl_replay_stale_priority_updates_total{{{SHARDS}}}[{RATE}]) + "
                        f"rate(apexrl_replay_priority_updates_total{{{SHARDS}}}[{RATE}]))",
                        "{{role}}",
                    ),
                ),
                span=8,
            ),
        ],
    ),
    RowSpec(
        "Learner",
        [
            PanelSpec(
                "Updates /s",
                "Gradient updates per second.",
                "suffix: updates/s",
                (
                    Query(
                        f"sum by (role) (rate(apexrl_learner_updates_total{{{LEARNER}}}[{RATE}]))", "{{role}}"
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Loss",
                "Loss of the TD errors in the last update (DQN: importance-weighted Huber loss; DPG: the "
                "critics' squared TD error), sampled every 20 updates.",
                "short",
                (Query(f"apexrl_learner_loss{{{LEARNER}}}", "{{role}}"),),
                span=8,
                minimum=None,
            ),
            PanelSpec(
                "Mean Q",
                "Mean Q-value over the last batch (DQN: every action; DPG: Q(s, pi(s))), sampled every "
                "20 updates.",
                "short",
                (Query(f"apexrl_learner_mean_q{{{LEARNER}}}", "{{role}}"),),
                span=8,
                minimum=None,
            ),
        ],
    ),
    RowSpec(
        "Episode return",
        [
            PanelSpec(
                "Mean return of the last 100 episodes",
                "Per actor (its own epsilon or noise scale) and the greedy evaluator.",
                "short",
                (Query(f"apexrl_actor_mean_episode_return_100{{{ACTORS_AND_EVALUATOR}}}", "{{role}}"),),
                minimum=None,
            ),
            PanelSpec(
                "Last episode return",
                "Return of each actor's most recent episode.",
                "short",
                (Query(f"apexrl_actor_last_episode_return{{{ACTORS_AND_EVALUATOR}}}", "{{role}}"),),
                minimum=None,
            ),
        ],
    ),
    RowSpec(
        "Weights",
        [
            PanelSpec(
                "Weight-version lag per actor",
                "Versions between the newest weights the parameter service holds "
                "and the weights each actor acts with.",
                "short",
                (
                    Query(
                        f"max(apexrl_params_current_version{{{PARAMS}}}) - on () group_right () "
                        f"apexrl_actor_weight_version{{{ACTORS_AND_EVALUATOR}}}",
                        "{{role}}",
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Weight versions",
                "Newest version published by the learner and held by the parameter service.",
                "short",
                (
                    Query(f"apexrl_learner_weight_version{{{LEARNER}}}", "learner published"),
                    Query(f"apexrl_params_current_version{{{PARAMS}}}", "service holds ({{role}})"),
                ),
                span=8,
            ),
            PanelSpec(
                "Weight pulls /s",
                "Actors' Fetch calls by result (newer: weights sent; not_newer: already the "
                "newest), and pulls that failed.",
                "suffix: /s",
                (
                    Query(
                        f"sum by (result) (rate(apexrl_params_fetches_total{{{PARAMS}}}[{RATE}]))",
                        "{{result}}",
                    ),
                    Query(
                        f"sum(rate(apexrl_actor_weight_fetch_failures_total{{{ACTORS_AND_EVALUATOR}}}[{RATE}]))",
                        "failed",
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Staleness of sampled rows (R2D2: items)",
                "Weight versions between the learner's newest weights and the weights "
                "that produced each row it samples (how off-policy the training data is); in an R2D2 fleet "
                "each sampled sequence item, by the version that acted at its first step (the parameter lag "
                "R2D2's stored state suffers from).",
                "short",
                quantiles("apexrl_learner_sampled_row_staleness_versions", LEARNER, "", "versions behind"),
                span=12,
            ),
            PanelSpec(
                "Actor lag at its last pull",
                "Versions each actor's weights were behind the newest when it last pulled.",
                "short",
                (Query(f"apexrl_actor_weight_version_lag_versions{{{ACTORS_AND_EVALUATOR}}}", "{{role}}"),),
                span=12,
            ),
        ],
    ),
    RowSpec(
        "RPC latency",
        [
            PanelSpec(
                "Replay shard requests: p50 / p99 by method",
                "Server-side time per request (per message on streams), waits on the rate limiter included.",
                "s",
                quantiles("apexrl_replay_request_duration_seconds", SHARDS, "method", "{{method}}"),
                span=8,
            ),
            PanelSpec(
                "Parameter service requests: p50 / p99 by method",
                "Server-side time per request (a Fetch streams the whole weights).",
                "s",
                quantiles("apexrl_params_request_duration_seconds", PARAMS, "method", "{{method}}"),
                span=8,
            ),
            PanelSpec(
                "Learner: waiting for a batch, train step (p50 / p99)",
                "Time the train loop waited for a prefetched batch, and one forward/backward/optimiser step.",
                "s",
                quantiles("apexrl_learner_sample_wait_seconds", LEARNER, "", "batch wait")
                + quantiles("apexrl_learner_train_step_seconds", LEARNER, "", "train step"),
                span=8,
            ),
        ],
    ),
    RowSpec(
        "Where the time goes",
        [
            PanelSpec(
                "Learner: share of wall time",
                "Seconds per second the learner spends in train steps and waiting "
                "for sampled batches (the rest: priority updates, publishing, checkpoints).",
                "percentunit",
                (
                    Query(
                        f"sum(rate(apexrl_learner_train_step_seconds_sum{{{LEARNER}}}[{RATE}]))", "train step"
                    ),
                    Query(
                        f"sum(rate(apexrl_learner_sample_wait_seconds_sum{{{LEARNER}}}[{RATE}]))",
                        "waiting for a batch",
                    ),
                ),
                span=8,
                stacked=True,
            ),
            PanelSpec(
                "Replay shards: handler seconds per second by method",
                "Time the shards spend in each RPC "
                "(concurrent calls add up; inserts include rate-limiter waits).",
                "s",
                (
                    Query(
                        f"sum by (method) (rate(apexrl_replay_request_duration_seconds_sum{{{SHARDS}}}[{RATE}]))",
                        "{{method}}",
                    ),
                ),
                span=8,
                stacked=True,
            ),
            PanelSpec(
                "Rate limiter: share of time blocked",
                "Time each shard held inserts (the learner is the "
                "bottleneck) or samples (the learner starves, or replay is below its minimum size) back.",
                "percentunit",
                (
                    Query(
                        f"rate(apexrl_replay_rate_limiter_blocked_seconds_total{{{SHARDS}}}[{RATE}])",
                        "{{role}} {{call}}",
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Mean time per call",
                "Learner train step and batch wait; shard Insert (per batch) and Sample handling.",
                "s",
                (
                    mean_time("apexrl_learner_train_step_seconds", LEARNER, "", "train step"),
                    mean_time("apexrl_learner_sample_wait_seconds", LEARNER, "", "learner batch wait"),
                    mean_time(
                        "apexrl_replay_request_duration_seconds", SHARDS + ', method="Insert"', "", "insert"
                    ),
                    mean_time(
                        "apexrl_replay_request_duration_seconds", SHARDS + ', method="Sample"', "", "sample"
                    ),
                ),
            ),
            PanelSpec(
                "Actors: wall time per environment step",
                "Everything an actor does per step (policy, "
                "environment, handing transitions to the shards, waiting on back pressure).",
                "s",
                (
                    Query(
                        f"1 / sum by (role) (rate(apexrl_actor_env_steps_total{{{ACTORS}}}[{RATE}]))",
                        "{{role}}",
                    ),
                ),
            ),
            PanelSpec(
                "Actors: share of wall time",
                "Seconds per second all exploring actors together spend acting "
                "(policy and environments), handing batches to the shards (back pressure included) and pulling "
                "weights.",
                "percentunit",
                (
                    Query(
                        f"sum(rate(apexrl_actor_act_seconds_total{{{ACTORS}}}[{RATE}])) / "
                        f"count(apexrl_actor_act_seconds_total{{{ACTORS}}})",
                        "acting",
                    ),
                    Query(
                        f"sum(rate(apexrl_actor_send_seconds_total{{{ACTORS}}}[{RATE}])) / "
                        f"count(apexrl_actor_send_seconds_total{{{ACTORS}}})",
                        "sending",
                    ),
                    Query(
                        f"sum(rate(apexrl_actor_pull_seconds_total{{{ACTORS}}}[{RATE}])) / "
                        f"count(apexrl_actor_pull_seconds_total{{{ACTORS}}})",
                        "pulling weights",
                    ),
                ),
                stacked=True,
            ),
        ],
    ),
    RowSpec(
        "Queues (flow control)",
        [
            PanelSpec(
                "Actor insert backlog",
                "Unacknowledged insert batches per actor and shard (bounded at 8: a full "
                "backlog means that shard is slow or down, and the actor writes elsewhere or waits).",
                "short",
                (
                    Query(
                        f"max by (role) (apexrl_actor_insert_backlog_batches{{{ACTORS}}})",
                        "{{role}} (fullest)",
                    ),
                ),
                span=8,
            ),
            PanelSpec(
                "Shard: insert lane and held-back calls",
                "Insert batches waiting for their turn on each shard, "
                "and calls its rate limiter or minimum size holds back.",
                "short",
                (
                    Query(f"apexrl_replay_insert_queue_batches{{{SHARDS}}}", "{{role}} insert lane"),
                    Query(f"apexrl_replay_waiting_calls{{{SHARDS}}}", "{{role}} waiting {{call}}"),
                ),
                span=8,
            ),
            PanelSpec(
                "Learner queues",
                "Prefetched batches waiting for the train step (empty: the learner waits for "
                "data) and priority-update messages in flight to the shards.",
                "short",
                (
                    Query(f"apexrl_learner_prefetch_queue_batches{{{LEARNER}}}", "prefetched batches"),
                    Query(
                        f"apexrl_learner_priority_updates_outstanding{{{LEARNER}}}",
                        "priority updates in flight",
                    ),
                ),
                span=8,
            ),
        ],
    ),
]


# Ape-X DPG's own series (continuous actions); tests/e2e/test_prometheus.py runs these against a Pendulum fleet.
DPG = [
    RowSpec(
        "Critic and policy",
        [
            PanelSpec(
                "Critic loss",
                "The critics' importance-weighted squared TD error in the last update (sampled "
                "every 20 updates).",
                "short",
                (Query(f"apexrl_learner_loss{{{LEARNER}}}", "{{role}}"),),
                span=8,
                minimum=None,
            ),
            PanelSpec(
                "Policy loss",
                "-mean Q(s, pi(s)) in the policy's last update: falls as the policy finds actions "
                "the critic values more.",
                "short",
                (Query(f"apexrl_learner_policy_loss{{{LEARNER}}}", "{{role}}"),),
                span=8,
                minimum=None,
            ),
            PanelSpec(
                "Mean Q(s, pi(s))",
                "The critic's value of the policy's actions over the last batch.",
                "short",
                (Query(f"apexrl_learner_mean_q{{{LEARNER}}}", "{{role}}"),),
                span=8,
                minimum=None,
            ),
        ],
    ),
    RowSpec(
        "Actions and exploration",
        [
            PanelSpec(
                "Policy action mean per dimension",
                "Mean of pi(s) over the last batch, per action dimension "
                "(environment units): a dimension pinned at a bound shows here.",
                "short",
                (Query(f"apexrl_learner_policy_action_mean{{{LEARNER}}}", "dimension {{dimension}}"),),
                span=8,
                minimum=None,
            ),
            PanelSpec(
                "Policy action spread per dimension",
                "Standard deviation of pi(s) over the last batch, per "
                "action dimension: near 0 means the policy ignores the state there.",
                "short",
                (Query(f"apexrl_learner_policy_action_std{{{LEARNER}}}", "dimension {{dimension}}"),),
                span=8,
            ),
            PanelSpec(
                "Noise scale per actor",
                "Standard deviation of each actor's Gaussian action noise, in half "
                "action ranges (Ape-X DPG's per-actor spread).",
                "short",
                (Query(f"apexrl_actor_noise_scale{{{ACTORS}}}", "{{role}}"),),
                span=8,
            ),
        ],
    ),
    RowSpec(
        "Returns and pace",
        [
            PanelSpec(
                "Mean return of the last 100 episodes",
                "Per actor and the greedy (noise-free) evaluator.",
                "short",
                (Query(f"apexrl_actor_mean_episode_return_100{{{ACTORS_AND_EVALUATOR}}}", "{{role}}"),),
                minimum=None,
            ),
            PanelSpec(
                "Updates /s and environment steps /s",
                "Learner updates and exploring actors' steps per second.",
                "suffix: /s",
                (
                    Query(f"sum(rate(apexrl_learner_updates_total{{{LEARNER}}}[{RATE}]))", "updates"),
                    Query(f"sum(rate(apexrl_actor_env_steps_total{{{ACTORS}}}[{RATE}]))", "env steps"),
                ),
            ),
        ],
    ),
]


def build_panel(spec: PanelSpec, panel_id: int):
    if spec.kind == "stat":
        panel = stat.Panel()
    else:
        panel = (
            timeseries.Panel()
            .fill_opacity(10 if spec.stacked else 0)
            .legend(
                common_builders.VizLegendOptions()
                .display_mode(LegendDisplayMode.LIST)
                .placement(LegendPlacement.BOTTOM)
                .show_legend(True)
            )
        )
        if spec.stacked:
            panel = panel.stacking(common_builders.StackingConfig().mode(StackingMode.NORMAL))
    panel = (
        panel.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .span(spec.span)
        .height(8)
    )
    if spec.minimum is not None:
        panel = panel.min(spec.minimum)
    for index, query in enumerate(spec.queries):
        panel = panel.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
    return panel


def build_dashboard(uid: str, title: str, description: str, rows: list[RowSpec]) -> dict:
    dashboard = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["apexrl", "generated"])
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .editable()
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    panel_id = 0
    for row in rows:
        panel_id += 1
        dashboard = dashboard.with_row(Row(row.title).id(panel_id))
        for spec in row.panels:
            panel_id += 1
            dashboard = dashboard.with_panel(build_panel(spec, panel_id))
    return dashboard.build()


def dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    fleet = build_dashboard(
        "apexrl-fleet",
        "apexrl fleet",
        "An apexrl fleet: throughput, replay shards, learner, returns, weights, RPC latency and where the time goes. "
        "Generated by monitoring/grafana/build.py; do not edit by hand.",
        FLEET,
    )
    dpg = build_dashboard(
        "apexrl-dpg",
        "apexrl continuous control (Ape-X DPG)",
        "Ape-X DPG's own series: critic and policy losses, Q of the policy's actions, the policy's actions per "
        "dimension, each actor's noise scale. Use beside the fleet dashboard. Generated by "
        "monitoring/grafana/build.py; do not edit by hand.",
        DPG,
    )
    encode = JSONEncoder(sort_keys=True, indent=2).encode
    return {"apexrl-fleet.json": encode(fleet) + "\n", "apexrl-dpg.json": encode(dpg) + "\n"}


class _BlockStrings(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as YAML block literals, as a person writes them."""


_BlockStrings.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def prometheus_rule() -> str:
    """rules.yml's groups wrapped in a prometheus-operator PrometheusRule."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "apexrl",
            "labels": {"app.kubernetes.io/name": "apexrl", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": {"groups": groups},
    }
    header = (
        "# Generated by monitoring/grafana/build.py from monitoring/prometheus/rules.yml: do not edit by hand.\n"
        "# The rules select targets by job (apexrl-replay, apexrl-learner, apexrl-params, apexrl-actor,\n"
        "# apexrl-evaluator) and name them by role: the scrape configuration must set both labels.\n"
    )
    return header + yaml.dump(doc, Dumper=_BlockStrings, sort_keys=False, width=120, allow_unicode=True)


def outputs() -> dict[Path, str]:
    files = {DASHBOARDS / name: text for name, text in dashboards().items()}
    files[PROMETHEUS_RULE] = prometheus_rule()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a generated file is missing or stale"
    )
    args = parser.parse_args(argv)
    files = outputs()
    if args.check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
        stale += [
            path for path in DASHBOARDS.glob("*.json") if path not in files
        ]  # a dashboard no longer built
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
        if stale:
            print("run: .venv/bin/python monitoring/grafana/build.py", file=sys.stderr)
            return 1
        print(f"monitoring/grafana/build.py: {len(files)} generated files up to date")
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

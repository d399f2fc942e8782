"""The built-in actor's Prometheus metrics (`apexrl_actor_*`, listed in docs/metrics.md): what it did, where its
time went, and its queues (the writer's backlog per shard, read at each scrape)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily


class ActorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.env_steps = Counter("apexrl_actor_env_steps", "Environment steps taken", registry=registry)
        self.episodes = Counter("apexrl_actor_episodes", "Episodes finished", registry=registry)
        self.transitions_sent = Counter(
            "apexrl_actor_transitions_sent",
            "n-step transitions handed to the SDK for insertion",
            registry=registry,
        )
        self.failovers = Counter(
            "apexrl_actor_insert_failovers",
            "Batches sent to another shard because the round-robin shard's backlog was full",
            registry=registry,
        )
        self.fetch_failures = Counter(
            "apexrl_actor_weight_fetch_failures",
            "Weight pulls that failed (the actor kept its weights)",
            registry=registry,
        )
        self.weight_version = Gauge(
            "apexrl_actor_weight_version", "Version of the weights in use", registry=registry
        )
        self.weight_lag = Gauge(
            "apexrl_actor_weight_version_lag_versions",
            "Versions the weights in use were behind "
            "the newest published when the actor last pulled (its policy's staleness)",
            registry=registry,
        )
        self.epsilon = Gauge(
            "apexrl_actor_epsilon",
            "DQN: this actor's exploration rate (probability of a uniformly random action)",
            registry=registry,
        )
        self.noise_scale = Gauge(
            "apexrl_actor_noise_scale",
            "DPG: standard deviation of this actor's Gaussian action noise, in half action ranges",
            registry=registry,
        )
        self.last_return = Gauge(
            "apexrl_actor_last_episode_return", "Return of the last finished episode", registry=registry
        )
        self.mean_return = Gauge(
            "apexrl_actor_mean_episode_return_100", "Mean return of the last 100 episodes", registry=registry
        )
        # Where an actor's time goes (rate() of each is the fraction of wall time spent there).
        self.act_seconds = Counter(
            "apexrl_actor_act_seconds",
            "Time spent choosing actions and stepping the environments",
            registry=registry,
        )
        self.send_seconds = Counter(
            "apexrl_actor_send_seconds",
            "Time spent handing batches to the shards (priorities, encoding, waiting for room in a backlog)",
            registry=registry,
        )
        self.pull_seconds = Counter(
            "apexrl_actor_pull_seconds",
            "Time spent checking for and pulling newer weights",
            registry=registry,
        )
        self.insert_backlog = BacklogCollector(registry)


class BacklogCollector:
    """apexrl_actor_insert_backlog_batches{shard}: read from the writer at each scrape (`source`), so a shard
    that leaves the rotation leaves the metric with it."""

    name = "apexrl_actor_insert_backlog_batches"
    label_names = ("shard",)  # read by scripts/metrics_doc.py

    def __init__(self, registry: CollectorRegistry) -> None:
        self.source: Callable[[], Mapping[str, int]] = dict
        registry.register(self)

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            self.name,
            "Insert batches sent or queued to a shard and not yet acknowledged",
            labels=list(self.label_names),
        )
        for address, batches in self.source().items():
            family.add_metric([address], batches)
        yield family

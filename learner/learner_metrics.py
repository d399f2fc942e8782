"""The learner's Prometheus series, apart from the train loop that sets them, so the loop reads as training and
scripts/metrics_doc.py can build the registry without a model.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from apexrl.common.metrics import LATENCY_BUCKETS, ArrayHistogram

# Policy staleness of sampled rows, in weight versions (one version per `publish_every` updates).
STALENESS_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


class LearnerMetrics:
    """Every series the learner exports (`apexrl_learner_*`), registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.updates = Counter(
            "apexrl_learner_updates",
            "Gradient updates done (a restarted learner continues from its checkpoint's count)",
            registry=registry,
        )
        self.rows_trained = Counter(
            "apexrl_learner_trained_rows", "Sampled rows trained on", registry=registry
        )
        self.updates_per_second = Gauge(
            "apexrl_learner_updates_per_second",
            "Updates per second over the last progress interval",
            registry=registry,
        )
        self.sample_wait = Histogram(
            "apexrl_learner_sample_wait_seconds",
            "Time the train step waited for a batch",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.step_time = Histogram(
            "apexrl_learner_train_step_seconds",
            "Time of one train step (forward, backward, optimiser)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.loss = Gauge(
            "apexrl_learner_loss",
            "Loss of the TD errors in the last update (DQN: importance-"
            "weighted Huber loss; DPG: the critics' importance-weighted squared TD error)",
            registry=registry,
        )
        self.mean_q = Gauge(
            "apexrl_learner_mean_q",
            "Mean Q-value on the last batch (DQN: over every action; DPG: Q(s, pi(s)))",
            registry=registry,
        )
        self.policy_loss = Gauge(
            "apexrl_learner_policy_loss",
            "DPG: the policy's loss in its last update, -mean Q(s, pi(s))",
            registry=registry,
        )
        self.action_mean = Gauge(
            "apexrl_learner_policy_action_mean",
            "DPG: mean of the policy's action pi(s) over "
            "the last batch, per action dimension (environment units)",
            ["dimension"],
            registry=registry,
        )
        self.action_std = Gauge(
            "apexrl_learner_policy_action_std",
            "DPG: standard deviation of the policy's action "
            "pi(s) over the last batch, per action dimension (environment units)",
            ["dimension"],
            registry=registry,
        )
        self.weight_version = Gauge(
            "apexrl_learner_weight_version", "Newest published weights version", registry=registry
        )
        self.publish_failures = Counter(
            "apexrl_learner_publish_failures",
            "Weight publishes that failed because the parameter service could not be reached or was busy",
            registry=registry,
        )
        self.version_resyncs = Counter(
            "apexrl_learner_weight_version_resyncs",
            "Publishes whose version the "
            "parameter service refused (another publisher went ahead, or it restarted "
            "far below this learner's checkpoint): the learner read the service's "
            "version and published above it",
            registry=registry,
        )
        self.fleet_size = Gauge(
            "apexrl_learner_replay_size_rows", "Rows held by all shards (last view)", registry=registry
        )
        self.stale = Gauge(
            "apexrl_learner_stale_priority_updates",
            "Priority updates the shards ignored as stale (since start)",
            registry=registry,
        )
        self.updates_dropped = Gauge(
            "apexrl_learner_priority_updates_dropped",
            "Priority updates lost to broken streams or backed-up shards (since start)",
            registry=registry,
        )
        self.prefetch_queue = Gauge(
            "apexrl_learner_prefetch_queue_batches",
            "Sampled batches waiting for the train step",
            registry=registry,
        )
        self.rows_rejected = Gauge(
            "apexrl_learner_rejected_rows",
            "Sampled rows whose compressed columns did not "
            "decompress to their declared shape (since start): each is replaced in its batch "
            "and its priority set to 0; the log names the writer",
            registry=registry,
        )
        self.row_staleness = ArrayHistogram(
            "apexrl_learner_sampled_row_staleness_versions",
            "Learner's weights version minus the version that "
            "produced each sampled row (rows carry it in their weight_version column; R2D2's sequence items in "
            "their weight_version field: the parameter lag of each sampled item)",
            STALENESS_BUCKETS,
            registry,
        )
        self.updates_outstanding = Gauge(
            "apexrl_learner_priority_updates_outstanding",
            "Priority-update messages queued or in flight to the shards",
            registry=registry,
        )

"""`apexrl learner` settings, declared once (see common/settings.py). No torch import: the launcher builds and
checks learner command lines from this module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apexrl.algorithms.registry import AUTO, check_role_settings, role_settings
from apexrl.algorithms.registry import names as algorithm_names
from apexrl.algorithms.torso_specs import NETWORKS
from apexrl.common.addresses import check_address, check_targets
from apexrl.common.env_settings import EnvKwargs, env_kwargs_setting, env_module_setting
from apexrl.common.process import (
    metrics_port_setting,
    replay_resolve_setting,
    tls_server_name_setting,
)
from apexrl.common.serving_settings import ServingSettings
from apexrl.common.settings import setting

DEFAULT_PORT = 7200
DEFAULT_METRICS_PORT = 9200
DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")  # torch device types a learner may train on (cuda:N, xpu:N too)
DEVICE_HELP = (
    "torch device of the learner: auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:N, mps, xpu"
)


def check_device(device: str) -> None:
    """ValueError naming the value unless `device` is auto or a device type of DEVICE_KINDS, with an index or
    without (cuda, cuda:1). Whether this machine has that device is for the learner to find out (it needs torch)."""
    kind, colon, index = device.partition(":")
    if device != "auto" and not (kind in DEVICE_KINDS and (not colon or index.isdigit())):
        raise ValueError(
            f"device ({device!r}) must be auto, {', '.join(DEVICE_KINDS)}, or one of those with an index (cuda:1)"
        )


@dataclass(frozen=True)
class LearnerConfig(
    ServingSettings, *role_settings("learner")
):  # each algorithm's own: algorithms/*/settings.py
    """Configuration of the learner process (Ape-X's learner: an algorithm of `apexrl.algorithms` trained on
    prioritized batches drawn across every shard).

    Attributes are grouped as: wiring (set by the launcher), the hosted parameter service, the algorithm, the
    network and its optimisation, prioritized replay, the data path, weights and checkpoints, limits. A setting
    left at None takes the algorithm's default (`apexrl.algorithms.registry.with_defaults`).
    """

    replay: tuple[str, ...] = setting(
        help="comma-separated host:port of every replay shard, or dns:///NAME:PORT "
        "for every address NAME resolves to (a Kubernetes headless Service)",
        wiring="the [[shard]] tables",
        metavar="ADDRESSES",
    )
    replay_resolve_seconds: float = replay_resolve_setting()
    env: str = setting(
        "CartPole-v1",
        "Gymnasium environment id; sets the network's input and output sizes",
        wiring="[fleet] env",
    )
    env_module: tuple[str, ...] = env_module_setting(wiring="[fleet] env_module")
    env_kwargs: EnvKwargs = env_kwargs_setting(wiring="[fleet] env_kwargs")
    run_dir: str | None = setting(
        None,
        "directory for checkpoints (RUN_DIR/checkpoints/checkpoint.pt); resumes "
        "from it when present (none: no checkpoints)",
        wiring="[fleet] run_dir",
        metavar="DIR",
    )
    seed: int | None = setting(
        None, "seed of network initialisation and sampling (none: unseeded)", wiring="[fleet] seed"
    )
    # The parameter service hosted in this process (or a standalone one); where and how: ServingSettings.
    port: int = setting(
        DEFAULT_PORT, "port of the parameter service hosted in this process; 0 picks one (see --port-file)"
    )
    params: str | None = setting(
        None,
        "publish to a standalone parameter service at host:port instead of hosting one",
        metavar="ADDRESS",
    )
    metrics_port: int = metrics_port_setting(DEFAULT_METRICS_PORT)
    tls_server_name: str | None = tls_server_name_setting()
    # Algorithm
    algorithm: str = setting(
        AUTO,
        "learning algorithm: dqn (Ape-X DQN, Discrete actions) or dpg (Ape-X DPG, Box "
        "actions); auto picks by the environment's action space",
        choices=algorithm_names(),
        wiring="[fleet] algorithm",
    )
    # Network and optimisation
    network: str = setting(
        "auto",
        "network torso: mlp (vectors; images are flattened), nature (Nature DQN's "
        "convolutions, images of 36x36 and up), minatar (one 3x3 convolution, small "
        "images); auto picks mlp for vectors, nature for images of 36x36 and up, minatar "
        "below",
        choices=NETWORKS,
    )
    hidden_sizes: tuple[int, ...] | None = setting(
        None,
        "sizes of the fully connected layers before the output (DQN's dueling head, DPG's action or value), "
        "after the convolutions of a convolutional torso, comma-separated (none: 256,256 for mlp, 512 for "
        "nature, 128 for minatar)",
        metavar="SIZES",
    )
    batch_size: int = setting(256, "rows per update, drawn across all shards")
    learning_rate: float | None = setting(
        None,
        "Adam learning rate (DPG: of the critic) (none: dqn 2e-3 for mlp, "
        "1e-3 for nature and minatar; dpg 1e-3; r2d2 2e-3 for vectors, 1e-3 for images)",
    )
    max_grad_norm: float = setting(10.0, "gradient clipping norm (of each network)")
    target_update_period: int | None = setting(
        None,
        "updates between moves of the target networks toward the online ones (none: dqn 100, dpg 1, r2d2 100)",
    )
    target_tau: float | None = setting(
        None,
        "how far the target networks move at each of those moves: target <- "
        "tau * online + (1 - tau) * target (Polyak averaging); 1: a hard copy "
        "(none: dqn 1, dpg 0.005)",
    )
    # Prioritized replay
    beta_start: float = setting(0.4, "initial importance-sampling exponent (PER)")
    beta_end: float = setting(1.0, "final importance-sampling exponent")
    beta_anneal_updates: int = setting(
        10_000, "updates over which beta rises linearly from beta_start to beta_end"
    )
    priority_epsilon: float = setting(1e-3, "added to |TD error| so no sampled row drops to priority 0")
    min_replay_size: int = setting(
        1_000, "rows the shards must hold in total before training starts", wiring="[fleet] min_replay_size"
    )
    # Data path
    sampler_process: bool = setting(
        True,
        "sample, decode and assemble batches in a child process that hands them "
        "over in shared memory, so the train step never pays for its data (off: "
        "a thread of the learner's own process)",
    )
    prefetch_depth: int = setting(4, "batches sampled ahead of the train step")
    sample_batches_per_call: int = setting(
        4, "batches drawn per Sample call to each shard, each stratified on its own: fewer, larger calls"
    )
    priority_coalesce_batches: int = setting(
        4, "batches whose priority updates go to a shard together in one message"
    )
    sample_timeout: float = setting(10.0, "deadline of one Sample call, seconds")
    # Weights and checkpoints
    publish_every: int = setting(10, "updates between weight versions published to the actors")
    checkpoint_every: int = setting(2_000, "updates between checkpoints; one more is written at exit")
    # Limits and hardware
    max_updates: int | None = setting(None, "stop after this many updates (none: run until stopped)")
    device: str = setting("auto", DEVICE_HELP, metavar="DEVICE")
    torch_threads: int = setting(1, "CPU threads for torch (the fleet shares the machine's cores)")

    def __post_init__(self) -> None:
        check_targets(self.replay, "replay")
        check_device(self.device)
        if self.params is not None:
            check_address(self.params, "params")
        if not self.replay_resolve_seconds > 0:
            raise ValueError(f"replay_resolve_seconds ({self.replay_resolve_seconds}) must be > 0")
        for name in (
            "batch_size",
            "publish_every",
            "checkpoint_every",
            "prefetch_depth",
            "sample_batches_per_call",
            "priority_coalesce_batches",
            "torch_threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a positive integer")
        if not self.replay:
            raise ValueError("replay must name at least one shard address")
        if self.algorithm not in algorithm_names():
            raise ValueError(f"algorithm ({self.algorithm!r}) must be one of {', '.join(algorithm_names())}")
        if self.target_update_period is not None and self.target_update_period < 1:
            raise ValueError(f"target_update_period ({self.target_update_period}) must be a positive integer")
        if self.target_tau is not None and not 0 < self.target_tau <= 1:
            raise ValueError(f"target_tau ({self.target_tau}) must be in (0, 1]")
        check_role_settings(self, "learner")  # each algorithm's own settings (algorithms/*/settings.py)
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm ({self.max_grad_norm}) must be > 0")
        if self.network not in NETWORKS:
            raise ValueError(f"network ({self.network!r}) must be one of {', '.join(NETWORKS)}")
        if self.hidden_sizes is not None and (not self.hidden_sizes or min(self.hidden_sizes) < 1):
            raise ValueError(f"hidden_sizes ({self.hidden_sizes}) must be one or more positive sizes")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate ({self.learning_rate}) must be > 0")
        if not 0 <= self.beta_start <= 1 or not 0 <= self.beta_end <= 1:
            raise ValueError(
                f"beta_start ({self.beta_start}) and beta_end ({self.beta_end}) must be in [0, 1]"
            )
        if self.min_replay_size < 1:
            raise ValueError(f"min_replay_size ({self.min_replay_size}) must be a positive integer")
        if not self.sample_timeout > 0:
            raise ValueError(f"sample_timeout ({self.sample_timeout}) must be > 0")
        if self.max_updates is not None and self.max_updates < 1:
            raise ValueError(f"max_updates ({self.max_updates}) must be a positive integer")
        # It serves only the parameter service it hosts; its token is its own credential as a client, role tokens
        # are what the service it hosts verifies.
        self.check_serving(serves=self.params is None, token_is_verified=False)
        if self.params is not None and (self.role_tokens is not None or self.certificate_roles):
            raise ValueError(
                "role_tokens and certificate_roles set who may call the parameter service this learner "
                "hosts; with --params it hosts none (set them on that service)"
            )
        if self.params is not None and self.health_port is not None:
            raise ValueError(
                f"health_port ({self.health_port}) belongs to the hosted parameter service; with "
                f"params ({self.params}) this learner serves none"
            )

    def listening_ports(self) -> dict[str, int]:
        """Flag -> port this process listens on (0 and -1: none to check): the hosted parameter service's only
        when it hosts one (no --params)."""
        ports = {"--metrics-port": self.metrics_port}
        if self.params is None:
            ports |= {"--port": self.port, "--health-port": self.health_port or 0}
        return {flag: port for flag, port in ports.items() if port > 0}

    @property
    def checkpoint_dir(self) -> Path | None:
        return Path(self.run_dir) / "checkpoints" if self.run_dir else None

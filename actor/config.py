"""`apexrl actor` settings, declared once (see common/settings.py). No gymnasium or torch import: the launcher
builds and checks actor command lines from this module."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.algorithms.registry import AUTO, check_role_settings, role_settings
from apexrl.algorithms.registry import names as algorithm_names
from apexrl.common.addresses import check_address, check_host, check_port, check_targets
from apexrl.common.env_settings import EnvKwargs, env_kwargs_setting, env_module_setting
from apexrl.common.process import (
    host_setting,
    replay_resolve_setting,
    tls_ca_setting,
    tls_cert_setting,
    tls_key_setting,
    tls_server_name_setting,
    token_file_setting,
    token_setting,
)
from apexrl.common.settings import setting
from apexrl.common.tls import tls_of

DEFAULT_METRICS_PORT = 9300  # + actor_index: several actors on one machine take consecutive ports
EVALUATOR_METRICS_PORT = 9400  # the fleet files' convention too (examples/fleet.toml)


@dataclass(frozen=True)
class ActorConfig(*role_settings("actor")):  # each algorithm's own settings (algorithms/*/settings.py)
    """Configuration of one actor process (or, with `evaluate`, of the greedy evaluator).

    Attributes are grouped as: wiring (set by the launcher), serving, exploration, transitions, weights, limits.
    """

    params: str = setting(
        help="host:port of the parameter service to pull weights from",
        wiring="the learner's address",
        metavar="ADDRESS",
    )
    replay: tuple[str, ...] = setting(
        (),
        "comma-separated host:port of the replay shards, or dns:///NAME:PORT for "
        "every address NAME resolves to (required unless --evaluate); batches "
        "go round-robin from actor_index mod shards",
        wiring="the [[shard]] tables",
        metavar="ADDRESSES",
    )
    replay_resolve_seconds: float = replay_resolve_setting()
    actor_index: int = setting(0, "this actor's index i in the fleet", wiring="the [[actors]] groups")
    num_actors: int = setting(
        1,
        "actors in the fleet N; with i it sets this actor's exploration (dqn: epsilon = "
        "0.4 ** (1 + 7 i / (N - 1)); dpg: noise scale = 0.5 * 0.1 ** (i / (N - 1)))",
        wiring="the [[actors]] groups",
    )
    env: str = setting("CartPole-v1", "Gymnasium environment id", wiring="[fleet] env")
    env_module: tuple[str, ...] = env_module_setting(wiring="[fleet] env_module")
    env_kwargs: EnvKwargs = env_kwargs_setting(wiring="[fleet] env_kwargs")
    algorithm: str = setting(
        AUTO,
        "algorithm whose policy this actor plays: dqn (Discrete actions) or dpg (Box "
        "actions); auto picks by the environment's action space",
        choices=algorithm_names(),
        wiring="[fleet] algorithm",
    )
    evaluate: bool = setting(
        False,
        "evaluator: play rounds of --num-envs greedy episodes side by side, each round "
        "with the newest weights, insert nothing",
        wiring="the [evaluator] table",
    )
    keep_policy: str | None = setting(
        None,
        "evaluator: save the weights of the round that solved the run (the first whose last 100 evaluation "
        "episodes average at least target_return), else of its best round, as a policy file at PATH (what "
        "apexrl evaluate, load_policy and export read), with a JSON record beside it (PATH with .json)",
        wiring="RUN_DIR/checkpoints/best.npz",
        metavar="PATH",
    )
    target_return: float | None = setting(
        None,
        "evaluator: the return the last 100 evaluation episodes must average for the run to be solved: the "
        "round that reaches it is the one keep_policy keeps, and no later round replaces it",
        wiring="[fleet] target_return (or the environment's reward_threshold)",
    )
    confirm_solved: bool = setting(
        True,
        "evaluator: a round that reaches target_return is played again with the same weights from fresh start "
        "states, and the run is solved (those weights kept) only if the last 100 evaluation episodes still "
        "reach it; false: the first round that reaches it solves",
    )
    episodes_csv: str | None = setting(
        None,
        "append one CSV line per finished episode to this file",
        wiring="RUN_DIR/episodes/ROLE.csv",
        metavar="PATH",
    )
    seed: int | None = setting(
        None,
        "seed of environments and exploration (none: unseeded)",
        wiring="[fleet] seed + 1000 + actor index (evaluator: + 999)",
    )
    # Serving
    host: str = host_setting()
    metrics_port: int | None = setting(
        None,
        "port of the Prometheus endpoint http://HOST:PORT/metrics; 0 picks a free port, -1 turns it off "
        f"(none: {DEFAULT_METRICS_PORT} + actor_index for an exploring actor, {EVALUATOR_METRICS_PORT} for the "
        "evaluator, so the actors and the evaluator of one machine do not clash)",
    )
    token: str | None = token_setting()
    token_file: str | None = token_file_setting()
    tls_cert: str | None = tls_cert_setting()
    tls_key: str | None = tls_key_setting()
    tls_ca: str | None = tls_ca_setting()
    tls_server_name: str | None = tls_server_name_setting()
    # Exploration
    num_envs: int = setting(
        1,
        "environments stepped together by this actor (one Gymnasium vector environment; "
        "a convolutional network's forward pass is batched over them)",
    )
    # Transitions
    n_step: int = setting(3, "n of the n-step returns")
    gamma: float = setting(0.99, "discount factor")
    batch_size: int = setting(64, "transitions per replay insert")
    compress: str = setting(
        "zstd",
        "compression of image observations in replay (obs and next_obs of uint8 or "
        "bool with at least 2 dimensions per row: one frame per row, decompressed by "
        "the learner's data path); none: raw",
        choices=("zstd", "lz4", "none"),
    )
    # Weights
    pull_every: int = setting(100, "environment steps between checks for newer weights (Ape-X: 400 frames)")
    weights_wait_seconds: float = setting(120.0, "how long to wait for the first weights before giving up")
    act_before_weights: bool = setting(
        True,
        "an exploring actor acts from its start: uniformly random actions (stored with priority 1 and weights "
        "version 0) until the first weights come, instead of waiting for them while the learner starts; the "
        "evaluator always waits",
    )
    # Limits
    max_steps_per_second: float | None = setting(
        None,
        "pace this actor to at most this many environment steps per second (none: as fast as the shards "
        "accept data; an evaluator paces its rounds instead: see evaluation_round_seconds)",
    )
    evaluation_round_seconds: float = setting(
        2.0,
        "evaluator: a round of --num-envs greedy episodes, all played side by side with the newest weights, "
        "starts at most this often, and after each round the evaluator rests long enough to stay within "
        "evaluation_cpu_share; 0: rounds back to back, no rest",
    )
    evaluation_cpu_share: float = setting(
        0.25,
        "evaluator: the share of one core its rounds may take: after a round of T seconds it rests at least "
        "T x (1/share - 1) (0.25: 3T), so slow rounds (Atari, environments without a vectorised version) "
        "leave the learner its CPU; 1: no rest beyond evaluation_round_seconds",
    )
    evaluation_burst_seconds: float = setting(
        60.0,
        "evaluator: seconds of play it may take beyond evaluation_cpu_share before the share holds, so the "
        "first rounds of a run (barely trained policies, the longest episodes) follow each other within "
        "evaluation_round_seconds instead of resting 3x their length; 0: the share holds from the first round",
    )
    min_weight_version: int = setting(
        2,
        "evaluator: the first weights version it plays rounds with (v1 is the learner's untrained network, "
        "published before its first update; a resumed learner publishes trained weights above it)",
    )
    max_env_steps: int | None = setting(None, "stop after this many environment steps")
    max_episodes: int | None = setting(None, "stop after this many episodes")

    @property
    def default_metrics_port(self) -> int:
        return EVALUATOR_METRICS_PORT if self.evaluate else DEFAULT_METRICS_PORT + self.actor_index

    @property
    def serving_metrics_port(self) -> int:
        """The metrics port this process binds (-1: none): metrics_port, else the default for its role."""
        return self.default_metrics_port if self.metrics_port is None else self.metrics_port

    def listening_ports(self) -> dict[str, int]:
        """Flag -> port this process listens on (metrics only; 0 and -1: none to check)."""
        return {"--metrics-port": self.serving_metrics_port} if self.serving_metrics_port > 0 else {}

    def __post_init__(self) -> None:
        if not self.evaluate and not self.replay:
            raise ValueError("replay must name at least one shard address (an exploring actor inserts)")
        check_targets(self.replay, "replay")
        check_address(self.params, "params")
        check_host(self.host, "host")
        if self.metrics_port is not None:
            check_port(self.metrics_port, "metrics_port", pick=True, off=True)
        elif self.default_metrics_port > 65535:
            raise ValueError(
                f"actor_index ({self.actor_index}) puts the default metrics port "
                f"({self.default_metrics_port}) past 65535: set metrics_port"
            )
        if not self.replay_resolve_seconds > 0:
            raise ValueError(f"replay_resolve_seconds ({self.replay_resolve_seconds}) must be > 0")
        if self.num_actors < 1:
            raise ValueError(f"num_actors ({self.num_actors}) must be a positive integer")
        if not 0 <= self.actor_index < self.num_actors:
            raise ValueError(f"actor_index ({self.actor_index}) must be in [0, num_actors={self.num_actors})")
        if self.compress not in ("zstd", "lz4", "none"):
            raise ValueError(f"compress ({self.compress!r}) must be zstd, lz4 or none")
        for name in ("num_envs", "n_step", "batch_size", "pull_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a positive integer")
        check_role_settings(self, "actor")  # each algorithm's own settings (algorithms/*/settings.py)
        if self.algorithm not in algorithm_names():
            raise ValueError(f"algorithm ({self.algorithm!r}) must be one of {', '.join(algorithm_names())}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma ({self.gamma}) must be in (0, 1]")
        if self.max_steps_per_second is not None and not self.max_steps_per_second > 0:
            raise ValueError(f"max_steps_per_second ({self.max_steps_per_second}) must be > 0")
        if not 0 < self.evaluation_cpu_share <= 1:
            raise ValueError(f"evaluation_cpu_share ({self.evaluation_cpu_share}) must be in (0, 1]")
        if not self.evaluation_round_seconds >= 0:
            raise ValueError(f"evaluation_round_seconds ({self.evaluation_round_seconds}) must be >= 0")
        if not self.evaluation_burst_seconds >= 0:
            raise ValueError(f"evaluation_burst_seconds ({self.evaluation_burst_seconds}) must be >= 0")
        if self.min_weight_version < 1:
            raise ValueError(f"min_weight_version ({self.min_weight_version}) must be at least 1")
        tls_of(self)

"""What a fleet is: its run settings (the `[fleet]` table and the `apexrl launch` flags, declared once) and where
each role runs with which of its own settings. Pure data and validation: no files, no processes, no sockets.

The fleet file's schema (`fleet_file.py` reads it) and examples/fleet.toml show these types as TOML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apexrl.algorithms.registry import AUTO
from apexrl.algorithms.registry import names as algorithm_names
from apexrl.common.access import read_role_tokens
from apexrl.common.addresses import check_host
from apexrl.common.env_settings import EnvKwargs, env_kwargs_setting, env_module_setting
from apexrl.common.episodes import SOLVE_WINDOW
from apexrl.common.process import TOKEN_PRECEDENCE, TOKEN_VARIABLE
from apexrl.common.settings import SettingsError, coerce_fields, setting
from apexrl.common.tls import TlsFiles
from apexrl.learner.config import DEVICE_HELP, check_device

LOCAL_HOST = "local"
DEFAULT_ENV = "CartPole-v1"
DEFAULT_EVALUATION_EPISODES = SOLVE_WINDOW  # a round: the episodes "solved" is defined on, of one policy
ATARI_EVALUATION_EPISODES = 10
# What of the replay outlives its shards ([fleet] replay_durability).
REPLAY_OFF, REPLAY_CHECKPOINT, REPLAY_WAL = "off", "checkpoint", "wal"
REPLAY_DURABILITY = (REPLAY_OFF, REPLAY_CHECKPOINT, REPLAY_WAL)


class ConfigError(SettingsError):
    """A fleet configuration that cannot run; the message names the table, key and value at fault."""


@dataclass(frozen=True)
class FleetSettings:
    """How a run goes: the `[fleet]` table of a fleet file, and the `apexrl launch` flags that override it.

    Attributes:
        seed: base seed (shard i: seed + i, learner: seed, actor i: seed + 1000 + i, evaluator: seed + 999).
        algorithm: the learning algorithm of every role (`apexrl.algorithms`); auto: Ape-X DQN for a Discrete action
            space, Ape-X DPG for a Box. The algorithm's defaults fill replay_capacity and samples_per_insert when
            they are not given (`apexrl.launcher.commands.with_algorithm`).
        samples_per_insert: replay ratio the shards enforce (sampled rows per inserted row; 0 = unlimited): actors
            wait when they run ahead of the learner, so learning per environment step does not depend on how the
            machine's cores are shared. DQN's 16 (one update of 256 rows per 16 env steps) with the learner's defaults
            (dueling 256x256, target copy every 100 updates) solved CartPole-v1 in ~0.6x the env steps and ~0.8x
            the wall time of the earlier 8 with 128x128 rows and copies every 250 (bench/tune_cartpole.py's sweep
            and seed-0 fleet runs; docs/progress.md).
        replay_capacity: 25,000 rows, about 11 s of the default fleet's experience: fresh experience mattered more
            than coverage. CartPole-v1 solved in a median 18 s over seeds 0-5 (12-29 s) against 52 s with 100,000;
            MinAtar/Breakout-v1 reached the same return at 150 s (7.7 vs 7.3); Acrobot-v1 solved in 72 s against
            47 s (seed 0). Atari at scale wants ~1,000,000 rows bounded by --max-bytes (Ape-X used 2M).
        replay_durability: off, a resumed run (or a restarted shard) starts its replay empty and the learner waits
            for min_replay_size new rows; checkpoint, each shard i keeps its table in RUN_DIR/replay/shard-i
            (`apexrl replay --checkpoint-dir`: every checkpoint_every seconds, 300 by default, and once more when
            it stops on SIGTERM) and restores it at start, so the learner samples the old transitions at once;
            wal adds a write-ahead log (RUN_DIR/replay/shard-i/wal), so that even a SIGKILL or a power cut loses no
            acknowledged row. A shard table may not set its own checkpoint_dir or wal then. The final
            checkpoint must fit in stop_grace: raise it for a replay of many megabytes.
        tls_cert, tls_key, tls_ca: one TLS identity per machine, given to every role it runs (a role's table may
            not set its own): the shards and the learner's parameter service serve TLS with the certificate, every
            client verifies them with the CA and, as a CA makes the servers require client certificates, presents
            the same certificate: a fleet with its own CA runs mutual TLS. The launcher checks health over TLS
            with them too (on a server's plaintext `health_port` instead when its table sets one). Paths are read
            on each machine: keep the same paths everywhere, or pass `apexrl launch --tls-cert ...` on a machine
            whose files live elsewhere.
        tls_server_name: the name the clients (learner, actors, evaluator, the launcher's health checks) check
            every server's certificate against instead of the address they dial: one certificate naming it serves
            every machine.
        token, token_file: the fleet's bearer token (with APEXRL_TOKEN in the launcher's environment as the last
            source). The launcher resolves it once and hands it to each local role in the role's environment
            (APEXRL_TOKEN), never on a command line (readable by every local user) nor in config.json or a log;
            every machine of a fleet needs the same one.
        open: a local fleet given no token makes one of its own unless this is set (launcher/run_token.py).
    """

    env: str = setting(
        DEFAULT_ENV,
        "Gymnasium environment id played by actors and evaluator and learnt by the "
        "learner; package.module:Id imports the module that registers Id first; an id "
        "only gym 0.26 registers runs through an adapter (the gym26 extra)",
    )
    env_module: tuple[str, ...] = env_module_setting()
    env_kwargs: EnvKwargs = env_kwargs_setting()
    algorithm: str = setting(
        AUTO,
        "learning algorithm: dqn (Ape-X DQN, Discrete actions) or dpg (Ape-X DPG, Box "
        "actions); auto picks by the environment's action space",
        choices=algorithm_names(),
    )
    device: str | None = setting(
        None,
        f"{DEVICE_HELP}; given, it replaces a [learner] table's device (none: that table's device, else auto)",
        metavar="DEVICE",
    )
    run_dir: str | None = setting(
        None,
        "directory of logs, episodes, checkpoints and results on every machine (none: runs/ENV-TIMESTAMP)",
        metavar="DIR",
    )
    seed: int | None = setting(None, "base seed; each role derives its own (none: unseeded)")
    target_return: float | None = setting(
        None,
        "stop, solved, once the last 100 evaluation episodes average at "
        "least this, and again after one more round of the same weights (the evaluator's confirm_solved); "
        "those weights are kept, RUN_DIR/checkpoints/best.npz (none: the environment's reward_threshold from its "
        "Gymnasium registration, e.g. 475 for CartPole-v1 and -100 for "
        "Acrobot-v1, or the usual bar where it registers none: -150 for "
        "Pendulum-v1; an environment without one runs until --max-seconds)",
    )
    evaluation_episodes: int | None = setting(
        None,
        "greedy episodes the evaluator plays side by side per round, all with the newest weights (its "
        "--num-envs; an [evaluator] num_envs overrides it): the target is checked on the last 100 evaluation "
        f"episodes (none: {DEFAULT_EVALUATION_EPISODES}, or {ATARI_EVALUATION_EPISODES} for Atari, whose "
        "rounds of a convolutional network over thousands of frames would otherwise last minutes on a few "
        "cores)",
    )
    max_seconds: float = setting(1200.0, "stop after this many seconds of wall time")
    bind: str = setting(
        "127.0.0.1",
        "interface every service listens on (0.0.0.0: every interface, needed when other machines connect)",
    )
    tls_cert: str | None = setting(
        None,
        "PEM certificate chain of this machine's roles: the shards and the "
        "parameter service serve TLS with it, and every role presents it as its "
        "client certificate under mutual TLS; it must name the addresses dialled "
        "(127.0.0.1 on one machine, the [hosts] addresses across machines), or "
        "tls_server_name (none: plaintext)",
        metavar="PATH",
    )
    tls_key: str | None = setting(None, "PEM private key of tls_cert", metavar="PATH")
    tls_ca: str | None = setting(
        None,
        "PEM CA bundle every role verifies its peers with; given, the servers "
        "require client certificates signed by it: mutual TLS (none with tls_cert: "
        "server-only TLS verified against the system's roots)",
        metavar="PATH",
    )
    tls_server_name: str | None = setting(
        None,
        "name every role checks the servers' certificates against "
        "instead of the addresses it dials (one certificate for every "
        "machine); needs tls_ca or tls_cert (none: the addresses "
        "dialled)",
        metavar="NAME",
    )
    token: str | None = setting(
        None,
        "bearer token of the fleet: every role's servers require it and its clients "
        "send it; each local role gets it in its environment "
        f"({TOKEN_VARIABLE}), never on a command line or in config.json or a log. "
        "This launcher's own command line is visible to every local user: prefer "
        f"token_file or {TOKEN_VARIABLE}. {TOKEN_PRECEDENCE}, but a fleet on this machine alone then makes its "
        "own, RUN_DIR/token (see open); a role table's own token or token_file wins for that role",
    )
    token_file: str | None = setting(
        None,
        "file holding the fleet's bearer token (its content, surrounding "
        "whitespace stripped; keep it mode 0600), used when token is not given, "
        f"before {TOKEN_VARIABLE}",
        metavar="PATH",
    )
    role_tokens: str | None = setting(
        None,
        "directory of role tokens (docs/security.md): one file per identity, named ROLE or ROLE.NAME; the "
        "shards and the learner's parameter service let each role call only its own methods, and each role "
        "gets its own token in its environment: the learner DIR/learner, actor I DIR/actor.I if present "
        "(else DIR/actor), the evaluator DIR/evaluator. Exclusive with token",
        metavar="DIR",
    )
    open: bool = setting(
        False,
        "run without a bearer token: every local user and process may insert into the shards, sample them and "
        "publish weights on their ports. Without it, a fleet whose every role runs on this machine and that is "
        f"given no token (token, token_file, {TOKEN_VARIABLE}, role_tokens or a role table's own) makes one "
        "for the run, hands it to each role in its environment and keeps it in RUN_DIR/token (mode 0600) for "
        "your own clients (--token-file RUN_DIR/token). A fleet over several machines is open when given no "
        "token, with or without it. Exclusive with a token and role_tokens",
    )
    replay_capacity: int | None = setting(
        None,
        "rows over all shards together (each holds its share) (none: the "
        "algorithm's default: dqn 25,000, dpg 100,000, r2d2 100,000 steps)",
    )
    samples_per_insert: float | None = setting(
        None,
        "replay ratio the shards enforce: sampled rows per inserted row, 0 = unlimited (none: the "
        "algorithm's default: dqn 16, one update of 256 rows per 16 env steps; dpg 64, one per 4; r2d2 16 "
        "sequences sampled per sequence written, one update of 64 per 4 sequences)",
    )
    min_replay_size: int = setting(1_000, "rows the shards hold in total before the learner trains")
    replay_durability: str = setting(
        REPLAY_OFF,
        "what of the replay a resume (or a restarted shard) keeps: off, the replay starts empty; checkpoint, "
        "shard I checkpoints its table in RUN_DIR/replay/shard-I (every 300 s and when it stops) and restores "
        "it at start; wal, also a write-ahead log there, so a SIGKILL loses no acknowledged row",
        choices=REPLAY_DURABILITY,
    )
    startup_timeout: float = setting(120.0, "seconds each service may take to report SERVING")
    progress_seconds: float = setting(5.0, "seconds between progress lines")
    stop_grace: float = setting(
        20.0,
        "seconds a role may take to exit after SIGTERM before SIGKILL (roles stop in two groups, each within it; "
        "a clean stop takes a few seconds, but on a loaded machine the learner's final checkpoint, its sampler "
        "process and the parameter service's last calls took over 5)",
    )
    max_restarts: int = setting(
        5,
        "restarts of one role that dies within restart_window before the run ends "
        "(0: the first death ends the run)",
    )
    restart_window: float = setting(300.0, "seconds over which a role's restarts are counted")
    role_log_max_mb: float = setting(
        50.0,
        "size at which a role's log (RUN_DIR/logs/NAME.log) is rotated to NAME.log.1 (two copies kept): a role "
        "that logs without bound never fills the disk its checkpoints share",
    )

    def __post_init__(self) -> None:
        try:  # Python's spellings (env_kwargs as a dict, env_module as text); a wrong type is refused
            coerce_fields(self, FleetSettings)
        except SettingsError as err:
            raise ConfigError(str(err)) from None
        if not self.env.strip():
            raise ConfigError("env must not be empty")
        try:
            check_host(self.bind, "bind")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"seed ({self.seed}) must be at least 0")
        for name in ("max_seconds", "startup_timeout", "progress_seconds", "role_log_max_mb"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} ({value}) must be positive")
        if self.evaluation_episodes is not None and self.evaluation_episodes < 1:
            raise ConfigError(f"evaluation_episodes ({self.evaluation_episodes}) must be at least 1")
        if self.max_restarts < 0 or not self.restart_window > 0:
            raise ConfigError(
                f"max_restarts ({self.max_restarts}) must be >= 0 and restart_window "
                f"({self.restart_window}) > 0"
            )
        if not self.stop_grace >= 0:
            raise ConfigError(f"stop_grace ({self.stop_grace}) must be >= 0")
        if self.algorithm not in algorithm_names():
            raise ConfigError(f"algorithm ({self.algorithm!r}) must be one of {', '.join(algorithm_names())}")
        if self.device is not None:
            try:
                check_device(self.device)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if (self.replay_capacity is not None and self.replay_capacity < 1) or self.min_replay_size < 1:
            raise ConfigError(
                f"replay_capacity ({self.replay_capacity}) and min_replay_size "
                f"({self.min_replay_size}) must be at least 1"
            )
        if self.samples_per_insert is not None and not (
            math.isfinite(self.samples_per_insert) and self.samples_per_insert >= 0
        ):
            raise ConfigError(f"samples_per_insert ({self.samples_per_insert}) must be >= 0")
        if self.replay_durability not in REPLAY_DURABILITY:
            raise ConfigError(
                f"replay_durability ({self.replay_durability!r}) must be one of {', '.join(REPLAY_DURABILITY)}"
            )
        try:
            self.tls_files()
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._check_tokens()

    def _check_tokens(self) -> None:
        """ConfigError for credentials that contradict each other: open beside a token, a fleet token beside role
        tokens (it would allow every method), a role-token directory that cannot be used."""
        if self.open and (self.token or self.token_file or self.role_tokens is not None):
            raise ConfigError(
                f"open and a bearer token together: open runs without one (unset token, token_file, "
                f"role_tokens and {TOKEN_VARIABLE}, or drop open)"
            )
        if self.role_tokens is not None:
            if self.token:
                raise ConfigError(
                    "role_tokens and a fleet token together: the fleet token would allow every "
                    "method to whoever holds it (unset token, token_file and APEXRL_TOKEN)"
                )
            try:
                read_role_tokens(self.role_tokens)
            except SettingsError as err:
                raise ConfigError(str(err)) from None

    def tls_files(self) -> TlsFiles | None:
        """This machine's TLS files (read now), or None when TLS is off. Whether a server role may use them
        (a CA needs a certificate) is checked with the role's own settings."""
        files = TlsFiles.read(self.tls_cert, self.tls_key, self.tls_ca, server_name=self.tls_server_name)
        return files if files.enabled else None


@dataclass(frozen=True)
class ShardSpec:
    host: str
    port: int  # 0: any free port (the launcher reads it from the shard's port file)
    metrics_port: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # ReplayConfig keys


@dataclass(frozen=True)
class LearnerSpec:
    host: str
    port: int | None  # the hosted parameter service; None: the launcher picks a free port
    metrics_port: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # LearnerConfig keys


@dataclass(frozen=True)
class ActorGroup:
    host: str
    count: int
    first_index: int
    metrics_port: int | None = None  # the first of `count` consecutive ports
    settings: Mapping[str, Any] = field(default_factory=dict)  # ActorConfig keys


@dataclass(frozen=True)
class EvaluatorSpec:
    host: str
    metrics_port: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # ActorConfig keys


@dataclass(frozen=True)
class FleetConfig(FleetSettings):
    """A whole fleet, validated: the run settings, the roles and the machines' addresses."""

    shards: tuple[ShardSpec, ...] = ()
    learner: LearnerSpec = LearnerSpec(LOCAL_HOST, None)
    actors: tuple[ActorGroup, ...] = ()
    evaluator: EvaluatorSpec | None = None
    hosts: Mapping[str, str] = field(default_factory=dict)  # host name -> address other machines use

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shards:
            raise ConfigError("the fleet needs at least one [[shard]]")
        if not self.actors:
            raise ConfigError("the fleet needs at least one [[actors]] group")
        if self.replay_durability != REPLAY_OFF:
            for i, shard in enumerate(self.shards):
                own = [key for key in ("checkpoint_dir", "wal") if shard.settings.get(key) is not None]
                if own:
                    raise ConfigError(
                        f"[[shard]] #{i} sets {' and '.join(own)} and [fleet] replay_durability is "
                        f"{self.replay_durability!r}, which gives each shard its own directory in the run "
                        f"directory (RUN_DIR/replay/shard-{i}): drop one of them"
                    )

    def role_token(self, role: str, index: int | None = None) -> str:
        """The token a client role of this fleet presents in role mode (role_tokens): ROLE.INDEX's file when
        there is one, else ROLE's; ConfigError naming the file when there is none. A machine needs the files of
        the client roles it runs only (the launcher checks those before anything starts)."""
        directory = Path(self.role_tokens)
        names = ([f"{role}.{index}"] if index is not None else []) + [role]
        for name in names:
            if (directory / name).is_file():
                return (directory / name).read_text().strip()
        raise ConfigError(
            f"role_tokens: {directory} has no token for {role}"
            f"{'' if index is None else f' {index}'} (a file named {' or '.join(names)})"
        )

    @property
    def num_actors(self) -> int:
        return sum(group.count for group in self.actors)

    @property
    def shard_capacity(self) -> int:
        if self.replay_capacity is None:
            raise ConfigError("replay_capacity is not resolved yet (apexrl.launcher.commands.with_algorithm)")
        return -(-self.replay_capacity // len(self.shards))

    @property
    def shard_min_size(self) -> int:
        return max(1, -(-self.min_replay_size // len(self.shards)))

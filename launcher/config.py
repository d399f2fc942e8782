"""Fleet configuration for `apexrl launch`: the fleet-file schema, its validation, and the wiring between roles.

A fleet file names every process of a fleet and the machine it runs on. Each machine runs
`apexrl launch --config FILE --host-name NAME` with the same file and starts only the roles whose `host` is NAME,
pointing them at the addresses of the others. TOML (or YAML, for a .yaml/.yml suffix):

    [fleet]                      # optional; every key has a default
    env = "CartPole-v1"          # Gymnasium id played by actors, evaluator and learner
    run_dir = "runs/cartpole"    # on every machine (default: runs/<env>-<timestamp>)
    seed = 0                     # base seed; each role derives its own (default: unseeded)
    target_return = 475.0        # stop when the evaluator's last 100 episodes average this much
    max_seconds = 1200           # stop after this long
    bind = "0.0.0.0"             # interface the services listen on
    replay_capacity = 100000     # rows over all shards together
    samples_per_insert = 8.0     # replay ratio the shards enforce (0 = unlimited)
    min_replay_size = 1000       # rows in all shards before the learner trains
    startup_timeout = 120        # seconds to wait for each service to report SERVING

    [hosts]                      # optional: the address other machines use for a host (default: its name)
    m1 = "10.0.0.1"

    [[shard]]                    # one table per replay shard
    host = "m1"
    port = 7000                  # gRPC ReplayService
    metrics_port = 9100          # optional: Prometheus (default: a free port picked at launch)
    args = ["--alpha", "0.6"]    # optional: appended to this role's `apexrl replay` command line

    [learner]                    # exactly one; it hosts the parameter service
    host = "m1"
    params_port = 7100
    metrics_port = 9200
    args = []

    [[actors]]                   # groups of exploring actors; indices tile 0 .. num_actors-1
    host = "m2"
    count = 8
    first_index = 0              # optional: default follows the previous group
    metrics_port = 9300          # optional: the first of `count` consecutive ports
    args = []

    [evaluator]                  # optional; must run on the learner's host
    host = "m1"
    metrics_port = 9400
    args = []

The machine that runs the learner (and the evaluator) checks the target return; other machines run until Ctrl-C,
SIGTERM or `max_seconds`. Everything here is pure: no processes, no sockets.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCAL_HOST = "local"
DEFAULT_ENV = "CartPole-v1"
# Interfaces on which a service is reachable from its own machine as 127.0.0.1.
_ANY_OR_LOOPBACK = {"0.0.0.0", "::", "127.0.0.1", "localhost"}


class ConfigError(ValueError):
    """A fleet configuration that cannot run; the message names the table, key and value at fault."""


@dataclass(frozen=True)
class ShardSpec:
    host: str
    port: int  # 0: any free port (the launcher reads it from the shard's port file)
    metrics_port: int | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LearnerSpec:
    host: str
    params_port: int | None  # None: the launcher picks a free port
    metrics_port: int | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActorGroup:
    host: str
    count: int
    first_index: int
    metrics_port: int | None = None  # the first of `count` consecutive ports
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvaluatorSpec:
    host: str
    metrics_port: int | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetConfig:
    """A whole fleet, validated.

    Attributes:
        env: Gymnasium environment id.
        run_dir: run directory on every machine; None means runs/<env>-<timestamp>.
        seed: base seed (shard i: seed + i, learner: seed, actor i: seed + 1000 + i, evaluator: seed + 999).
        target_return: mean evaluation return over the last 100 episodes that ends the run as solved.
        max_seconds: wall-clock budget of the run.
        bind: interface every service listens on.
        replay_capacity: rows over all shards; each holds ceil(capacity / shards).
        samples_per_insert: replay ratio the shards enforce (sampled rows per inserted row; 0 = unlimited): actors
            wait when they run ahead of the learner, so learning per environment step does not depend on how
            the machine's cores are shared. 8 solved CartPole in the fewest updates in our sweeps.
        min_replay_size: rows the fleet holds before the learner trains (each shard: its share).
        startup_timeout: seconds each service may take to report SERVING.
        hosts: host name -> address other machines use (names not listed are their own address).
    """

    shards: tuple[ShardSpec, ...]
    learner: LearnerSpec
    actors: tuple[ActorGroup, ...]
    evaluator: EvaluatorSpec | None
    env: str = DEFAULT_ENV
    run_dir: str | None = None
    seed: int | None = None
    target_return: float = 475.0
    max_seconds: float = 1200.0
    bind: str = "0.0.0.0"
    replay_capacity: int = 100_000
    samples_per_insert: float = 8.0
    min_replay_size: int = 1_000
    startup_timeout: float = 120.0
    hosts: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_actors(self) -> int:
        return sum(group.count for group in self.actors)

    @property
    def shard_capacity(self) -> int:
        return -(-self.replay_capacity // len(self.shards))

    @property
    def shard_min_size(self) -> int:
        return max(1, -(-self.min_replay_size // len(self.shards)))


@dataclass(frozen=True)
class Role:
    """One process of the fleet.

    `kind` is the `apexrl` subcommand family: replay, learner, actor or evaluator (an `apexrl actor --evaluate`).
    `port` is the gRPC port others connect to (a shard's ReplayService, the learner's parameter service).
    """

    name: str  # shard-0, learner, actor-3, evaluator: also the log file's name
    kind: str
    host: str
    index: int  # shard index or actor index (0 for learner and evaluator)
    port: int | None
    metrics_port: int | None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wiring:
    """Where the roles of one machine find the services: addresses as seen from that machine."""

    replay: tuple[str, ...]
    params: str


# --- building a config --------------------------------------------------------------------------------------------


def local_fleet(
    *,
    env: str = DEFAULT_ENV,
    num_shards: int = 2,
    num_actors: int = 4,
    evaluator: bool = True,
    **fleet_options: Any,
) -> FleetConfig:
    """Every role on this machine, listening on 127.0.0.1; shards pick free ports and report them in port files,
    the launcher picks the other ports."""
    if num_shards < 1:
        raise ConfigError(f"--num-shards ({num_shards}) must be at least 1")
    if num_actors < 1:
        raise ConfigError(f"--num-actors ({num_actors}) must be at least 1")
    config = FleetConfig(
        shards=tuple(ShardSpec(LOCAL_HOST, 0) for _ in range(num_shards)),
        learner=LearnerSpec(LOCAL_HOST, None),
        # One group per actor, so that each gets its own free metrics port.
        actors=tuple(ActorGroup(LOCAL_HOST, 1, i) for i in range(num_actors)),
        evaluator=EvaluatorSpec(LOCAL_HOST) if evaluator else None,
        env=env,
        bind="127.0.0.1",
        hosts={LOCAL_HOST: "127.0.0.1"},
        **fleet_options,
    )
    validate(config)
    return config


def load_config(path: str | os.PathLike) -> FleetConfig:
    """Read a fleet file: YAML for a .yaml/.yml suffix, TOML otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read fleet file {path}: {err.strerror or err}") from err
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: invalid YAML: {err}") from err
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
            try:
                import tomli as tomllib
            except ModuleNotFoundError:
                raise ConfigError(f"{path}: reading TOML needs Python 3.11+ or 'pip install tomli'; "
                                  f"or write the fleet file in YAML (.yaml)") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from err
    try:
        return parse_config(data if data is not None else {})
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


_FLEET_KEYS = ("env", "run_dir", "seed", "target_return", "max_seconds", "bind", "replay_capacity",
               "samples_per_insert", "min_replay_size", "startup_timeout")
_SHARD_KEYS = ("host", "port", "metrics_port", "args")
_LEARNER_KEYS = ("host", "params_port", "metrics_port", "args")
_ACTORS_KEYS = ("host", "count", "first_index", "metrics_port", "args")
_EVALUATOR_KEYS = ("host", "metrics_port", "args")
_TOP_KEYS = ("fleet", "hosts", "shard", "learner", "actors", "evaluator")


def parse_config(data: Mapping[str, Any]) -> FleetConfig:
    """Validate a parsed fleet file (see the module docstring for the schema)."""
    _table(data, "the fleet file")
    _check_keys(data, _TOP_KEYS, "the fleet file", what="table")
    fleet = _table(data.get("fleet", {}), "[fleet]")
    _check_keys(fleet, _FLEET_KEYS, "[fleet]")
    options: dict[str, Any] = {}
    if "env" in fleet:
        options["env"] = _string(fleet["env"], "[fleet] env")
    if "run_dir" in fleet:
        options["run_dir"] = _string(fleet["run_dir"], "[fleet] run_dir")
    if "seed" in fleet:
        options["seed"] = _integer(fleet["seed"], "[fleet] seed", minimum=0)
    if "target_return" in fleet:
        options["target_return"] = _number(fleet["target_return"], "[fleet] target_return")
    if "max_seconds" in fleet:
        options["max_seconds"] = _number(fleet["max_seconds"], "[fleet] max_seconds", positive=True)
    if "bind" in fleet:
        options["bind"] = _string(fleet["bind"], "[fleet] bind")
    if "replay_capacity" in fleet:
        options["replay_capacity"] = _integer(fleet["replay_capacity"], "[fleet] replay_capacity", minimum=1)
    if "samples_per_insert" in fleet:
        options["samples_per_insert"] = _number(fleet["samples_per_insert"], "[fleet] samples_per_insert")
        if options["samples_per_insert"] < 0:
            raise ConfigError(f"[fleet] samples_per_insert ({options['samples_per_insert']}) must be >= 0")
    if "min_replay_size" in fleet:
        options["min_replay_size"] = _integer(fleet["min_replay_size"], "[fleet] min_replay_size", minimum=1)
    if "startup_timeout" in fleet:
        options["startup_timeout"] = _number(fleet["startup_timeout"], "[fleet] startup_timeout", positive=True)

    hosts_table = _table(data.get("hosts", {}), "[hosts]")
    hosts = {str(name): _string(address, f"[hosts] {name}") for name, address in hosts_table.items()}

    shards = []
    for i, entry in enumerate(_array(data.get("shard"), "[[shard]]", required=True)):
        where = f"[[shard]] #{i}"
        _check_keys(_table(entry, where), _SHARD_KEYS, where)
        shards.append(ShardSpec(
            host=_host(entry, where),
            port=_port(entry, "port", where, required=True),
            metrics_port=_port(entry, "metrics_port", where),
            args=_args(entry, where),
        ))

    if "learner" not in data:
        raise ConfigError("missing [learner] table (exactly one learner; it hosts the parameter service)")
    entry = _table(data["learner"], "[learner]")
    _check_keys(entry, _LEARNER_KEYS, "[learner]")
    learner = LearnerSpec(
        host=_host(entry, "[learner]"),
        params_port=_port(entry, "params_port", "[learner]", required=True),
        metrics_port=_port(entry, "metrics_port", "[learner]"),
        args=_args(entry, "[learner]"),
    )

    actors = []
    next_index = 0
    for i, entry in enumerate(_array(data.get("actors"), "[[actors]]", required=True)):
        where = f"[[actors]] #{i}"
        _check_keys(_table(entry, where), _ACTORS_KEYS, where)
        if "count" not in entry:
            raise ConfigError(f"{where}: missing 'count' (actors in this group)")
        count = _integer(entry["count"], f"{where} count", minimum=1)
        first = _integer(entry["first_index"], f"{where} first_index", minimum=0) \
            if "first_index" in entry else next_index
        metrics_port = _port(entry, "metrics_port", where)
        if metrics_port is not None and metrics_port + count - 1 > 65535:
            raise ConfigError(f"{where}: metrics ports {metrics_port}..{metrics_port + count - 1} exceed 65535")
        actors.append(ActorGroup(_host(entry, where), count, first, metrics_port, _args(entry, where)))
        next_index = first + count

    evaluator = None
    if "evaluator" in data:
        entry = _table(data["evaluator"], "[evaluator]")
        _check_keys(entry, _EVALUATOR_KEYS, "[evaluator]")
        evaluator = EvaluatorSpec(_host(entry, "[evaluator]"), _port(entry, "metrics_port", "[evaluator]"),
                                  _args(entry, "[evaluator]"))

    config = FleetConfig(shards=tuple(shards), learner=learner, actors=tuple(actors), evaluator=evaluator,
                         hosts=hosts, **options)
    validate(config)
    return config


def validate(config: FleetConfig) -> None:
    """Checks across roles: actor indices tile 0..N-1, no port used twice on one host, evaluator placement."""
    if not config.shards:
        raise ConfigError("the fleet needs at least one [[shard]]")
    if not config.actors:
        raise ConfigError("the fleet needs at least one [[actors]] group")
    if not config.env:
        raise ConfigError("[fleet] env must not be empty")
    taken: dict[int, str] = {}
    for i, group in enumerate(config.actors):
        for index in range(group.first_index, group.first_index + group.count):
            if index in taken:
                raise ConfigError(f"[[actors]] #{i}: actor index {index} is also in {taken[index]}")
            taken[index] = f"[[actors]] #{i}"
    missing = sorted(set(range(config.num_actors)) - set(taken))
    if missing:
        raise ConfigError(f"actor indices must be 0..{config.num_actors - 1} without gaps (the Ape-X epsilons are "
                          f"spread over them); missing {missing}, groups cover {sorted(taken)}")
    if config.evaluator is not None and config.evaluator.host != config.learner.host:
        raise ConfigError(f"[evaluator] host ({config.evaluator.host!r}) must be the learner's host "
                          f"({config.learner.host!r}): the learner's machine reads the evaluation episodes to "
                          f"check the target return")
    used: dict[tuple[str, int], str] = {}
    for role in roles(config):
        for key, port in (("port", role.port), ("metrics_port", role.metrics_port)):
            if not port:  # None or 0: picked at launch
                continue
            key = "params_port" if role.kind == "learner" and key == "port" else key
            owner = f"{role.name} ({key})"
            if (role.host, port) in used:
                raise ConfigError(f"port {port} on host {role.host!r} is used by both {used[role.host, port]} "
                                  f"and {owner}")
            used[role.host, port] = owner


# --- roles and wiring ---------------------------------------------------------------------------------------------


def roles(config: FleetConfig) -> list[Role]:
    """Every process of the fleet in start order: shards, learner, actors (by index), evaluator."""
    result = [Role(f"shard-{i}", "replay", s.host, i, s.port, s.metrics_port, s.args)
              for i, s in enumerate(config.shards)]
    learner = config.learner
    result.append(Role("learner", "learner", learner.host, 0, learner.params_port, learner.metrics_port,
                       learner.args))
    actors = []
    for group in config.actors:
        for k in range(group.count):
            metrics = None if group.metrics_port is None else group.metrics_port + k
            index = group.first_index + k
            actors.append(Role(f"actor-{index}", "actor", group.host, index, None, metrics, group.args))
    result += sorted(actors, key=lambda r: r.index)
    if config.evaluator is not None:
        ev = config.evaluator
        result.append(Role("evaluator", "evaluator", ev.host, 0, None, ev.metrics_port, ev.args))
    return result


def host_names(config: FleetConfig) -> list[str]:
    """The machines named in the fleet, in order of first appearance."""
    return list(dict.fromkeys(role.host for role in roles(config)))


def roles_on(config: FleetConfig, host: str) -> list[Role]:
    """The roles `apexrl launch --host-name HOST` starts; ConfigError when HOST runs none."""
    mine = [role for role in roles(config) if role.host == host]
    if not mine:
        raise ConfigError(f"no role of the fleet runs on host {host!r}; hosts in the fleet: "
                          f"{', '.join(host_names(config))}")
    return mine


def checks_target(config: FleetConfig, host: str) -> bool:
    """Only the learner's machine, with the evaluator, decides that the fleet is solved."""
    return config.evaluator is not None and config.learner.host == host


def address(config: FleetConfig, role_host: str, port: int, from_host: str) -> str:
    """host:port of a service on `role_host` as seen from `from_host` (loopback when both are one machine)."""
    if role_host == from_host:
        host = "127.0.0.1" if config.bind in _ANY_OR_LOOPBACK else config.bind
    else:
        host = config.hosts.get(role_host, role_host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{port}"


def wiring(config: FleetConfig, from_host: str) -> Wiring:
    """The shard and parameter-service addresses the roles on `from_host` connect to (ports must be known)."""
    for i, shard in enumerate(config.shards):
        if not shard.port:
            raise ConfigError(f"shard-{i} has no port yet (start it and read its port file first)")
    if not config.learner.params_port:
        raise ConfigError("the learner has no params_port yet")
    return Wiring(
        replay=tuple(address(config, s.host, s.port, from_host) for s in config.shards),
        params=address(config, config.learner.host, config.learner.params_port, from_host),
    )


def with_ports(config: FleetConfig, *, shard_ports: Mapping[int, int] | None = None,
               params_port: int | None = None) -> FleetConfig:
    """A copy with the ports the launcher learnt (port files) or picked filled in."""
    shards = list(config.shards)
    for i, port in (shard_ports or {}).items():
        shards[i] = dataclasses.replace(shards[i], port=port)
    learner = config.learner
    if params_port is not None:
        learner = dataclasses.replace(learner, params_port=params_port)
    return dataclasses.replace(config, shards=tuple(shards), learner=learner)


def command(config: FleetConfig, role: Role, links: Wiring, run_dir: Path,
            extra_args: Sequence[str] = ()) -> list[str]:
    """The `apexrl ...` arguments (after the program name) that run `role`; its ports must be concrete."""
    seed = config.seed
    metrics = str(role.metrics_port if role.metrics_port is not None else -1)
    if role.kind == "replay":
        argv = ["replay", "--host", config.bind, "--port", str(role.port), "--metrics-port", metrics,
                "--capacity", str(config.shard_capacity), "--min-size-to-sample", str(config.shard_min_size),
                "--samples-per-insert", f"{config.samples_per_insert:g}",
                # Let each side run ahead by a few learner batches before it waits.
                "--samples-per-insert-tolerance", str(max(1024, 4 * config.shard_min_size)),
                "--port-file", str(run_dir / "ports" / f"{role.name}.port")]
        if seed is not None:
            argv += ["--seed", str(seed + role.index)]
    elif role.kind == "learner":
        argv = ["learner", "--replay", ",".join(links.replay), "--params-host", config.bind,
                "--params-port", str(role.port), "--env", config.env, "--metrics-host", config.bind,
                "--metrics-port", metrics, "--run-dir", str(run_dir),
                "--min-replay-size", str(config.shard_min_size * len(config.shards))]
        if seed is not None:
            argv += ["--seed", str(seed)]
    elif role.kind in ("actor", "evaluator"):
        evaluate = role.kind == "evaluator"
        csv = run_dir / "episodes" / ("evaluator.csv" if evaluate else f"actor-{role.index}.csv")
        argv = ["actor", "--replay", ",".join(links.replay), "--params", links.params,
                "--actor-index", str(role.index), "--num-actors", str(config.num_actors), "--env", config.env,
                "--metrics-host", config.bind, "--metrics-port", metrics, "--episodes-csv", str(csv)]
        if evaluate:
            argv.append("--evaluate")
        if seed is not None:
            argv += ["--seed", str(seed + (999 if evaluate else 1000 + role.index))]
    else:
        raise ValueError(f"unknown role kind {role.kind!r}")
    return argv + list(role.args) + list(extra_args)


# --- field checks -------------------------------------------------------------------------------------------------


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str, what: str = "key") -> None:
    unknown = sorted(set(map(str, table)) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown {what}{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))} (allowed: {', '.join(allowed)})")


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(value).__name__} {value!r}")
    return value


def _array(value: Any, where: str, *, required: bool) -> list[Mapping[str, Any]]:
    if value is None:
        if required:
            raise ConfigError(f"missing {where}: the fleet needs at least one")
        return []
    if isinstance(value, Mapping):  # one table where an array of tables was meant: accept it
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty array of tables, got {value!r}")
    return value


def _host(entry: Mapping[str, Any], where: str) -> str:
    if "host" not in entry:
        raise ConfigError(f"{where}: missing 'host' (the name passed as --host-name on the machine that runs it)")
    return _string(entry["host"], f"{where} host")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _integer(value: Any, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} ({value}) must be at least {minimum}")
    return value


def _number(value: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"{where} ({value}) must be positive")
    return float(value)


def _port(entry: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    if key not in entry:
        if required:
            raise ConfigError(f"{where}: missing '{key}' (other machines connect to it, so it must be fixed)")
        return None
    port = _integer(entry[key], f"{where} {key}")
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where} {key} ({port}) must be in 1..65535")
    return port


def _args(entry: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = entry.get("args", [])
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ConfigError(f"{where} args must be a list of strings, got {value!r}")
    return tuple(value)

"""Reading a fleet file: TOML (or YAML, for a .yaml/.yml suffix) into a validated FleetConfig.

A fleet file names every process of a fleet and the machine it runs on. Each machine runs
`apexrl launch --config FILE --host-name NAME` with the same file and starts only the roles whose `host` is NAME,
pointing them at the addresses of the others:

    [fleet]                      # optional; the `apexrl launch` flags of the same names override it
    env = "CartPole-v1"
    bind = "0.0.0.0"             # ... every key of FleetSettings (`apexrl launch --help` lists them)
    tls_cert = "/etc/apexrl/tls/node.pem"      # optional: TLS for every role of the machine (see below)
    tls_key = "/etc/apexrl/tls/node-key.pem"
    tls_ca = "/etc/apexrl/tls/ca.pem"          # with a CA: mutual TLS

    [hosts]                      # optional: the address other machines use for a host (default: its name)
    m1 = "10.0.0.1"

    [[shard]]                    # one table per replay shard
    host = "m1"                  # the machine (its --host-name)
    port = 7000                  # gRPC ReplayService
    metrics_port = 9100          # optional: Prometheus (default: a free port picked at launch)
    health_port = 8000           # optional: plaintext gRPC health alone (probes; with TLS on)
    alpha = 0.6                  # optional: any other `apexrl replay` setting, by its flag's name with '_'

    [learner]                    # exactly one; it hosts the parameter service
    host = "m1"
    port = 7200                  # the hosted parameter service
    batch_size = 256             # optional: any other `apexrl learner` setting

    [[actors]]                   # groups of exploring actors; indices tile 0 .. num_actors-1
    host = "m2"
    count = 8
    first_index = 0              # optional: default follows the previous group
    metrics_port = 9300          # optional: the first of `count` consecutive ports
    num_envs = 2                 # optional: any other `apexrl actor` setting

    [evaluator]                  # optional; must run on the learner's host; `apexrl actor` settings too

Settings the launcher derives (addresses, the run directory, seeds, the shards' capacity and rate limits) are
refused in a role's table, with the `[fleet]` key that sets them named in the message.

TLS is one identity per machine, not per role: `[fleet]` tls_cert, tls_key and tls_ca go to every role the machine
runs (a role's table may not set them), so the shards and the learner's parameter service serve TLS with the
certificate and every client (actors, evaluator, learner, the launcher's health checks) verifies them with the CA
and presents the same certificate. A CA makes the servers require client certificates: a fleet with its own CA
runs mutual TLS. The paths are read on each machine; where a machine keeps its files elsewhere, its
`apexrl launch --tls-cert PATH ...` overrides the file. The certificate must name every address it is dialled at:
127.0.0.1 (roles on one machine reach each other on loopback) and the machine's `[hosts]` address or name, or
else `[fleet] tls_server_name`, which every client then checks instead of the address it dials. A server's
`health_port` serves only gRPC health, in plaintext, for probes that cannot do TLS; the launcher then checks that
server's health there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from apexrl.actor.config import ActorConfig
from apexrl.common.addresses import check_host
from apexrl.common.settings import SettingsError, coerce_table
from apexrl.launcher.fleet_config import (
    ActorGroup,
    ConfigError,
    EvaluatorSpec,
    FleetConfig,
    FleetSettings,
    LearnerSpec,
    ShardSpec,
)
from apexrl.launcher.topology import validate
from apexrl.learner.config import LearnerConfig
from apexrl.replay_server.server.config import ReplayConfig

_TOP_KEYS = ("fleet", "hosts", "shard", "learner", "actors", "evaluator")


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
                raise ConfigError(
                    f"{path}: reading TOML needs Python 3.11+ or 'pip install tomli'; "
                    f"or write the fleet file in YAML (.yaml)"
                ) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from err
    try:
        return parse_config(data if data is not None else {})
    except SettingsError as err:
        raise ConfigError(f"{path}: {err}") from None


def parse_config(data: Mapping[str, Any], *, picked_ports: bool = False) -> FleetConfig:
    """Validate a parsed fleet file (see the module docstring for the schema). With `picked_ports` (a fleet
    recorded by the launcher, `launcher/resume.py`), a shard or learner without a port gets one picked at launch,
    as in the local fleet; a fleet file must fix them, as other machines connect to them."""
    try:
        return _parse(data, picked_ports)
    except ConfigError:
        raise
    except SettingsError as err:
        raise ConfigError(str(err)) from None


def _parse(data: Mapping[str, Any], picked_ports: bool) -> FleetConfig:
    """The fleet file's tables, read and checked one at a time in the file's order (the first error found is the
    one reported), then the fleet as a whole."""
    _table(data, "the fleet file")
    unknown = sorted(set(map(str, data)) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(
            f"the fleet file: unknown table{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} (allowed: {', '.join(_TOP_KEYS)})"
        )
    fleet = _fleet_settings(data)
    hosts = _hosts(data)
    shards = _shards(data, picked_ports)
    learner = _learner(data, picked_ports)
    actors = _actors(data)
    evaluator = _evaluator(data)
    config = FleetConfig(
        shards=tuple(shards), learner=learner, actors=tuple(actors), evaluator=evaluator, hosts=hosts, **fleet
    )
    validate(config)
    return config


def _fleet_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """The [fleet] table's settings, checked as FleetSettings so that an error names the table."""
    fleet = coerce_table(
        FleetSettings, _table(data.get("fleet", {}), "[fleet]"), "[fleet]", allow_wiring=True
    )
    try:
        FleetSettings(**fleet)
    except SettingsError as err:
        raise ConfigError(f"[fleet]: {err}") from None
    return fleet


def _hosts(data: Mapping[str, Any]) -> dict[str, str]:
    """The [hosts] table: host name -> the address other machines dial it at."""
    hosts_table = _table(data.get("hosts", {}), "[hosts]")
    return {str(name): _host_address(address, f"[hosts] {name}") for name, address in hosts_table.items()}


def _shards(data: Mapping[str, Any], picked_ports: bool) -> list[ShardSpec]:
    """The [[shard]] tables (at least one); each fixes its port unless the launcher picks it (`picked_ports`)."""
    shards = []
    for i, entry in enumerate(_array(data.get("shard"), "[[shard]]", required=True)):
        where = f"[[shard]] #{i}"
        entry = _table(entry, where)
        settings = coerce_table(ReplayConfig, entry, where, placement=("host", "port", "metrics_port"))
        shards.append(
            ShardSpec(
                _host(entry, where),
                _port(entry, "port", where, required=not picked_ports) or 0,
                _port(entry, "metrics_port", where),
                settings,
            )
        )
    return shards


def _learner(data: Mapping[str, Any], picked_ports: bool) -> LearnerSpec:
    """The [learner] table (exactly one); it fixes its port unless the launcher picks it (`picked_ports`)."""
    if "learner" not in data:
        raise ConfigError("missing [learner] table (exactly one learner; it hosts the parameter service)")
    entry = _table(data["learner"], "[learner]")
    settings = coerce_table(LearnerConfig, entry, "[learner]", placement=("host", "port", "metrics_port"))
    return LearnerSpec(
        _host(entry, "[learner]"),
        _port(entry, "port", "[learner]", required=not picked_ports),
        _port(entry, "metrics_port", "[learner]"),
        settings,
    )


def _actors(data: Mapping[str, Any]) -> list[ActorGroup]:
    """The [[actors]] groups (at least one); a group without first_index follows the previous one."""
    actors = []
    next_index = 0
    for i, entry in enumerate(_array(data.get("actors"), "[[actors]]", required=True)):
        where = f"[[actors]] #{i}"
        entry = _table(entry, where)
        settings = coerce_table(
            ActorConfig, entry, where, placement=("host", "count", "first_index", "metrics_port")
        )
        if "count" not in entry:
            raise ConfigError(f"{where}: missing 'count' (actors in this group)")
        count = _integer(entry["count"], f"{where} count", minimum=1)
        first = (
            _integer(entry["first_index"], f"{where} first_index", minimum=0)
            if "first_index" in entry
            else next_index
        )
        metrics_port = _port(entry, "metrics_port", where)
        if metrics_port is not None and metrics_port + count - 1 > 65535:
            raise ConfigError(
                f"{where}: metrics ports {metrics_port}..{metrics_port + count - 1} exceed 65535"
            )
        actors.append(ActorGroup(_host(entry, where), count, first, metrics_port, settings))
        next_index = first + count
    return actors


def _evaluator(data: Mapping[str, Any]) -> EvaluatorSpec | None:
    """The optional [evaluator] table."""
    if "evaluator" not in data:
        return None
    entry = _table(data["evaluator"], "[evaluator]")
    settings = coerce_table(ActorConfig, entry, "[evaluator]", placement=("host", "metrics_port"))
    return EvaluatorSpec(_host(entry, "[evaluator]"), _port(entry, "metrics_port", "[evaluator]"), settings)


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(value).__name__} {value!r}")
    return value


def _array(value: Any, where: str, *, required: bool) -> Sequence[Mapping[str, Any]]:
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
        raise ConfigError(
            f"{where}: missing 'host' (the name passed as --host-name on the machine that runs it)"
        )
    return _string(entry["host"], f"{where} host")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _host_address(value: Any, where: str) -> str:
    """A `[hosts]` entry: a host name or an IP address (no port: each role's table gives it)."""
    try:
        check_host(value, where)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return value


def _integer(value: Any, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} ({value}) must be at least {minimum}")
    return value


def _port(entry: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    if key not in entry:
        if required:
            raise ConfigError(f"{where}: missing '{key}' (other machines connect to it, so it must be fixed)")
        return None
    port = _integer(entry[key], f"{where} {key}")
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where} {key} ({port}) must be in 1..65535")
    return port

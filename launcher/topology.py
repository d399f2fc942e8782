"""Which processes a fleet has, which machine runs each, and how they find each other: pure functions of a
FleetConfig (no processes, no sockets), and `local_fleet`, the fleet with every role on this machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apexrl.launcher.fleet_config import (
    LOCAL_HOST,
    ActorGroup,
    ConfigError,
    EvaluatorSpec,
    FleetConfig,
    LearnerSpec,
    ShardSpec,
)

# Interfaces on which a service is reachable from its own machine as 127.0.0.1.
_ANY_OR_LOOPBACK = {"0.0.0.0", "::", "127.0.0.1", "localhost"}


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


@dataclass(frozen=True)
class Wiring:
    """Where the roles of one machine find the services: addresses as seen from that machine."""

    replay: tuple[str, ...]
    params: str


def roles(config: FleetConfig) -> list[Role]:
    """Every process of the fleet in start order: shards, learner, actors (by index), evaluator."""
    result = [
        Role(f"shard-{i}", "replay", s.host, i, s.port, s.metrics_port) for i, s in enumerate(config.shards)
    ]
    learner = config.learner
    result.append(Role("learner", "learner", learner.host, 0, learner.port, learner.metrics_port))
    actors = []
    for group in config.actors:
        for k in range(group.count):
            metrics = None if group.metrics_port is None else group.metrics_port + k
            index = group.first_index + k
            actors.append(Role(f"actor-{index}", "actor", group.host, index, None, metrics))
    result += sorted(actors, key=lambda r: r.index)
    if config.evaluator is not None:
        result.append(
            Role("evaluator", "evaluator", config.evaluator.host, 0, None, config.evaluator.metrics_port)
        )
    return result


def validate(config: FleetConfig) -> None:
    """Checks across roles: actor indices tile 0..N-1, no port used twice on one host, evaluator placement."""
    taken: dict[int, str] = {}
    for i, group in enumerate(config.actors):
        for index in range(group.first_index, group.first_index + group.count):
            if index in taken:
                raise ConfigError(f"[[actors]] #{i}: actor index {index} is also in {taken[index]}")
            taken[index] = f"[[actors]] #{i}"
    missing = sorted(set(range(config.num_actors)) - set(taken))
    if missing:
        raise ConfigError(
            f"actor indices must be 0..{config.num_actors - 1} without gaps (the Ape-X epsilons are "
            f"spread over them); missing {missing}, groups cover {sorted(taken)}"
        )
    if config.evaluator is not None and config.evaluator.host != config.learner.host:
        raise ConfigError(
            f"[evaluator] host ({config.evaluator.host!r}) must be the learner's host "
            f"({config.learner.host!r}): the learner's machine reads the evaluation episodes to "
            f"check the target return"
        )
    used: dict[tuple[str, int], str] = {}
    for role in roles(config):
        spec = (
            config.shards[role.index]
            if role.kind == "replay"
            else config.learner
            if role.kind == "learner"
            else None
        )
        health_port = spec.settings.get("health_port") if spec is not None else None
        for key, port in (
            ("port", role.port),
            ("metrics_port", role.metrics_port),
            ("health_port", health_port),
        ):
            if not port:  # None or 0: picked at launch
                continue
            owner = f"{role.name} ({key})"
            if (role.host, port) in used:
                raise ConfigError(
                    f"port {port} on host {role.host!r} is used by both {used[role.host, port]} and {owner}"
                )
            used[role.host, port] = owner


def local_fleet(
    *, num_shards: int = 2, num_actors: int = 4, evaluator: bool = True, **settings: Any
) -> FleetConfig:
    """Every role on this machine, listening on 127.0.0.1; shards pick free ports and report them in port files,
    the launcher picks the other ports."""
    for name, value in (("num_shards", num_shards), ("num_actors", num_actors)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not isinstance(evaluator, bool):
        raise ConfigError(f"evaluator must be a boolean (true or false), got {evaluator!r}")
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
        hosts={LOCAL_HOST: "127.0.0.1"},
        **{"bind": "127.0.0.1", **settings},
    )
    validate(config)
    return config


def host_names(config: FleetConfig) -> list[str]:
    """The machines named in the fleet, in order of first appearance."""
    return list(dict.fromkeys(role.host for role in roles(config)))


def roles_on(config: FleetConfig, host: str) -> list[Role]:
    """The roles `apexrl launch --host-name HOST` starts; ConfigError when HOST runs none."""
    mine = [role for role in roles(config) if role.host == host]
    if not mine:
        raise ConfigError(
            f"no role of the fleet runs on host {host!r}; hosts in the fleet: {', '.join(host_names(config))}"
        )
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
    if not config.learner.port:
        raise ConfigError("the learner has no port yet")
    return Wiring(
        replay=tuple(address(config, s.host, s.port, from_host) for s in config.shards),
        params=address(config, config.learner.host, config.learner.port, from_host),
    )


def with_ports(
    config: FleetConfig, *, shard_ports: Mapping[int, int] | None = None, params_port: int | None = None
) -> FleetConfig:
    """A copy with the ports the launcher learnt (port files) or picked filled in."""
    shards = list(config.shards)
    for i, port in (shard_ports or {}).items():
        shards[i] = dataclasses.replace(shards[i], port=port)
    learner = config.learner
    if params_port is not None:
        learner = dataclasses.replace(learner, port=params_port)
    return dataclasses.replace(config, shards=tuple(shards), learner=learner)

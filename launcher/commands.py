"""The command line of every role, derived from the role's own settings dataclass: the launcher fills in what it
wires (addresses, ports, seeds, the run directory, the shards' share of the replay) over the role's fleet-file
settings, and `to_argv` writes the flags. `check_commands` parses every local role's command exactly as the role
will, so a bad setting is refused before any process starts.

The bearer token is never on a command line (every local user reads /proc/PID/cmdline): `command` leaves it out
and `environment` gives it to the role as APEXRL_TOKEN.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from apexrl.actor.config import ActorConfig
from apexrl.actor.nstep import replay_signature
from apexrl.algorithms.registry import AUTO, for_action_kind, get, with_defaults
from apexrl.common.env_settings import EnvChoice
from apexrl.common.process import TOKEN_VARIABLE
from apexrl.common.settings import SettingsError, parse_argv, to_argv
from apexrl.common.signature import Signature
from apexrl.launcher.fleet_config import (
    ATARI_EVALUATION_EPISODES,
    DEFAULT_EVALUATION_EPISODES,
    ConfigError,
    FleetConfig,
)
from apexrl.launcher.topology import Role, Wiring, roles_on
from apexrl.learner.config import LearnerConfig
from apexrl.replay_server.config import ReplayConfig

# Role kind -> (apexrl subcommand, its settings dataclass).
SUBCOMMANDS: dict[str, tuple[str, type]] = {
    "replay": ("replay", ReplayConfig),
    "learner": ("learner", LearnerConfig),
    "actor": ("actor", ActorConfig),
    "evaluator": ("actor", ActorConfig),
}


def evaluation_episodes(config: FleetConfig) -> int:
    """Episodes per evaluator round: the fleet's setting, else 100 (10 for Atari: see FleetSettings)."""
    if config.evaluation_episodes is not None:
        return config.evaluation_episodes
    from apexrl.common.environments import is_atari

    return ATARI_EVALUATION_EPISODES if is_atari(config.env) else DEFAULT_EVALUATION_EPISODES


@functools.lru_cache(maxsize=16)
def action_kind(env: EnvChoice) -> str | None:
    """DISCRETE or BOX: the action space of `env` (made once); None on a machine without gymnasium (a shards-only
    machine may lack it); ConfigError when the environment cannot be made or played."""
    try:
        from apexrl.common.environments import env_spaces
    except ImportError:
        return None
    try:
        return env_spaces(env).action_kind
    except ValueError as err:
        raise ConfigError(f"--env: {err}") from None


@functools.lru_cache(maxsize=16)
def built_in_signature(env: EnvChoice, compression: str | None) -> Signature | None:
    """The table signature the built-in actor writes for `env` (actor/nstep.py `replay_signature`); None on a
    machine without gymnasium (a shards-only machine: its shards then take the first insert's columns)."""
    try:
        from apexrl.common.environments import env_spaces
    except ImportError:
        return None
    try:
        return replay_signature(env_spaces(env), compression)
    except ValueError as err:
        raise ConfigError(f"--env: {err}") from None


def pinned_signature(config: FleetConfig, shard_settings: Mapping[str, Any]) -> Signature | None:
    """The signature a shard of this fleet is started with: its own `signature` setting, else what the fleet's
    actors write when they all write the same (one compression setting), so that no first insert fixes the
    columns (with roles on, an actor may not; docs/security.md); None without built-in actors."""
    if shard_settings.get("signature") is not None:
        return shard_settings["signature"]
    compressions = {
        group.settings.get("compress", ActorConfig.compress) for group in config.actors if group.count > 0
    }
    if len(compressions) != 1:
        return None
    return built_in_signature(EnvChoice.of(config), compressions.pop())


def with_algorithm(config: FleetConfig) -> FleetConfig:
    """`config` with its algorithm named (auto: by the environment's action space) and the algorithm's fleet
    defaults (replay_capacity, samples_per_insert) filled in where none were given; ConfigError for an algorithm
    that cannot play the environment (--algorithm dqn on a Box). Idempotent."""
    kind = action_kind(EnvChoice.of(config))
    try:
        if config.algorithm == AUTO:
            if kind is None:
                raise ValueError(
                    f"cannot read {config.env}'s action space on this machine (no gymnasium): set "
                    f"[fleet] algorithm (dqn or dpg) so that every machine agrees on its defaults"
                )
            algorithm = for_action_kind(AUTO, kind, config.env)
            config = dataclasses.replace(config, algorithm=algorithm.name)
        else:
            algorithm = get(config.algorithm)
            if kind is not None:
                for_action_kind(config.algorithm, kind, config.env)
        return with_defaults(config, algorithm, "fleet")
    except ValueError as err:
        raise ConfigError(f"--algorithm: {err}") from None


def role_config(config: FleetConfig, role: Role, links: Wiring, run_dir: Path) -> Any:
    """The settings dataclass of `role`: its fleet-file settings with the launcher's wiring on top. Its ports
    must be concrete (0 is allowed for a shard: it reports the port it got in its port file). Every role gets
    the machine's TLS files ([fleet] tls_cert, tls_key, tls_ca), every role that dials also tls_server_name."""
    config = with_algorithm(config)
    seed = config.seed
    metrics = role.metrics_port if role.metrics_port is not None else -1
    tls = {"tls_cert": config.tls_cert, "tls_key": config.tls_key, "tls_ca": config.tls_ca}
    client_tls = {**tls, "tls_server_name": config.tls_server_name}
    try:
        if role.kind == "replay":
            shard_settings = config.shards[role.index].settings
            return ReplayConfig(
                **{**shard_settings, "signature": pinned_signature(config, shard_settings)},
                **tls,
                **({} if config.role_tokens is None else {"role_tokens": config.role_tokens}),
                host=config.bind,
                port=role.port or 0,
                metrics_port=metrics,
                capacity=config.shard_capacity,
                min_size_to_sample=config.shard_min_size,
                samples_per_insert=config.samples_per_insert,
                # Let each side run ahead by a few learner batches before it waits.
                samples_per_insert_tolerance=float(max(1024, 4 * config.shard_min_size)),
                seed=None if seed is None else seed + role.index,
                port_file=str(run_dir / "ports" / f"{role.name}.port"),
            )
        if role.kind == "learner":
            return LearnerConfig(
                **config.learner.settings,
                **client_tls,
                replay=links.replay,
                env=config.env,
                env_module=config.env_module,
                env_kwargs=config.env_kwargs,
                algorithm=config.algorithm,
                run_dir=str(run_dir),
                seed=seed,
                host=config.bind,
                port=role.port or 0,
                metrics_port=metrics,
                min_replay_size=config.shard_min_size * len(config.shards),
                **({} if config.role_tokens is None else {"role_tokens": config.role_tokens}),
            )
        if role.kind in ("actor", "evaluator"):
            evaluate = role.kind == "evaluator"
            if evaluate:
                settings = {
                    "num_envs": evaluation_episodes(config),
                    **(config.evaluator.settings if config.evaluator else {}),
                }
            else:
                settings = next(
                    g.settings for g in config.actors if g.first_index <= role.index < g.first_index + g.count
                )
            return ActorConfig(
                **settings,
                **client_tls,
                params=links.params,
                replay=links.replay,
                actor_index=role.index,
                num_actors=config.num_actors,
                env=config.env,
                env_module=config.env_module,
                env_kwargs=config.env_kwargs,
                algorithm=config.algorithm,
                evaluate=evaluate,
                episodes_csv=str(
                    run_dir / "episodes" / ("evaluator.csv" if evaluate else f"actor-{role.index}.csv")
                ),
                seed=None if seed is None else seed + (999 if evaluate else 1000 + role.index),
                host=config.bind,
                metrics_port=metrics,
            )
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{role.name}: {err}") from None
    raise ValueError(f"unknown role kind {role.kind!r}")


def command(
    config: FleetConfig, role: Role, links: Wiring, run_dir: Path, extra_args: Sequence[str] = ()
) -> list[str]:
    """The `apexrl ...` arguments (after the program name) that run `role`; pass-through args come last. A token
    in the role's table is left out: `environment` carries it."""
    subcommand, _ = SUBCOMMANDS[role.kind]
    settings = dataclasses.replace(role_config(config, role, links, run_dir), token=None)
    return [subcommand, *to_argv(settings), *extra_args]


def environment(
    config: FleetConfig, role: Role, links: Wiring, run_dir: Path, base: Mapping[str, str]
) -> dict[str, str]:
    """The environment of `role`'s process: `base` with APEXRL_TOKEN set to the token of the role's table, else
    the fleet's (resolved by then: `common.process.with_token`), and without it when there is none. In role mode
    (role_tokens) each client role gets its own role's token and the shards none (they read the directory)."""
    if config.role_tokens is not None:
        token = (
            None
            if role.kind == "replay"
            else config.role_token(role.kind, role.index if role.kind == "actor" else None)
        )
    else:
        token = role_config(config, role, links, run_dir).token or config.token
    env = {k: v for k, v in base.items() if k != TOKEN_VARIABLE}
    return {**env, TOKEN_VARIABLE: token} if token else env


def check_commands(config: FleetConfig, host: str, run_dir: Path, extra_args: dict[str, list[str]]) -> None:
    """Parse every command `host` would run, as the role itself will (placeholder ports where the launcher picks
    them at start); ConfigError naming the role and the bad flag or value."""
    placeholder = Wiring(
        replay=tuple(f"127.0.0.1:{7000 + i}" for i in range(len(config.shards))), params="127.0.0.1:7100"
    )
    for role in roles_on(config, host):
        role = dataclasses.replace(role, port=role.port or 1)
        argv = command(config, role, placeholder, run_dir, extra_args_for(role.kind, extra_args))
        subcommand, cls = SUBCOMMANDS[role.kind]
        try:
            parsed = parse_argv(cls, argv[1:], prog=f"apexrl {subcommand} ({role.name})")
            if parsed.token is not None:  # only a pass-through arg can put it there: `command` leaves it out
                raise ConfigError(
                    f"--token in a pass-through arg would put the token on the command line and "
                    f"in config.json; give it to apexrl launch (--token-file, {TOKEN_VARIABLE} or "
                    f"[fleet] token_file)"
                )
            if role.kind != "replay":  # the same check the role makes: no setting another algorithm owns
                with_defaults(parsed, get(parsed.algorithm), "learner" if role.kind == "learner" else "actor")
        except SettingsError as err:
            raise ConfigError(f"{role.name}: {err}") from None
        except ValueError as err:
            raise ConfigError(f"{role.name}: {err}") from None


def extra_args_for(kind: str, extra_args: dict[str, list[str]]) -> list[str]:
    """The pass-through args of a role kind; --actor-arg reaches the evaluator too, before its own."""
    extra = list(extra_args.get(kind, ()))
    if kind == "evaluator":
        extra = list(extra_args.get("actor", ())) + extra
    return extra

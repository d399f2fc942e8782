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
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from apexrl.actor.config import ActorConfig
from apexrl.algorithms.checkpoint_files import KEPT_POLICY_NAME
from apexrl.algorithms.registry import AUTO, SPACE_NAMES, for_action_kind, for_spaces, get, with_defaults
from apexrl.common.env_settings import EnvChoice
from apexrl.common.process import TOKEN_VARIABLE
from apexrl.common.settings import parse_argv, to_argv
from apexrl.common.signature import Signature
from apexrl.launcher.fleet_config import (
    ATARI_EVALUATION_EPISODES,
    DEFAULT_EVALUATION_EPISODES,
    REPLAY_OFF,
    REPLAY_WAL,
    ConfigError,
    FleetConfig,
)
from apexrl.launcher.topology import Role, Wiring, roles_on
from apexrl.learner.config import LearnerConfig
from apexrl.replay_server.server.config import ReplayConfig

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


def target_return(config: FleetConfig) -> float | None:
    """The return the run is solved at: [fleet] target_return, else the environment's reward_threshold (None when
    neither gives one: the run goes on until max_seconds)."""
    if config.target_return is not None:
        return config.target_return
    from apexrl.common.environments import reward_threshold

    return reward_threshold(EnvChoice.of(config))


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
def built_in_signature(env: EnvChoice, compression: str | None, algorithm: str = AUTO) -> Signature | None:
    """The table signature the built-in actor writes for `env` with `algorithm` (its writing half's
    `replay_signature`); None on a machine without gymnasium (a shards-only machine: its shards then take the
    first insert's columns)."""
    try:
        from apexrl.common.environments import env_spaces
    except ImportError:
        return None
    try:
        spaces = env_spaces(env)
        return for_spaces(algorithm, spaces, env.id).writing().replay_signature(spaces, compression)
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
    return built_in_signature(EnvChoice.of(config), compressions.pop(), config.algorithm)


def sequence_table(config: FleetConfig, shard_settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a shard of a fleet whose algorithm writes sequences (R2D2) is started with besides its signature: the
    longest window (max_sequence_length) and the windows' fields (item_signature), from the actors' and the
    learner's settings; nothing for an algorithm that writes transitions, or what the shard's own table sets.
    ConfigError where this machine cannot tell them (no gymnasium to read the environment's spaces)."""
    if config.algorithm == AUTO:  # auto never picks an algorithm of sequences
        return {}
    writing = get(config.algorithm).writing()
    if not getattr(writing, "SEQUENCES", False) or shard_settings.get("max_sequence_length"):
        return {}
    try:
        from apexrl.common.environments import env_spaces

        spaces = env_spaces(EnvChoice.of(config))
    except ImportError:
        raise ConfigError(
            f"{config.algorithm} writes sequences, and this machine cannot tell their length and fields without "
            f"gymnasium: install apexrl's training extra here, or set [[shard]] max_sequence_length and "
            f"item_signature"
        ) from None
    except ValueError as err:
        raise ConfigError(f"--env: {err}") from None
    gamma = next(f.default for f in dataclasses.fields(ActorConfig) if f.name == "gamma")
    actor = types.SimpleNamespace(**{"gamma": gamma, **_sequence_geometry_settings(config)})
    learner = types.SimpleNamespace(
        **{k: v for k, v in config.learner.settings.items() if k in ("network", "lstm_size")}
    )
    try:
        return writing.table_settings(actor, learner, spaces)
    except ValueError as err:  # e.g. a period longer than the window
        raise ConfigError(f"[[actors]]: {err}") from None


def _sequence_geometry_settings(config: FleetConfig) -> dict[str, Any]:
    """The windows' settings the actors' tables give (burn_in, train_length, sequence_period, gamma), the same for
    every group (ConfigError otherwise: the shards and the learner take one)."""
    names = ("burn_in", "train_length", "sequence_period", "gamma")
    given = {tuple((n, g.settings.get(n)) for n in names) for g in config.actors}
    if len(given) > 1:
        raise ConfigError(
            f"every [[actors]] group must give the same {', '.join(names)} (sequences of one length)"
        )
    return {n: v for n, v in next(iter(given)) if v is not None}


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


def describe_algorithm(
    config: FleetConfig, host: str, run_dir: Path, extra_args: Mapping[str, Sequence[str]]
) -> str:
    """The launch line's account of the algorithm: its name, why (auto: the action space; each space has one
    algorithm, so one named explicitly reads the same), and the values of the learner settings only it reads,
    named as `apexrl learner --help` names them: "dpg (auto: Box actions), TD3 options: twin_critics on,
    policy_delay 2, target_noise 0.2, target_noise_clip 0.5". The values are the learner's command line's when this
    machine runs the learner (pass-through args included), else its table's over the algorithm's defaults."""
    try:
        config = with_algorithm(config)
        algorithm = get(config.algorithm)
    except ValueError as err:  # refused before a launch: only a caller that skipped the checks gets here
        return f"{config.algorithm} ({err})"
    kind = action_kind(EnvChoice.of(config))
    if kind is None:  # no gymnasium here: the fleet file names it
        why = "[fleet] algorithm"
    else:
        auto = for_action_kind(AUTO, kind).name == algorithm.name
        why = f"{'auto' if auto else 'named'}: {SPACE_NAMES[kind]} actions"
    own = algorithm.own_settings("learner")
    if not own:
        return f"{algorithm.name} ({why})"
    table = {**algorithm.defaults.get("learner", {}), **config.learner.settings}
    values = {name: table.get(name) for name in own}
    try:
        for role, settings in parsed_commands(
            config, host, run_dir, {k: list(v) for k, v in extra_args.items()}
        ):
            if role.kind == "learner":
                learner = with_defaults(settings, algorithm, "learner")
                values = {name: getattr(learner, name) for name in own}
    except ValueError:  # refused before a launch; the table's values still tell what was chosen
        pass
    shown = ", ".join(f"{name} {_option_text(value)}" for name, value in values.items() if value is not None)
    return f"{algorithm.name} ({why}), {algorithm.options_label}: {shown}"


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return format(value, "g") if isinstance(value, float) else str(value)


def replay_directories(config: FleetConfig, role: Role, run_dir: Path) -> dict[str, str]:
    """The directories [fleet] replay_durability gives shard `role`: its checkpoint_dir RUN_DIR/replay/shard-I, and
    with wal its write-ahead log in wal/ there; none when it is off."""
    if config.replay_durability == REPLAY_OFF:
        return {}
    directory = run_dir / "replay" / role.name
    return {
        "checkpoint_dir": str(directory),
        **({"wal": str(directory / "wal")} if config.replay_durability == REPLAY_WAL else {}),
    }


def role_config(config: FleetConfig, role: Role, links: Wiring, run_dir: Path) -> Any:
    """The settings dataclass of `role`: its fleet-file settings with the launcher's wiring on top. Its ports
    must be concrete (0 is allowed for a shard: it reports the port it got in its port file). Every role gets
    the machine's TLS files ([fleet] tls_cert, tls_key, tls_ca), every role that dials also tls_server_name."""
    config = with_algorithm(config)
    try:
        if role.kind == "replay":
            return _replay_config(config, role, run_dir)
        if role.kind == "learner":
            return _learner_config(config, role, links, run_dir)
        if role.kind in ("actor", "evaluator"):
            return _actor_config(config, role, links, run_dir)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{role.name}: {err}") from None
    raise ValueError(f"unknown role kind {role.kind!r}")


def _tls_files(config: FleetConfig) -> dict[str, str | None]:
    """The machine's TLS files, which every role gets; a role that dials also gets `_client_tls`."""
    return {"tls_cert": config.tls_cert, "tls_key": config.tls_key, "tls_ca": config.tls_ca}


def _client_tls(config: FleetConfig) -> dict[str, str | None]:
    """A dialing role's TLS settings: the machine's files and the name it checks on the servers' certificates."""
    return {**_tls_files(config), "tls_server_name": config.tls_server_name}


def _metrics_port(role: Role) -> int:
    """The role's /metrics port; -1 (no metrics server) when the topology gives it none."""
    return role.metrics_port if role.metrics_port is not None else -1


def _role_tokens(config: FleetConfig) -> dict[str, str]:
    """[fleet] role_tokens for the roles that serve, when set (else the role's own table's setting stands)."""
    return {} if config.role_tokens is None else {"role_tokens": config.role_tokens}


def _replay_config(config: FleetConfig, role: Role, run_dir: Path) -> ReplayConfig:
    """A shard's settings: its table's, its pinned signature, its share of the fleet's replay, its directories."""
    shard_settings = config.shards[role.index].settings
    return ReplayConfig(
        **{**shard_settings, "signature": pinned_signature(config, shard_settings)},
        **sequence_table(config, shard_settings),
        **_tls_files(config),
        **_role_tokens(config),
        **replay_directories(config, role, run_dir),
        host=config.bind,
        port=role.port or 0,
        metrics_port=_metrics_port(role),
        capacity=config.shard_capacity,
        min_size_to_sample=config.shard_min_size,
        samples_per_insert=config.samples_per_insert,
        # Let each side run ahead by a few learner batches before it waits.
        samples_per_insert_tolerance=float(max(1024, 4 * config.shard_min_size)),
        seed=None if config.seed is None else config.seed + role.index,
        port_file=str(run_dir / "ports" / f"{role.name}.port"),
    )


def _learner_config(config: FleetConfig, role: Role, links: Wiring, run_dir: Path) -> LearnerConfig:
    """The learner's settings: its table's ([fleet] device over it), the shards it samples, the run directory."""
    device = {} if config.device is None else {"device": config.device}  # over the [learner] table's
    return LearnerConfig(
        **{**config.learner.settings, **device},
        **_client_tls(config),
        replay=links.replay,
        env=config.env,
        env_module=config.env_module,
        env_kwargs=config.env_kwargs,
        algorithm=config.algorithm,
        run_dir=str(run_dir),
        seed=config.seed,
        host=config.bind,
        port=role.port or 0,
        metrics_port=_metrics_port(role),
        min_replay_size=config.shard_min_size * len(config.shards),
        **_role_tokens(config),
        **learner_sequences(config),
    )


def learner_sequences(config: FleetConfig) -> dict[str, Any]:
    """For a learner of sequences (R2D2), what its algorithm's writing gives that the [learner] table does not set
    (the actors' burn-in: both cut the same windows; its batch of sequences)."""
    if config.algorithm == AUTO:  # auto never picks an algorithm of sequences
        return {}
    writing = get(config.algorithm).writing()
    if not getattr(writing, "SEQUENCES", False):
        return {}
    given = writing.learner_settings(_sequence_geometry_settings(config))
    return {k: v for k, v in given.items() if config.learner.settings.get(k) is None}


def _actor_config(config: FleetConfig, role: Role, links: Wiring, run_dir: Path) -> ActorConfig:
    """An exploring actor's or the evaluator's settings: its table's, the services it dials, its episodes file
    and a seed of its own."""
    evaluate = role.kind == "evaluator"
    return ActorConfig(
        **_actor_settings(config, role, run_dir),
        **_client_tls(config),
        params=links.params,
        replay=links.replay,
        actor_index=role.index,
        num_actors=config.num_actors,
        env=config.env,
        env_module=config.env_module,
        env_kwargs=config.env_kwargs,
        algorithm=config.algorithm,
        evaluate=evaluate,
        episodes_csv=str(run_dir / "episodes" / ("evaluator.csv" if evaluate else f"actor-{role.index}.csv")),
        seed=None if config.seed is None else config.seed + (999 if evaluate else 1000 + role.index),
        host=config.bind,
        metrics_port=_metrics_port(role),
    )


def _actor_settings(config: FleetConfig, role: Role, run_dir: Path) -> dict[str, Any]:
    """An actor's fleet-file table (its [[actors]] group's); the evaluator's: one round's episodes over its
    [evaluator] table, where to keep the weights it scored, and the target it checks."""
    if role.kind == "evaluator":
        return {
            "num_envs": evaluation_episodes(config),
            **(config.evaluator.settings if config.evaluator else {}),
            # The weights it scored, kept where evaluate/load_policy/export look first (kept_policy.py).
            "keep_policy": str(run_dir / "checkpoints" / KEPT_POLICY_NAME),
            "target_return": target_return(config),
        }
    return next(g.settings for g in config.actors if g.first_index <= role.index < g.first_index + g.count)


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
    them at start); ConfigError naming the role and the bad flag or value, or two shards that would share a
    directory."""
    parsed = parsed_commands(config, host, run_dir, extra_args)
    for role, settings in parsed:
        try:
            # Only a pass-through arg can put a token there: `command` leaves it out.
            if settings.token is not None:
                raise ConfigError(
                    f"--token in a pass-through arg would put the token on the command line and "
                    f"in config.json; give it to apexrl launch (--token-file, {TOKEN_VARIABLE} or "
                    f"[fleet] token_file)"
                )
            if role.kind != "replay":  # the same check the role makes: no setting another algorithm owns
                with_defaults(
                    settings, get(settings.algorithm), "learner" if role.kind == "learner" else "actor"
                )
                if config.role_tokens is not None:  # the token it will present: this machine must hold it
                    config.role_token(role.kind, role.index if role.kind == "actor" else None)
            elif config.role_tokens is not None and settings.signature is None:
                raise ConfigError(
                    f"in role mode an actor may not fix a shard's columns by its first insert, and this machine "
                    f"cannot tell them ({config.env}'s spaces need gymnasium here): set [[shard]] signature (`apexrl "
                    f"signature --env {config.env} --algorithm {config.algorithm}` prints it) or install apexrl's "
                    f"training extra on this machine"
                )
        except ValueError as err:  # SettingsError and ConfigError too
            raise ConfigError(f"{role.name}: {err}") from None
    check_shard_directories(config, run_dir, parsed)


def parsed_commands(
    config: FleetConfig, host: str, run_dir: Path, extra_args: dict[str, list[str]]
) -> list[tuple[Role, Any]]:
    """Every role of `host` with its settings as its command parses them (placeholder ports where the launcher
    picks them at start); ConfigError naming the role and the bad flag or value."""
    placeholder = Wiring(
        replay=tuple(f"127.0.0.1:{7000 + i}" for i in range(len(config.shards))), params="127.0.0.1:7100"
    )
    parsed = []
    for role in roles_on(config, host):
        role = dataclasses.replace(role, port=role.port or 1)
        argv = command(config, role, placeholder, run_dir, extra_args_for(role.kind, extra_args))
        subcommand, cls = SUBCOMMANDS[role.kind]
        try:
            parsed.append((role, parse_argv(cls, argv[1:], prog=f"apexrl {subcommand} ({role.name})")))
        except ValueError as err:
            raise ConfigError(f"{role.name}: {err}") from None
    return parsed


def check_shard_directories(config: FleetConfig, run_dir: Path, parsed: Sequence[tuple[Role, Any]]) -> None:
    """ConfigError when two local shards would share a checkpoint or write-ahead-log directory (each would write
    checkpoint files of the same names over the other's; `apexrl replay` refuses a directory another shard holds),
    or when a --replay-arg moves a shard away from the directory [fleet] replay_durability gives it."""
    held: dict[Path, str] = {}
    for role, settings in parsed:
        if role.kind != "replay":
            continue
        wired = replay_directories(config, role, run_dir)
        for key in ("checkpoint_dir", "wal"):
            value, flag = getattr(settings, key), "--" + key.replace("_", "-")
            if wired and value != wired.get(key):
                raise ConfigError(
                    f"{role.name}: {flag} {value} (a --replay-arg) and [fleet] replay_durability "
                    f"{config.replay_durability!r} ({flag} {wired.get(key)}) disagree: drop one of them"
                )
            if value is None:
                continue
            other = held.setdefault(Path(value).resolve(), role.name)
            if other != role.name:
                raise ConfigError(
                    f"{other} and {role.name} would share the directory {value} ({flag}): one shard's "
                    f"checkpoints would replace the other's; give each shard its own ([[shard]] checkpoint_dir, "
                    f"or [fleet] replay_durability, which keeps shard I's in RUN_DIR/replay/shard-I)"
                )


def extra_args_for(kind: str, extra_args: dict[str, list[str]]) -> list[str]:
    """The pass-through args of a role kind; --actor-arg reaches the evaluator too, before its own."""
    extra = list(extra_args.get(kind, ()))
    if kind == "evaluator":
        extra = list(extra_args.get("actor", ())) + extra
    return extra

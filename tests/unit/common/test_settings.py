"""Every setting is declared once: its flag, its fleet-file key, its default and its help all come from the one
dataclass field (common/settings.py). These tests read the real `--help` output and the real fleet-file parser."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys
import typing

import pytest

from apexrl.actor.config import ActorConfig
from apexrl.common.settings import (
    SettingsError,
    coerce_table,
    parse_argv,
    settable_keys,
    settings_of,
    to_argv,
)
from apexrl.common.signature import Signature
from apexrl.launcher.cli import SUBCOMMANDS
from apexrl.launcher.fleet_config import FleetSettings
from apexrl.launcher.fleet_file import parse_config
from apexrl.learner.config import LearnerConfig
from apexrl.parameter_server.config import ParamsConfig
from apexrl.replay_server.server.config import ReplayConfig
from tests.support.certs import make_certs

ROLE_CONFIGS = {
    "replay": ReplayConfig,
    "params": ParamsConfig,
    "learner": LearnerConfig,
    "actor": ActorConfig,
}
# Keys a role's fleet-file table uses for placement (which machine, which ports); the rest are its settings.
PLACEMENT = {
    "replay": ("host", "port", "metrics_port"),
    "learner": ("host", "port", "metrics_port"),
    "actor": ("host", "count", "first_index", "metrics_port"),
}
# Fields every listening process has, by the same names.
SERVER_FIELDS = ("host", "port", "metrics_port", "token", "port_file")


def config_classes():
    classes = {
        name: importlib.import_module(module).CONFIG
        for name, module in SUBCOMMANDS.items()
        if hasattr(importlib.import_module(module), "CONFIG")
    }
    assert set(ROLE_CONFIGS) <= set(classes)
    return classes


def help_text(subcommand: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", subcommand, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return " ".join(out.split())  # argparse wraps lines: compare with normalised whitespace


@pytest.mark.parametrize("subcommand", ["replay", "params", "learner", "actor", "evaluate"])
def test_every_setting_is_a_flag_with_its_default_and_help(subcommand):
    cls = config_classes()[subcommand]
    text = help_text(subcommand)
    for s in settings_of(cls):
        name = (s.metavar or s.name) if s.positional else s.flag
        assert text.count(f" {name} ") + text.count(f" {name},") >= 1, f"{name} missing from --help"
        assert " ".join(s.help.split()) in text, f"{name}: help text not shown"
        if not s.required and s.default is not None and not isinstance(s.default, bool):
            assert f"(default: {s.format(s.default)})" in text, f"{name}: default {s.default!r} not shown"


def test_launch_lists_every_fleet_setting_as_a_flag():
    text = help_text("launch")
    for s in settings_of(FleetSettings):
        assert f" {s.flag} " in text and " ".join(s.help.split()) in text, s.flag


@pytest.mark.parametrize("role", ["replay", "learner", "actor"])
def test_every_setting_is_a_fleet_key_or_says_who_sets_it(role):
    cls = ROLE_CONFIGS[role]
    for s in settings_of(cls):
        if s.name in PLACEMENT[role]:
            continue
        value = s.default if not s.required else ("127.0.0.1:1",)
        table = {s.name: list(value) if isinstance(value, tuple) else value}
        if s.wiring:
            with pytest.raises(
                SettingsError, match=re.escape(f"{s.name} is set by the launcher from {s.wiring}")
            ):
                coerce_table(cls, table, f"[{role}]", placement=PLACEMENT[role])
        else:
            assert coerce_table(cls, table, f"[{role}]", placement=PLACEMENT[role]) == {s.name: s.default}


def test_a_fleet_file_setting_reaches_the_role_under_the_same_name():
    data = {
        "shard": [{"host": "m", "port": 7000, "alpha": 0.7, "max_sample_batch_size": 512}],
        "learner": {"host": "m", "port": 7200, "batch_size": 64, "hidden_sizes": [32, 16]},
        "actors": [{"host": "m", "count": 1, "num_envs": 3}],
        "fleet": {"max_seconds": 9, "stop_grace": 1.5},
    }
    config = parse_config(data)
    assert config.shards[0].settings == {"alpha": 0.7, "max_sample_batch_size": 512}
    assert config.learner.settings == {"batch_size": 64, "hidden_sizes": (32, 16)}
    assert config.actors[0].settings == {"num_envs": 3}
    assert (config.max_seconds, config.stop_grace) == (9.0, 1.5)


@pytest.mark.parametrize("cls", [ReplayConfig, ParamsConfig, LearnerConfig, ActorConfig, FleetSettings])
def test_argv_round_trips_every_setting(cls, tmp_path):
    """to_argv then parsing the flags gives back the same config, for a value other than the default."""
    changed = {}
    for s in settings_of(cls):
        changed[s.name] = _other_value(s)
    if cls is ActorConfig:
        changed["evaluate"] = False  # an exploring actor with shards
    if cls is ParamsConfig:
        changed["chunk_bytes"] = 1024
    if cls is LearnerConfig:
        changed["health_port"] = None  # it belongs to the hosted parameter service, and `params` is changed
    if "role_tokens" in changed:  # a directory of token files, and no fleet token beside it
        tokens = tmp_path / "tokens"
        tokens.mkdir()
        (tokens / "learner").write_text("t-learner")
        changed.update(role_tokens=str(tokens), token=None)
    if cls is LearnerConfig:  # with --params it hosts no parameter service to guard
        changed.update(role_tokens=None, certificate_roles=False)
    if cls is FleetSettings:  # open runs without a token: exclusive with the tokens changed above
        changed["open"] = False
    certs = make_certs(tmp_path)  # the TLS settings must name readable PEM files
    changed.update(
        {
            k: v
            for k, v in {"tls_cert": certs.cert, "tls_key": certs.key, "tls_ca": certs.ca}.items()
            if k in changed
        }
    )
    config = cls(**changed)
    assert parse_argv(cls, to_argv(config), prog="test") == config


def _other_value(s):
    kind = s.base_type
    if typing.get_origin(kind) is tuple:
        return ("127.0.0.1:7001", "127.0.0.1:7002") if typing.get_args(kind)[0] is str else (64, 32)
    special = {
        "alpha": 0.5,
        "capacity": 5000,
        "min_size_to_sample": 10,
        "samples_per_insert": 4.0,
        "samples_per_insert_tolerance": 99.0,
        "epsilon": 0.25,
        "gamma": 0.9,
        "actor_index": 1,
        "num_actors": 3,
        "beta_start": 0.5,
        "beta_end": 0.9,
        "metrics_port": 9999,
        "port": 7777,
        "max_message_bytes": 1 << 20,
        "env": "Acrobot-v1",
        "host": "0.0.0.0",
        "device": "cpu",
        "signature": None,
        "item_signature": Signature.parse("state:float32[2,4]"),
        "priority_eta": 0.5,
        "evaluation_cpu_share": 0.5,
        "target_tau": 0.5,
        "noise_correlation": 0.5,
        "params": "127.0.0.1:7101",
    }
    if s.name in special:
        return special[s.name]
    if s.choices is not None:
        return next(c for c in s.choices if c != s.default)
    if isinstance(kind, type) and hasattr(
        kind, "from_value"
    ):  # a value with its own fleet-file form (EnvKwargs)
        return kind.from_value({"x": [1, "two"]})
    if kind is bool:
        return not s.default
    if kind is int:
        return (s.default or 0) + 3
    if kind is float:
        return (s.default or 0.0) + 1.5
    return f"x-{s.name}"


def test_no_two_roles_default_to_the_same_port():
    """Every role started by hand with its defaults on one machine (README, "Running the roles yourself") gets its
    own ports: the actors' metrics ports follow their index, the evaluator's is apart."""
    ports: dict[int, str] = {}
    for role, cls in ROLE_CONFIGS.items():
        for s in settings_of(cls):
            if s.name in ("port", "metrics_port") and s.default is not None:
                assert s.default not in ports, f"{role} {s.flag} {s.default} is also {ports[s.default]}'s"
                ports[s.default] = f"{role} {s.flag}"
    assert len(ports) == 6  # replay 2, params 2, learner 2
    actors = {
        ActorConfig(params="h:1", replay=("h:2",), actor_index=i, num_actors=8).serving_metrics_port: i
        for i in range(8)
    }
    evaluator = ActorConfig(params="h:1", evaluate=True).serving_metrics_port
    assert len(actors) == 8 and evaluator not in actors and not set(ports) & {*actors, evaluator}


def test_listening_roles_share_flag_names_and_help():
    by_name: dict[str, set[str]] = {}
    for role, cls in ROLE_CONFIGS.items():
        fields = {s.name: s for s in settings_of(cls)}
        for name in SERVER_FIELDS:
            if role == "actor" and name in ("port", "port_file"):
                continue
            if role == "actor" and name == "metrics_port":  # its default follows the actor index
                assert fields[name].default is None
                continue
            assert name in fields, f"{role} has no --{name.replace('_', '-')}"
            if name != "port":
                by_name.setdefault(name, set()).add(fields[name].help)
        flags = [s.flag for s in settings_of(cls)]
        assert not [f for f in flags if f.endswith("-mb") or f in ("--metrics-host", "--params-host")], flags
    assert all(len(helps) == 1 for helps in by_name.values()), by_name


def test_names_defaults_and_help_are_declared_once():
    for cls in config_classes().values():
        names = [s.name for s in settings_of(cls)]
        assert len(names) == len(set(names))
        assert all(s.help and not s.help.endswith(".") for s in settings_of(cls)), cls
    assert set(settable_keys(LearnerConfig)).isdisjoint(
        {"replay", "env", "run_dir", "seed", "min_replay_size"}
    )


def test_bad_values_are_refused_with_the_flag_named():
    with pytest.raises(SettingsError, match="--batch-size: batch_size \\(0\\) must be a positive integer"):
        parse_argv(LearnerConfig, ["--replay", "a:1", "--batch-size", "0"], prog="apexrl learner")
    with pytest.raises(SettingsError, match="--alpha: expected a number, got 'x'$"):
        parse_argv(ReplayConfig, ["--alpha", "x"], prog="apexrl replay")
    with pytest.raises(SettingsError, match="^apexrl learner: unknown flag --lr"):
        parse_argv(LearnerConfig, ["--replay", "a:1", "--lr", "0.1"], prog="apexrl learner")


def test_every_config_is_a_frozen_dataclass():
    for cls in config_classes().values():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen

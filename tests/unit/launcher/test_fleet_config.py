"""The local fleet and the run settings (launcher/fleet_config.py, pure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apexrl.common.env_settings import EnvChoice, EnvKwargs
from apexrl.common.settings import settings_of
from apexrl.launcher.fleet_config import ActorGroup, ConfigError, FleetConfig, FleetSettings
from apexrl.launcher.topology import checks_target, host_names, local_fleet, roles_on


def test_local_fleet_puts_every_role_on_this_machine():
    config = local_fleet(num_shards=2, num_actors=4, max_seconds=60)
    assert host_names(config) == ["local"]
    assert [r.name for r in roles_on(config, "local")] == [
        "shard-0",
        "shard-1",
        "learner",
        "actor-0",
        "actor-1",
        "actor-2",
        "actor-3",
        "evaluator",
    ]
    assert all(s.port == 0 for s in config.shards)  # shards report the port they got in a port file
    assert config.bind == "127.0.0.1" and checks_target(config, "local")
    with pytest.raises(ConfigError, match="num-actors"):
        local_fleet(num_actors=0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"env": " "}, "env must not be empty"),
        ({"seed": -1}, "seed (-1) must be at least 0"),
        ({"max_seconds": 0.0}, "max_seconds (0.0) must be positive"),
        ({"progress_seconds": float("inf")}, "progress_seconds (inf) must be positive"),
        ({"stop_grace": -1.0}, "stop_grace (-1.0) must be >= 0"),
        ({"replay_capacity": 0}, "replay_capacity (0) and min_replay_size (1000) must be at least 1"),
        ({"samples_per_insert": float("nan")}, "samples_per_insert (nan) must be >= 0"),
    ],
)
def test_run_settings_are_validated_with_the_value_named(settings, message):
    with pytest.raises(ConfigError) as err:
        FleetSettings(**settings)
    assert message in str(err.value)


def test_shards_share_the_replay_and_its_minimum_rounding_up():
    config = local_fleet(num_shards=3, num_actors=1, replay_capacity=1000, min_replay_size=100)
    assert (config.shard_capacity, config.shard_min_size) == (334, 34)
    assert local_fleet(num_shards=4, num_actors=1, min_replay_size=1).shard_min_size == 1
    with pytest.raises(ConfigError, match="--num-shards \\(0\\) must be at least 1"):
        local_fleet(num_shards=0)
    with pytest.raises(ConfigError, match="at least one \\[\\[shard\\]\\]"):
        FleetConfig(actors=(ActorGroup("local", 1, 0),))


def test_python_values_are_taken_as_the_command_line_and_fleet_files_spell_them():
    """The Python API's obvious spellings (issue 28): a dict of environment arguments, a module name, a path, an int
    for a float, numpy's integers; the config holds the settings' own types (hashable, as launch's caches need)."""
    config = local_fleet(
        num_actors=1,
        env="FrozenLake-v1",
        env_kwargs={"map_name": "8x8"},
        env_module="corridor",
        run_dir=Path("runs/x"),
        seed=np.int64(3),
        max_seconds=60,
    )
    assert config.env_kwargs == EnvKwargs({"map_name": "8x8"}) and config.env_module == ("corridor",)
    assert config.run_dir == "runs/x" and config.seed == 3 and type(config.seed) is int
    assert config.max_seconds == 60.0 and type(config.max_seconds) is float
    assert hash(EnvChoice.of(config))
    assert local_fleet(env_kwargs='{"map_name": "8x8"}').env_kwargs == config.env_kwargs  # --env-kwargs' JSON
    assert local_fleet(env_module="a, b").env_module == ("a", "b")  # --env-module's comma-separated list
    assert local_fleet(env_module=["a", "b"]).env_module == ("a", "b")
    typed = FleetSettings(env_kwargs=config.env_kwargs, env_module=("a",))  # the types themselves
    assert typed.env_module == ("a",) and typed.env_kwargs == config.env_kwargs


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"seed": "zero"}, "seed must be an integer, got 'zero'"),
        ({"seed": True}, "seed must be an integer, got True"),  # a bool is no integer here
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"max_seconds": "60"}, "max_seconds must be a number, got '60'"),
        ({"max_seconds": False}, "max_seconds must be a number, got False"),
        ({"env": 3}, "env must be a string, got 3"),
        ({"env": None}, "env must not be empty"),
        ({"env_kwargs": 3}, "env_kwargs: not a JSON object"),
        ({"env_kwargs": "map_name=8x8"}, "env_kwargs: not JSON"),
        ({"env_kwargs": {"map name": 1}}, "env_kwargs: keys must be Python identifiers"),
        ({"env_module": 3}, "env_module must be a list of strings, got 3"),
        ({"env_module": ["a", 3]}, "env_module must be a list of strings, got ['a', 3]"),
        ({"token": 1234}, "token must be a string, got <redacted>"),
    ],
)
def test_python_values_of_another_type_are_refused_naming_the_setting(settings, message):
    with pytest.raises(ConfigError) as err:
        local_fleet(num_actors=1, **settings)
    assert str(err.value) == message or str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("setting", settings_of(FleetSettings), ids=lambda s: s.name)
def test_every_run_setting_refuses_a_value_of_another_type(setting):
    wrong = "yes" if setting.base_type is bool else object()
    with pytest.raises(ConfigError) as err:
        FleetSettings(**{setting.name: wrong})
    assert str(err.value).startswith(setting.name), str(err.value)
    if setting.name == "token":  # never shown
        assert str(err.value).endswith("<redacted>"), str(err.value)


def test_the_local_fleets_own_arguments_are_checked():
    with pytest.raises(ConfigError, match="num_actors must be an integer, got '2'"):
        local_fleet(num_actors="2")
    with pytest.raises(ConfigError, match="num_shards must be an integer, got True"):
        local_fleet(num_shards=True)
    with pytest.raises(ConfigError, match="evaluator must be a boolean"):
        local_fleet(evaluator="no")

"""The local fleet and the run settings (launcher/fleet_config.py, pure)."""

from __future__ import annotations

import pytest

from apexrl.launcher.fleet_config import ActorGroup, ConfigError, FleetConfig, FleetSettings, local_fleet
from apexrl.launcher.topology import checks_target, host_names, roles_on


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

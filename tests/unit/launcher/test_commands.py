"""Every role's command line is derived from its settings dataclass plus the launcher's wiring
(launcher/commands.py), and checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from apexrl.actor.config import ActorConfig
from apexrl.launcher.commands import check_commands, command, extra_args_for, role_config
from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.topology import roles, wiring
from apexrl.learner.config import LearnerConfig
from apexrl.replay_server.server.config import ReplayConfig
from tests.unit.launcher.fleets import fleet


def test_command_lines_carry_the_wiring(tmp_path):
    config = parse_config(fleet(learner={"host": "m1", "port": 7100, "batch_size": 64}))
    by_name = {r.name: r for r in roles(config)}
    actor = command(config, by_name["actor-1"], wiring(config, "m2"), tmp_path)
    assert actor[0] == "actor"
    assert actor[actor.index("--replay") + 1] == "10.0.0.1:7000,10.0.0.1:7001"
    assert actor[actor.index("--params") + 1] == "10.0.0.1:7100"
    assert actor[actor.index("--actor-index") + 1] == "1"
    assert actor[actor.index("--num-actors") + 1] == "5"
    assert actor[actor.index("--episodes-csv") + 1] == str(tmp_path / "episodes" / "actor-1.csv")
    assert "--evaluate" not in actor
    evaluator = command(config, by_name["evaluator"], wiring(config, "m1"), tmp_path)
    assert "--evaluate" in evaluator
    assert evaluator[evaluator.index("--episodes-csv") + 1] == str(tmp_path / "episodes" / "evaluator.csv")
    learner = command(config, by_name["learner"], wiring(config, "m1"), tmp_path, ["--learning-rate", "3e-4"])
    assert learner[:3] == ["learner", "--replay", "127.0.0.1:7000,127.0.0.1:7001"]
    assert learner[learner.index("--port") + 1] == "7100"
    assert learner[learner.index("--run-dir") + 1] == str(tmp_path)
    assert learner[learner.index("--batch-size") + 1] == "64"  # the file's setting
    assert learner[-2:] == ["--learning-rate", "3e-4"]  # pass-through args come last
    shard = command(config, by_name["shard-1"], wiring(config, "m1"), tmp_path)
    assert shard[shard.index("--port") + 1] == "7001"
    assert shard[shard.index("--capacity") + 1] == "12500"  # half of the default 25,000 rows
    assert shard[shard.index("--port-file") + 1] == str(tmp_path / "ports" / "shard-1.port")
    seeds = {name: command(config, r, wiring(config, r.host), tmp_path) for name, r in by_name.items()}
    seeds = [argv[argv.index("--seed") + 1] for argv in seeds.values()]
    assert len(set(seeds[2:])) == len(seeds) - 2  # learner, actors and evaluator all seeded differently


def test_role_configs_share_the_fleet_settings_out():
    config = parse_config(
        fleet(fleet={"replay_capacity": 1001, "min_replay_size": 301, "samples_per_insert": 4.0, "seed": 3})
    )
    by_name = {r.name: r for r in roles(config)}
    links = wiring(config, "m1")
    shard = role_config(config, by_name["shard-1"], links, Path("/run"))
    assert isinstance(shard, ReplayConfig)
    # Each of 2 shards holds half the replay (rounded up) and half the minimum; the ratio is the fleet's.
    assert (shard.capacity, shard.min_size_to_sample, shard.samples_per_insert) == (501, 151, 4.0)
    assert shard.samples_per_insert_tolerance == 1024.0 and shard.seed == 4 and shard.port == 7001
    assert shard.port_file == "/run/ports/shard-1.port"
    learner = role_config(config, by_name["learner"], links, Path("/run"))
    assert isinstance(learner, LearnerConfig)
    assert learner.min_replay_size == 302 and learner.replay == links.replay and learner.run_dir == "/run"
    evaluator = role_config(config, by_name["evaluator"], links, Path("/run"))
    assert isinstance(evaluator, ActorConfig) and evaluator.evaluate and evaluator.seed == 3 + 999
    assert evaluator.epsilon is None and evaluator.algorithm == "dqn"  # greedy: see the explorer tests
    assert learner.algorithm == "dqn" and shard.capacity == 501  # the algorithm named; given settings kept


@pytest.mark.parametrize(
    ("fleet_settings", "expected"),
    [
        (
            {"env": "CartPole-v1"},
            100,
        ),  # one round: the 100 episodes of one policy that "solved" is defined on
        ({"env": "ALE/Pong-v5"}, 10),  # Atari: rounds of a conv net over thousands of frames stay short
        ({"env": "ALE/Pong-v5", "evaluation_episodes": 30}, 30),
        ({"env": "CartPole-v1", "evaluation_episodes": 7}, 7),
    ],
)
def test_the_evaluators_round_size_follows_the_environment_unless_set(fleet_settings, expected):
    config = parse_config(fleet(fleet={"seed": 3, **fleet_settings}))
    evaluator = role_config(
        config, {r.name: r for r in roles(config)}["evaluator"], wiring(config, "m1"), Path("/run")
    )
    assert evaluator.num_envs == expected


def test_the_evaluator_gets_the_actors_pass_through_args_first():
    extra = {"actor": ["--num-envs", "2"], "evaluator": ["--num-envs", "1"], "learner": ["--batch-size", "8"]}
    assert extra_args_for("evaluator", extra) == ["--num-envs", "2", "--num-envs", "1"]
    assert extra_args_for("actor", extra) == ["--num-envs", "2"]
    assert extra_args_for("replay", extra) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"replay": ["--alpha", "11"]}, "shard-0: --alpha: alpha (11.0) must be in [0, 10]"),
        (
            {"learner": ["--batch-size"]},
            "learner: apexrl learner (learner): --batch-size: expected a value",
        ),
        ({"actor": ["--bogus"]}, "actor-0: apexrl actor (actor-0): unknown flag --bogus"),
        ({"actor": ["--epsilon", "3"]}, "actor-0: --epsilon: epsilon (3.0) must be in [0, 1]"),
        (
            {"actor": ["--noise-correlation", "1"]},
            "actor-0: --noise-correlation: noise_correlation (1.0) must be in [0, 1)",
        ),
    ],
)
def test_check_commands_parses_every_local_role_as_the_role_will(tmp_path, extra, message):
    config = parse_config(fleet(actors=[{"host": "m1", "count": 2}]))
    check_commands(config, "m1", tmp_path, {})  # the fleet as written is fine
    with pytest.raises(ConfigError) as err:
        check_commands(config, "m1", tmp_path, extra)
    assert message in str(err.value)


def test_check_commands_checks_only_this_machines_roles(tmp_path):
    config = parse_config(fleet())  # actors 0-2 on m2, shards, learner, actors 3-4 and the evaluator on m1
    check_commands(config, "m2", tmp_path, {"replay": ["--alpha", "11"]})  # no shard runs on m2
    with pytest.raises(ConfigError, match="shard-0: --alpha"):
        check_commands(config, "m1", tmp_path, {"replay": ["--alpha", "11"]})


def test_shards_are_started_with_the_signature_the_fleets_actors_write():
    config = parse_config(fleet())
    by_name = {r.name: r for r in roles(config)}
    argv = command(config, by_name["shard-0"], wiring(config, "m1"), Path("/run"))
    assert argv[argv.index("--signature") + 1] == (
        "obs:float32[4],action:int64[],reward:float32[],"
        "discount:float32[],next_obs:float32[4],weight_version:int64[]"
    )
    pendulum = parse_config(fleet(fleet={"env": "Pendulum-v1"}))
    shard = role_config(
        pendulum, {r.name: r for r in roles(pendulum)}["shard-0"], wiring(pendulum, "m1"), Path("/run")
    )
    assert str(shard.signature.fields[1]) == "action:float32[1]"


def test_a_shards_own_signature_wins_and_actors_that_disagree_pin_none():
    own = "obs:float32[4],action:int64[]"
    config = parse_config(fleet(shard=[{"host": "m1", "port": 7000, "signature": own}]))
    shard = role_config(
        config, {r.name: r for r in roles(config)}["shard-0"], wiring(config, "m1"), Path("/run")
    )
    assert str(shard.signature) == own
    mixed = parse_config(
        fleet(
            actors=[
                {"host": "m2", "count": 1, "compress": "lz4"},
                {"host": "m1", "count": 1, "compress": "zstd"},
            ]
        )
    )
    shard = role_config(
        mixed, {r.name: r for r in roles(mixed)}["shard-0"], wiring(mixed, "m1"), Path("/run")
    )
    assert shard.signature is None

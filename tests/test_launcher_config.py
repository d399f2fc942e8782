"""Fleet files: schema validation, which roles each machine starts, and how they find each other (pure)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from apexrl.launcher import main as launch_main
from apexrl.launcher.commands import command
from apexrl.launcher.fleet_config import ConfigError, local_fleet
from apexrl.launcher.fleet_file import load_config, parse_config
from apexrl.launcher.topology import address, checks_target, host_names, roles, roles_on, wiring

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fleet.toml"


def fleet(**changes) -> dict:
    """A valid two-machine fleet as parsed data; `changes` replace top-level tables."""
    data = {
        "fleet": {"env": "CartPole-v1", "seed": 3},
        "hosts": {"m1": "10.0.0.1", "m2": "10.0.0.2"},
        "shard": [{"host": "m1", "port": 7000, "metrics_port": 9100},
                  {"host": "m1", "port": 7001, "metrics_port": 9101}],
        "learner": {"host": "m1", "port": 7100, "metrics_port": 9200},
        "actors": [{"host": "m2", "count": 3, "metrics_port": 9300},
                   {"host": "m1", "count": 2, "metrics_port": 9300}],
        "evaluator": {"host": "m1", "metrics_port": 9400},
    }
    data.update(changes)
    return data


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_example_fleet_file_parses():
    config = load_config(EXAMPLE)
    assert host_names(config) == ["m1", "m2"]
    assert config.num_actors == 8
    assert [r.name for r in roles_on(config, "m2")] == [f"actor-{i}" for i in range(8)]
    assert [r.name for r in roles_on(config, "m1")] == ["shard-0", "shard-1", "learner", "evaluator"]
    assert checks_target(config, "m1") and not checks_target(config, "m2")


def test_roles_per_host_and_global_actor_indices():
    config = parse_config(fleet())
    assert config.num_actors == 5
    on_m2 = roles_on(config, "m2")
    assert [(r.name, r.index, r.metrics_port) for r in on_m2] == [
        ("actor-0", 0, 9300), ("actor-1", 1, 9301), ("actor-2", 2, 9302)]
    on_m1 = roles_on(config, "m1")
    assert [r.name for r in on_m1] == ["shard-0", "shard-1", "learner", "actor-3", "actor-4", "evaluator"]
    # The second group continues the indices; its metrics ports start again on its own host.
    assert [(r.index, r.metrics_port) for r in on_m1 if r.kind == "actor"] == [(3, 9300), (4, 9301)]
    with pytest.raises(ConfigError, match="no role of the fleet runs on host 'm3'.*m1, m2"):
        roles_on(config, "m3")


def test_wiring_uses_loopback_on_the_same_machine_and_host_addresses_across():
    config = parse_config(fleet())
    assert wiring(config, "m1").replay == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert wiring(config, "m1").params == "127.0.0.1:7100"
    assert wiring(config, "m2").replay == ("10.0.0.1:7000", "10.0.0.1:7001")
    assert wiring(config, "m2").params == "10.0.0.1:7100"
    # A host missing from [hosts] is reached by its name; a service bound to one interface is reached there.
    unnamed = parse_config(fleet(hosts={}))
    assert wiring(unnamed, "m2").params == "m1:7100"
    bound = parse_config(fleet(fleet={"bind": "10.0.0.1"}))
    assert address(bound, "m1", 7000, "m1") == "10.0.0.1:7000"


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
    assert shard[shard.index("--capacity") + 1] == "50000"
    assert shard[shard.index("--port-file") + 1] == str(tmp_path / "ports" / "shard-1.port")
    seeds = {name: command(config, r, wiring(config, r.host), tmp_path) for name, r in by_name.items()}
    seeds = [argv[argv.index("--seed") + 1] for argv in seeds.values()]
    assert len(set(seeds[2:])) == len(seeds) - 2  # learner, actors and evaluator all seeded differently


def test_local_fleet_puts_every_role_on_this_machine():
    config = local_fleet(num_shards=2, num_actors=4, max_seconds=60)
    assert host_names(config) == ["local"]
    assert [r.name for r in roles_on(config, "local")] == [
        "shard-0", "shard-1", "learner", "actor-0", "actor-1", "actor-2", "actor-3", "evaluator"]
    assert all(s.port == 0 for s in config.shards)  # shards report the port they got in a port file
    assert config.bind == "127.0.0.1" and checks_target(config, "local")
    with pytest.raises(ConfigError, match="num-actors"):
        local_fleet(num_actors=0)


@pytest.mark.parametrize(("change", "message"), [
    ({"fleets": {}}, "unknown table 'fleets'"),
    ({"fleet": {"env": "CartPole-v1", "max_second": 5}}, r"\[fleet\]: unknown key 'max_second'"),
    ({"fleet": {"max_seconds": -1}}, r"\[fleet\]: max_seconds \(-1(\.0)?\) must be positive"),
    ({"fleet": {"seed": True}}, "seed must be int, got True"),
    ({"shard": [{"port": 7000}]}, r"\[\[shard\]\] #0: missing 'host'"),
    ({"shard": [{"host": "m1", "port": 7000, "metric_port": 1}]}, "#0: unknown key 'metric_port'"),
    ({"shard": [{"host": "m1"}]}, r"\[\[shard\]\] #0: missing 'port'"),
    ({"shard": [{"host": "m1", "port": 70000}]}, r"port \(70000\) must be in 1..65535"),
    ({"shard": []}, "non-empty array"),
    ({"learner": {"port": 7100}}, r"\[learner\]: missing 'host'"),
    ({"learner": {"host": "m1", "port": 7100, "replay": "x:1"}},
     r"\[learner\]: replay is set by the launcher from the \[\[shard\]\] tables"),
    ({"learner": {"host": "m1", "port": 7100, "batch_size": "big"}}, r"\[learner\]: batch_size must be int"),
    ({"actors": [{"host": "m2"}]}, "missing 'count'"),
    ({"actors": [{"host": "m2", "count": 0}]}, r"count \(0\) must be at least 1"),
    ({"actors": [{"host": "m2", "count": 2, "args": "--x"}]}, r"#0: unknown key 'args'"),
    ({"evaluator": {"host": "m2"}}, "must be the learner's host"),
    ({"hosts": {"m1": 5}}, r"\[hosts\] m1 must be a non-empty string"),
])
def test_schema_errors_name_the_table_and_key(change, message):
    assert pytest.raises(ConfigError, parse_config, fleet(**change)).match(message)


def test_missing_learner_and_shards():
    data = fleet()
    del data["learner"]
    assert "missing [learner]" in error(data)
    data = fleet()
    del data["shard"]
    assert "missing [[shard]]" in error(data)


def test_duplicate_ports_on_one_host_are_refused_but_not_across_hosts():
    message = error(fleet(learner={"host": "m1", "port": 7000}))
    assert message == "port 7000 on host 'm1' is used by both shard-0 (port) and learner (port)"
    # actor-4 (m1, second group) takes 9301 from its range start 9300; the evaluator may not reuse it.
    assert "actor-4 (metrics_port) and evaluator (metrics_port)" in error(
        fleet(evaluator={"host": "m1", "metrics_port": 9301}))
    # The same numbers on different machines are fine (actor groups on m1 and m2 both start at 9300).
    parse_config(fleet())


def test_actor_indices_must_tile_without_overlap_or_gaps():
    overlap = fleet(actors=[{"host": "m2", "count": 3}, {"host": "m1", "count": 2, "first_index": 2}])
    assert "actor index 2 is also in [[actors]] #0" in error(overlap)
    gap = fleet(actors=[{"host": "m2", "count": 3, "first_index": 1}])
    assert "missing [0]" in error(gap)


def test_yaml_fleet_file_matches_toml(tmp_path):
    yaml_file = tmp_path / "fleet.yaml"
    yaml_file.write_text(
        "fleet: {env: CartPole-v1, seed: 3}\n"
        "hosts: {m1: 10.0.0.1, m2: 10.0.0.2}\n"
        "shard:\n  - {host: m1, port: 7000, metrics_port: 9100}\n  - {host: m1, port: 7001, metrics_port: 9101}\n"
        "learner: {host: m1, port: 7100, metrics_port: 9200}\n"
        "actors:\n  - {host: m2, count: 3, metrics_port: 9300}\n  - {host: m1, count: 2, metrics_port: 9300}\n"
        "evaluator: {host: m1, metrics_port: 9400}\n")
    assert load_config(yaml_file) == parse_config(fleet())
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shard]]\nhost = 'm1'\nport = 7000\nbogus = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: \[\[shard\]\] #0: unknown key 'bogus'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_config(tmp_path / "missing.toml")


def launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch_main.add_arguments(parser)
    return parser.parse_args(argv)


def test_launch_options_resolve_against_the_fleet_file():
    config, host = launch_main.resolve_config(launch_args(
        "--config", str(EXAMPLE), "--host-name", "m2", "--max-seconds", "30", "--seed", "7"))
    assert host == "m2" and config.max_seconds == 30 and config.seed == 7
    assert config.target_return == 475.0 and config.run_dir == "runs/cartpole-2machines"  # from the file
    with pytest.raises(ConfigError, match="pass --host-name"):
        launch_main.resolve_config(launch_args("--config", str(EXAMPLE)))
    with pytest.raises(ConfigError, match="'m9' runs no role"):
        launch_main.resolve_config(launch_args("--config", str(EXAMPLE), "--host-name", "m9"))
    with pytest.raises(ConfigError, match="--num-shards and --num-actors describe the local fleet"):
        launch_main.resolve_config(launch_args("--config", str(EXAMPLE), "--host-name", "m1", "--num-actors", "2"))
    with pytest.raises(ConfigError, match="--host-name needs --config"):
        launch_main.resolve_config(launch_args("--host-name", "m1"))
    config, host = launch_main.resolve_config(launch_args("--num-actors", "1", "--env", "Acrobot-v1"))
    assert host == "local" and config.num_actors == 1 and config.env == "Acrobot-v1" and len(config.shards) == 2

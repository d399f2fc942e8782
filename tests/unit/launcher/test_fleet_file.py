"""Fleet files (launcher/fleet_file.py): schema validation with the table and key named, TOML and YAML."""

from __future__ import annotations

import pytest

from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import load_config, parse_config
from apexrl.launcher.topology import checks_target, host_names, roles_on
from tests.unit.launcher.fleets import EXAMPLE, error, fleet


def test_example_fleet_file_parses():
    config = load_config(EXAMPLE)
    assert host_names(config) == ["m1", "m2"]
    assert config.num_actors == 8
    assert [r.name for r in roles_on(config, "m2")] == [f"actor-{i}" for i in range(8)]
    assert [r.name for r in roles_on(config, "m1")] == ["shard-0", "shard-1", "learner", "evaluator"]
    assert checks_target(config, "m1") and not checks_target(config, "m2")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fleets": {}}, "unknown table 'fleets'"),
        ({"fleet": {"env": "CartPole-v1", "max_second": 5}}, r"\[fleet\]: unknown key 'max_second'"),
        ({"fleet": {"max_seconds": -1}}, r"\[fleet\]: max_seconds \(-1(\.0)?\) must be positive"),
        ({"fleet": {"seed": True}}, r"\[fleet\]: seed must be an integer, got True"),
        ({"shard": [{"port": 7000}]}, r"\[\[shard\]\] #0: missing 'host'"),
        ({"shard": [{"host": "m1", "port": 7000, "metric_port": 1}]}, "#0: unknown key 'metric_port'"),
        ({"shard": [{"host": "m1"}]}, r"\[\[shard\]\] #0: missing 'port'"),
        ({"shard": [{"host": "m1", "port": 70000}]}, r"port \(70000\) must be in 1..65535"),
        ({"shard": []}, "non-empty array"),
        ({"learner": {"port": 7100}}, r"\[learner\]: missing 'host'"),
        (
            {"learner": {"host": "m1", "port": 7100, "replay": "x:1"}},
            r"\[learner\]: replay is set by the launcher from the \[\[shard\]\] tables",
        ),
        (
            {"learner": {"host": "m1", "port": 7100, "batch_size": "big"}},
            r"\[learner\]: batch_size must be an integer, got 'big'",
        ),
        ({"actors": [{"host": "m2"}]}, "missing 'count'"),
        ({"actors": [{"host": "m2", "count": 0}]}, r"count \(0\) must be at least 1"),
        ({"actors": [{"host": "m2", "count": 2, "args": "--x"}]}, r"#0: unknown key 'args'"),
        ({"evaluator": {"host": "m2"}}, "must be the learner's host"),
        ({"hosts": {"m1": 5}}, r"\[hosts\] m1 \(5\) is not text"),
        # Addresses are checked when the file is read, not when a role first dials them after startup_timeout.
        ({"hosts": {"m1": "my host"}}, r"\[hosts\] m1 \('my host'\) holds a space"),
        ({"hosts": {"m1": "10.0.0.1:7000"}}, r"\[hosts\] m1 \('10.0.0.1:7000'\) holds a port"),
        ({"hosts": {"m1": "300.0.0.1"}}, r"\[hosts\] m1 \('300.0.0.1'\) is not an IPv4 address"),
        ({"hosts": {"m1": ""}}, r"\[hosts\] m1 \(''\) is empty"),
        ({"fleet": {"bind": "0.0.0.0 "}}, r"\[fleet\]: bind \('0.0.0.0 '\) holds a space"),
    ],
)
def test_schema_errors_name_the_table_and_key(change, message):
    assert pytest.raises(ConfigError, parse_config, fleet(**change)).match(message)


@pytest.mark.parametrize("address", ["10.0.0.1", "m1.example.com", "fd00::1", "[fd00::1]"])
def test_hosts_entries_take_names_and_ip_addresses(address):
    assert parse_config(fleet(hosts={"m1": address, "m2": "10.0.0.2"})).hosts["m1"] == address


def test_missing_learner_and_shards():
    data = fleet()
    del data["learner"]
    assert "missing [learner]" in error(data)
    data = fleet()
    del data["shard"]
    assert "missing [[shard]]" in error(data)


def test_yaml_fleet_file_matches_toml(tmp_path):
    yaml_file = tmp_path / "fleet.yaml"
    yaml_file.write_text(
        "fleet: {env: CartPole-v1, seed: 3}\n"
        "hosts: {m1: 10.0.0.1, m2: 10.0.0.2}\n"
        "shard:\n  - {host: m1, port: 7000, metrics_port: 9100}\n  - {host: m1, port: 7001, metrics_port: 9101}\n"
        "learner: {host: m1, port: 7100, metrics_port: 9200}\n"
        "actors:\n  - {host: m2, count: 3, metrics_port: 9300}\n  - {host: m1, count: 2, metrics_port: 9300}\n"
        "evaluator: {host: m1, metrics_port: 9400}\n"
    )
    assert load_config(yaml_file) == parse_config(fleet())
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shard]]\nhost = 'm1'\nport = 7000\nbogus = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: \[\[shard\]\] #0: unknown key 'bogus'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_config(tmp_path / "missing.toml")

"""The launcher's Prometheus file-SD file (launcher/prometheus_targets.py): one target group per local role with
the job/role/host labels the rules select on, addresses Prometheus can reach, and a file promtool accepts."""

from __future__ import annotations

import json
import logging

import yaml

from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.prometheus_targets import target_groups, write_targets
from apexrl.launcher.topology import local_fleet, roles, roles_on
from tests.unit.launcher.fleets import fleet
from tests.unit.monitoring.tools import needs_promtool, promtool


def test_each_role_is_one_target_labelled_with_its_job_role_and_machine():
    config = parse_config(fleet(fleet={"bind": "0.0.0.0"}))
    groups = target_groups(config, "m1", roles_on(config, "m1"))
    assert groups == [
        {"targets": ["10.0.0.1:9100"], "labels": {"job": "apexrl-replay", "role": "shard-0", "host": "m1"}},
        {"targets": ["10.0.0.1:9101"], "labels": {"job": "apexrl-replay", "role": "shard-1", "host": "m1"}},
        {"targets": ["10.0.0.1:9200"], "labels": {"job": "apexrl-learner", "role": "learner", "host": "m1"}},
        {"targets": ["10.0.0.1:9300"], "labels": {"job": "apexrl-actor", "role": "actor-3", "host": "m1"}},
        {"targets": ["10.0.0.1:9301"], "labels": {"job": "apexrl-actor", "role": "actor-4", "host": "m1"}},
        {
            "targets": ["10.0.0.1:9400"],
            "labels": {"job": "apexrl-evaluator", "role": "evaluator", "host": "m1"},
        },
    ]
    on_m2 = target_groups(config, "m2", roles_on(config, "m2"))
    assert [g["targets"] for g in on_m2] == [["10.0.0.2:9300"], ["10.0.0.2:9301"], ["10.0.0.2:9302"]]


def test_a_fleet_on_loopback_is_scraped_on_loopback_and_roles_without_a_port_are_left_out():
    config = parse_config(fleet())  # bind 127.0.0.1: only this machine can reach the ports
    assert {g["targets"][0] for g in target_groups(config, "m1", roles_on(config, "m1"))} == {
        "127.0.0.1:9100",
        "127.0.0.1:9101",
        "127.0.0.1:9200",
        "127.0.0.1:9300",
        "127.0.0.1:9301",
        "127.0.0.1:9400",
    }
    local = local_fleet(num_shards=1, num_actors=1)  # ports are picked at start: none known yet
    assert target_groups(local, "local", roles(local)) == []


@needs_promtool
def test_the_written_file_is_valid_file_sd_for_prometheus(tmp_path, caplog):
    config = parse_config(fleet())
    with caplog.at_level(logging.INFO, logger="apexrl.launch"):
        path = write_targets(tmp_path / "run", config, "m1", roles_on(config, "m1"))
    assert path == (tmp_path / "run" / "prometheus" / "targets.json").resolve()
    assert len(json.loads(path.read_text())) == 6
    assert f"file_sd_configs: [{{files: ['{path}']}}]" in caplog.text  # how to point Prometheus at it
    prometheus_yml = tmp_path / "prometheus.yml"
    prometheus_yml.write_text(
        yaml.safe_dump(
            {"scrape_configs": [{"job_name": "apexrl", "file_sd_configs": [{"files": [str(path)]}]}]}
        )
    )
    result = promtool("check", "config", str(prometheus_yml))
    assert result.returncode == 0 and "WARNING" not in result.stdout + result.stderr, (
        result.stdout + result.stderr
    )


@needs_promtool
def test_the_example_prometheus_configuration_is_valid():
    result = promtool("check", "config", "monitoring/prometheus/prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr

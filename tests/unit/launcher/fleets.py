"""Fleets as parsed fleet-file data, shared by the launcher's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fleet.toml"


def fleet(**changes) -> dict:
    """A valid two-machine fleet as parsed data; `changes` replace top-level tables."""
    data = {
        "fleet": {"env": "CartPole-v1", "seed": 3},
        "hosts": {"m1": "10.0.0.1", "m2": "10.0.0.2"},
        "shard": [
            {"host": "m1", "port": 7000, "metrics_port": 9100},
            {"host": "m1", "port": 7001, "metrics_port": 9101},
        ],
        "learner": {"host": "m1", "port": 7100, "metrics_port": 9200},
        "actors": [
            {"host": "m2", "count": 3, "metrics_port": 9300},
            {"host": "m1", "count": 2, "metrics_port": 9300},
        ],
        "evaluator": {"host": "m1", "metrics_port": 9400},
    }
    data.update(changes)
    return data


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)

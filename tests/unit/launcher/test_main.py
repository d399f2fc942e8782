"""`apexrl launch` options resolved against a fleet file or the local fleet (launcher/main.py, no processes)."""

from __future__ import annotations

import argparse

import pytest

from apexrl.launcher import main as launch_main
from apexrl.launcher.fleet_config import ConfigError
from tests.unit.launcher.fleets import EXAMPLE


def launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch_main.add_arguments(parser)
    return parser.parse_args(argv)


def test_launch_options_resolve_against_the_fleet_file():
    config, host = launch_main.resolve_config(
        launch_args("--config", str(EXAMPLE), "--host-name", "m2", "--max-seconds", "30", "--seed", "7")
    )
    assert host == "m2" and config.max_seconds == 30 and config.seed == 7
    assert (
        config.target_return == 475.0 and config.run_dir is None
    )  # from the file: a fresh run directory each time
    with pytest.raises(ConfigError, match="pass --host-name"):
        launch_main.resolve_config(launch_args("--config", str(EXAMPLE)))
    with pytest.raises(ConfigError, match="'m9' runs no role"):
        launch_main.resolve_config(launch_args("--config", str(EXAMPLE), "--host-name", "m9"))
    with pytest.raises(ConfigError, match="--num-shards and --num-actors describe the local fleet"):
        launch_main.resolve_config(
            launch_args("--config", str(EXAMPLE), "--host-name", "m1", "--num-actors", "2")
        )
    with pytest.raises(ConfigError, match="--host-name needs --config"):
        launch_main.resolve_config(launch_args("--host-name", "m1"))
    config, host = launch_main.resolve_config(launch_args("--num-actors", "1", "--env", "Acrobot-v1"))
    assert (
        host == "local" and config.num_actors == 1 and config.env == "Acrobot-v1" and len(config.shards) == 2
    )

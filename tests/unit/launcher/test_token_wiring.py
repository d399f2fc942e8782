"""The launcher hands each role its bearer token through the environment (APEXRL_TOKEN), never on a command line
(launcher/commands.py), and config.json records no token (launcher/main.py)."""

from __future__ import annotations

import dataclasses

import pytest

from apexrl.common.process import TOKEN_VARIABLE
from apexrl.launcher.commands import check_commands, command, environment
from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.main import REDACTED, redacted
from apexrl.launcher.topology import roles, wiring
from tests.unit.launcher.fleets import fleet

FLEET_TOKEN, TABLE_TOKEN = "fleet-t0ken", "table-t0ken"


def test_no_command_line_carries_the_token_and_every_role_gets_it_in_its_environment(tmp_path):
    data = fleet(shard=[{"host": "m1", "port": 7000, "token": TABLE_TOKEN}, {"host": "m1", "port": 7001}])
    config = dataclasses.replace(parse_config(data), token=FLEET_TOKEN)
    base = {"PATH": "/bin", TOKEN_VARIABLE: "the-launchers-own"}
    for role in roles(config):
        links = wiring(config, role.host)
        argv = command(config, role, links, tmp_path)
        assert "--token" not in argv and not any(TABLE_TOKEN in a or FLEET_TOKEN in a for a in argv), (
            role.name
        )
        env = environment(config, role, links, tmp_path, base)
        assert env[TOKEN_VARIABLE] == (TABLE_TOKEN if role.name == "shard-0" else FLEET_TOKEN), role.name
        assert env["PATH"] == "/bin"


def test_without_a_token_the_roles_get_none_even_from_the_launchers_environment(tmp_path):
    config = parse_config(fleet())
    role = roles(config)[0]
    env = environment(
        config, role, wiring(config, role.host), tmp_path, {TOKEN_VARIABLE: "stale", "HOME": "/h"}
    )
    assert env == {"HOME": "/h"}


def test_a_token_file_in_a_role_table_stays_a_path_on_the_command_line(tmp_path):
    data = fleet(learner={"host": "m1", "port": 7100, "token_file": "/etc/apexrl/token"})
    config = parse_config(data)
    learner = next(r for r in roles(config) if r.name == "learner")
    argv = command(config, learner, wiring(config, "m1"), tmp_path)
    assert argv[argv.index("--token-file") + 1] == "/etc/apexrl/token"


@pytest.mark.parametrize(
    "extra", [{"actor": ["--token", "x"]}, {"replay": ["--token=x"]}, {"evaluator": ["--token", "x"]}]
)
def test_a_token_in_a_pass_through_arg_is_refused(tmp_path, extra):
    config = parse_config(fleet(actors=[{"host": "m1", "count": 1}]))
    with pytest.raises(
        ConfigError, match="--token in a pass-through arg would put the token on the command line"
    ):
        check_commands(config, "m1", tmp_path, extra)


def test_config_json_records_no_token():
    doc = {
        "launch_options": {"token": FLEET_TOKEN, "token_file": None, "seed": 0},
        "fleet": {
            "token": FLEET_TOKEN,
            "token_file": "/etc/apexrl/token",
            "shards": [{"settings": {"token": TABLE_TOKEN, "alpha": 0.6}}, {"settings": {}}],
        },
        "roles": [{"command": ["replay", "--port", "7000"]}],
    }
    clean = redacted(doc)
    assert FLEET_TOKEN not in str(clean) and TABLE_TOKEN not in str(clean)
    assert clean["fleet"]["token"] == clean["launch_options"]["token"] == REDACTED
    assert clean["fleet"]["shards"][0]["settings"] == {"token": REDACTED, "alpha": 0.6}
    assert (
        clean["fleet"]["token_file"] == "/etc/apexrl/token" and clean["launch_options"]["token_file"] is None
    )
    assert clean["roles"] == doc["roles"]

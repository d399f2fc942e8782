"""Which environment a run plays, as settings (common/env_settings.py): constructor arguments as a JSON object on
every command line and as a table in fleet files, plugin modules, and run-directory names safe for any id."""

from __future__ import annotations

import pytest

from apexrl.actor.config import ActorConfig
from apexrl.common.env_settings import NO_KWARGS, EnvChoice, EnvKwargs
from apexrl.common.settings import SettingsError, parse_argv, to_argv
from apexrl.launcher.commands import command
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.main import default_run_dir
from apexrl.launcher.topology import roles, wiring
from apexrl.learner.config import LearnerConfig
from apexrl.learner.evaluate import EvaluateConfig
from tests.unit.launcher.fleets import error, fleet


def test_env_kwargs_are_a_json_object_kept_as_canonical_text():
    kwargs = EnvKwargs.parse('{"map_name": "8x8", "is_slippery": false}')
    assert kwargs.as_dict() == {"map_name": "8x8", "is_slippery": False}
    assert str(kwargs) == '{"is_slippery": false, "map_name": "8x8"}'
    assert kwargs == EnvKwargs({"is_slippery": False, "map_name": "8x8"}) and hash(kwargs) == hash(
        EnvKwargs.parse(str(kwargs))
    )
    assert not NO_KWARGS and kwargs
    changed = kwargs.as_dict()
    changed["map_name"] = "4x4"
    assert kwargs.as_dict()["map_name"] == "8x8"  # a copy each time


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "not a JSON object"),
        ("{map_name: 1}", "not JSON"),
        ('{"not an identifier": 1}', "identifiers"),
        ('{"x": NaN}', "JSON values only"),
    ],
)
def test_bad_env_kwargs_are_refused_naming_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        EnvKwargs.parse(text)


def test_every_role_takes_the_same_flags_and_writes_them_back():
    argv = [
        "--params",
        "127.0.0.1:7100",
        "--evaluate",
        "--env",
        "my_envs:Corridor-v0",
        "--env-module",
        "my_envs,more_envs",
        "--env-kwargs",
        '{"length": 8}',
    ]
    actor = parse_argv(ActorConfig, argv, prog="apexrl actor")
    assert actor.env_module == ("my_envs", "more_envs") and actor.env_kwargs == EnvKwargs({"length": 8})
    assert parse_argv(ActorConfig, to_argv(actor), prog="apexrl actor") == actor
    learner = parse_argv(
        LearnerConfig, ["--replay", "127.0.0.1:7000", "--env-kwargs", '{"length": 8}'], prog="x"
    )
    assert learner.env_kwargs.as_dict() == {"length": 8} and learner.env_module == ()
    evaluate = parse_argv(EvaluateConfig, ["runs/x", "--env-kwargs", "{}"], prog="apexrl evaluate")
    assert evaluate.env_kwargs == NO_KWARGS and evaluate.env_module is None
    with pytest.raises(SettingsError, match="--env-kwargs"):
        parse_argv(
            ActorConfig,
            ["--params", "127.0.0.1:7100", "--evaluate", "--env-kwargs", "8"],
            prog="apexrl actor",
        )


def test_a_fleet_files_env_kwargs_table_reaches_the_learner_every_actor_and_the_evaluator(tmp_path):
    config = parse_config(
        fleet(
            fleet={"env": "Line-v0", "env_module": ["tests.support.custom_envs"], "env_kwargs": {"length": 8}}
        )
    )
    assert config.env_kwargs == EnvKwargs({"length": 8})
    by_name = {r.name: r for r in roles(config)}
    for name, host in (("learner", "m1"), ("actor-0", "m2"), ("actor-4", "m1"), ("evaluator", "m1")):
        argv = command(config, by_name[name], wiring(config, host), tmp_path)
        assert argv[argv.index("--env-kwargs") + 1] == '{"length": 8}', name
        assert argv[argv.index("--env-module") + 1] == "tests.support.custom_envs", name
    assert parse_config(fleet(fleet={"env": "X-v0", "env_kwargs": '{"length": 3}'})).env_kwargs.as_dict() == {
        "length": 3
    }
    assert "[fleet]: env_kwargs: not a JSON object" in error(fleet(fleet={"env": "X", "env_kwargs": 3}))
    assert "set by the launcher" in error(fleet(learner={"host": "m1", "env_kwargs": {"length": 2}}))


def test_run_directory_names_hold_no_colon_slash_or_space():
    assert default_run_dir("my_pkg.envs:Corridor-v0").startswith("runs/Corridor-v0-")
    assert default_run_dir("ALE/Pong-v5").startswith("runs/ALE_Pong-v5-")
    assert EnvChoice("weird env:A b/c?").run_name() == "A_b_c_"
    name = default_run_dir(EnvChoice("pkg:Id-v0", kwargs=EnvKwargs({"a": 1})))
    assert ":" not in name and " " not in name.split("/", 1)[1]


def test_a_choice_imports_its_modules_then_the_one_in_its_id():
    choice = EnvChoice("pkg.envs:Corridor-v0", ("plugins",))
    assert choice.registered_id == "Corridor-v0" and choice.all_modules == ("plugins", "pkg.envs")
    assert EnvChoice("CartPole-v1").all_modules == () and EnvChoice("CartPole-v1").describe() == "CartPole-v1"

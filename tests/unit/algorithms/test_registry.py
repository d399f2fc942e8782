"""The algorithm seam's registry (algorithms/registry.py): the algorithm chosen from the action space, a named one
refused on a space it cannot play, defaults that fill only the settings left at None, and every registered
algorithm complete (an acting and a learning half with the functions the wiring calls)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from apexrl.actor.config import ActorConfig
from apexrl.algorithms.registry import (
    AUTO,
    algorithms,
    for_action_kind,
    for_spaces,
    get,
    names,
    with_defaults,
)
from apexrl.common.spaces import BOX, DISCRETE, EnvSpaces
from apexrl.launcher.fleet_config import FleetSettings
from apexrl.learner.config import LearnerConfig


def test_auto_picks_dqn_for_discrete_and_dpg_for_box_actions():
    assert names() == (AUTO, "dqn", "dpg", "r2d2")
    assert for_spaces(AUTO, EnvSpaces.vector(4, 2)).name == "dqn"
    assert for_spaces(AUTO, EnvSpaces.box((3,), (-2.0,), (2.0,))).name == "dpg"
    assert for_action_kind("dpg", BOX).name == "dpg"


def test_a_named_algorithm_is_refused_on_a_space_it_cannot_play_naming_one_that_can():
    with pytest.raises(
        ValueError,
        match=r"algorithm dqn needs a Discrete action space; Pendulum-v1 has a Box one "
        r"\(algorithms for it: dpg\)",
    ):
        for_action_kind("dqn", BOX, "Pendulum-v1")
    with pytest.raises(
        ValueError, match="algorithm dpg needs a Box action space; CartPole-v1 has a Discrete one"
    ):
        for_action_kind("dpg", DISCRETE, "CartPole-v1")
    with pytest.raises(ValueError, match=r"algorithm \('ppo'\) must be one of auto, dqn, dpg"):
        get("ppo")


@pytest.mark.parametrize(
    ("role", "config"),
    [
        ("fleet", FleetSettings()),
        ("learner", LearnerConfig(replay=("a:1",))),
        ("actor", ActorConfig(params="a:1", replay=("a:2",))),
    ],
)
def test_defaults_fill_only_what_is_left_at_none_and_name_real_settings(role, config):
    for algorithm in algorithms().values():
        filled = with_defaults(config, algorithm, role)
        for name, value in algorithm.defaults.get(role, {}).items():
            assert getattr(config, name) is None, (
                f"{algorithm.name}: {role}.{name} has no None default to fill"
            )
            assert getattr(filled, name) == value
        given = {name: getattr(filled, name) for name in algorithm.defaults.get(role, {})}
        if given:  # a value given explicitly wins over the algorithm's default
            first = next(iter(given))
            explicit = dataclasses.replace(config, **{first: given[first] * 2 if given[first] else 1})
            assert getattr(with_defaults(explicit, algorithm, role), first) == getattr(explicit, first)


def test_every_algorithm_provides_what_the_wiring_calls():
    for algorithm in algorithms().values():
        acting, learning = algorithm.acting(), algorithm.learning()
        assert list(inspect.signature(acting.make_policy).parameters)[:2] == ["weights", "spaces"]
        assert list(inspect.signature(acting.make_explorer).parameters) == ["settings", "spaces", "rng"]
        assert list(inspect.signature(learning.make_learning).parameters) == ["settings", "spaces", "device"]
        assert list(inspect.signature(acting.make_stateful).parameters) == ["explorer"]
        writing = algorithm.writing()
        assert list(inspect.signature(writing.replay_signature).parameters) == ["spaces", "compression"]
        if getattr(writing, "SEQUENCES", False):  # sequences' windows (R2D2): the actor makes their writers
            assert list(inspect.signature(writing.geometry).parameters) == ["settings", "spaces"]
            assert list(inspect.signature(writing.table_settings).parameters) == [
                "actor",
                "learner",
                "spaces",
            ]
            assert callable(writing.ActorWindows)
            continue
        assert list(inspect.signature(writing.make_writer).parameters) == ["settings", "spaces"]
        assert callable(writing.item_columns)


def test_each_algorithms_own_settings_are_declared_next_to_its_code_and_composed_into_the_role_configs():
    """An algorithm's settings live in its package (settings_module: ROLE_SETTINGS); the role configs inherit them,
    so the flag, the fleet-file key and docs/settings.md come from that one declaration, and the role configs'
    own modules do not declare them."""
    from apexrl.common.settings import settings_of

    roles = {"actor": ActorConfig, "learner": LearnerConfig}
    for algorithm in algorithms().values():
        for role, cls in algorithm.role_settings().items():
            assert issubclass(roles[role], cls), (algorithm.name, role)
            names = {f.name for f in dataclasses.fields(cls)}
            assert names == set(algorithm.own_settings(role)) and names
            assert names <= {s.name for s in settings_of(roles[role])}
            for name in names:  # declared once: in the algorithm's package, not again in the role config
                assert inspect.getsource(roles[role]).count(f"    {name}:") == 0, (role, name)
    with pytest.raises(ValueError, match=r"noise_correlation \(1\.5\) must be in \[0, 1\)"):
        ActorConfig(params="127.0.0.1:1", replay=("127.0.0.1:2",), noise_correlation=1.5)
    with pytest.raises(ValueError, match=r"policy_delay \(0\) must be a positive integer"):
        LearnerConfig(replay=("127.0.0.1:2",), policy_delay=0)


def test_apexrl_algorithms_registers_packages_beyond_the_built_in_ones_and_names_a_bad_one(monkeypatch):
    monkeypatch.setenv("APEXRL_ALGORITHMS", " tests.support.toy_algorithm ,")
    found = algorithms()
    assert list(found) == ["dqn", "dpg", "r2d2", "linear-q"] and names()[-1] == "linear-q"
    assert for_action_kind(AUTO, DISCRETE).name == "dqn"  # auto still picks the built-in one
    assert found["linear-q"].own_settings("actor") == ("linear_epsilon",)
    monkeypatch.setenv("APEXRL_ALGORITHMS", "tests.support.no_such_package")
    with pytest.raises(ValueError, match=r"APEXRL_ALGORITHMS: tests\.support\.no_such_package registers no"):
        algorithms()
    monkeypatch.setenv("APEXRL_ALGORITHMS", "apexrl.algorithms.dqn")  # a built-in one again: the same record
    assert list(algorithms()) == ["dqn", "dpg", "r2d2"]

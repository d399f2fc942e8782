"""The algorithm seam: which algorithms exist, which one plays an environment, and their default settings.

Adding an algorithm is its own package (see `apexrl.algorithms`) plus its registration: one line in `_PACKAGES`
for a built-in one, or its package named in the APEXRL_ALGORITHMS environment variable (comma-separated) for one
that lives elsewhere: every process of a fleet (the launcher's roles inherit its environment) then knows it, its
settings included. Pure data: no torch, no gymnasium, so the launcher and the role configs can consult it before
any model loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from apexrl.common.spaces import BOX, DISCRETE, EnvSpaces

AUTO = "auto"
# The registration: one package per algorithm, each with an ALGORITHM record in its __init__.
_PACKAGES = ("apexrl.algorithms.dqn", "apexrl.algorithms.dpg", "apexrl.algorithms.r2d2")
# Packages of further algorithms, comma-separated, registered after the built-in ones (auto still picks those).
PLUGINS_VARIABLE = "APEXRL_ALGORITHMS"
# Role settings an algorithm may give defaults for (a setting left at None takes the algorithm's value).
ROLES = ("fleet", "learner", "actor")
# How messages name the action spaces.
SPACE_NAMES = {DISCRETE: "Discrete", BOX: "Box"}

T = TypeVar("T")


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its name, the action space it plays (DISCRETE or BOX), where its writing (steps into replay
    items), acting and learning halves live, its default settings per role ("fleet", "learner", "actor": setting name -> value), the settings only it
    reads (role -> names), which another algorithm's run refuses when they are given, and what the launch line
    calls its own learner settings' values (`options_label`: dpg's are TD3's options)."""

    name: str
    action_kind: str
    summary: str
    writing_module: str
    acting_module: str
    learning_module: str
    defaults: Mapping[str, Mapping[str, Any]]
    settings_module: str | None = None
    options_label: str = "options"

    def __post_init__(self) -> None:
        if self.action_kind not in (DISCRETE, BOX):
            raise ValueError(f"action_kind ({self.action_kind!r}) must be {DISCRETE} or {BOX}")
        unknown = set(self.defaults) - set(ROLES)
        if unknown:
            raise ValueError(f"defaults for unknown roles {sorted(unknown)}; roles are {ROLES}")

    def role_settings(self) -> Mapping[str, type]:
        """Role -> the settings dataclass of this algorithm's own settings for it (none for a role it adds none to)."""
        if self.settings_module is None:
            return {}
        return importlib.import_module(self.settings_module).ROLE_SETTINGS

    def own_settings(self, role: str) -> tuple[str, ...]:
        """The names of the settings only this algorithm reads in `role`."""
        cls = self.role_settings().get(role)
        return () if cls is None else tuple(f.name for f in dataclasses.fields(cls))

    def writing(self) -> ModuleType:
        """How actors turn steps into replay items: `make_writer(settings, spaces)`, `item_columns(items)`,
        `replay_signature(spaces, compression)` (algorithms/base.py). Pure numpy: the launcher asks it too."""
        return importlib.import_module(self.writing_module)

    def acting(self) -> ModuleType:
        """The actor's half: `make_policy(weights, spaces)` and `make_explorer(...)`."""
        return importlib.import_module(self.acting_module)

    def learning(self) -> ModuleType:
        """The learner's half (torch): `make_learning(config, spaces, device)`."""
        return importlib.import_module(self.learning_module)


def algorithms() -> dict[str, Algorithm]:
    """Every registered algorithm by name: the built-in ones, then those named in APEXRL_ALGORITHMS."""
    found = {}
    for package in (*_PACKAGES, *plugin_packages()):
        try:
            algorithm = importlib.import_module(package).ALGORITHM
        except (ImportError, AttributeError) as err:
            raise ValueError(f"{PLUGINS_VARIABLE}: {package} registers no algorithm ({err})") from None
        if algorithm.name in found and found[algorithm.name] is not algorithm:
            raise ValueError(
                f"{PLUGINS_VARIABLE}: {package} registers {algorithm.name!r}, a name already taken"
            )
        found[algorithm.name] = algorithm
    return found


def plugin_packages() -> tuple[str, ...]:
    """The packages APEXRL_ALGORITHMS names."""
    return tuple(name.strip() for name in os.environ.get(PLUGINS_VARIABLE, "").split(",") if name.strip())


def names() -> tuple[str, ...]:
    """The values an `algorithm` setting accepts: auto, then every registered name."""
    return (AUTO, *algorithms())


def get(name: str) -> Algorithm:
    """The algorithm called `name`; ValueError naming the choices otherwise."""
    found = algorithms()
    if name not in found:
        raise ValueError(f"algorithm ({name!r}) must be one of {', '.join(names())}")
    return found[name]


def for_action_kind(name: str, action_kind: str, env_id: str = "the environment") -> Algorithm:
    """The algorithm `name` stands for on an action space of this kind: "auto" picks the one registered for it
    (Discrete -> dqn, Box -> dpg); a named one must play it. ValueError says which would."""
    if name == AUTO:
        matching = [a for a in algorithms().values() if a.action_kind == action_kind]
        if not matching:
            raise ValueError(f"no algorithm plays {env_id}'s {action_kind} action space")
        return matching[0]
    algorithm = get(name)
    if algorithm.action_kind != action_kind:
        fitting = ", ".join(a.name for a in algorithms().values() if a.action_kind == action_kind) or "none"
        raise ValueError(
            f"algorithm {algorithm.name} needs a {SPACE_NAMES[algorithm.action_kind]} action space; "
            f"{env_id} has a {SPACE_NAMES[action_kind]} one (algorithms for it: {fitting})"
        )
    return algorithm


def for_spaces(name: str, spaces: EnvSpaces, env_id: str = "the environment") -> Algorithm:
    """`for_action_kind` of these spaces."""
    return for_action_kind(name, spaces.action_kind, env_id)


def role_settings(role: str) -> tuple[type, ...]:
    """The settings dataclasses every registered algorithm adds to `role` ("actor", "learner"): the bases a role
    config composes, so an algorithm's settings are declared once, next to its code."""
    return tuple(cls for a in algorithms().values() if (cls := a.role_settings().get(role)) is not None)


def check_role_settings(config: Any, role: str) -> None:
    """ValueError for a value one of the algorithms' own settings refuses (each settings class's `check`)."""
    for cls in role_settings(role):
        cls.check(config)


def with_defaults(config: T, algorithm: Algorithm, role: str) -> T:
    """`config` (a frozen settings dataclass) with every setting it leaves at None that `algorithm` has a default
    for in `role` filled in; settings given explicitly stay."""
    for other in algorithms().values():
        if other.name == algorithm.name:
            continue
        given = [
            name
            for name in other.own_settings(role)
            if name not in algorithm.own_settings(role) and getattr(config, name, None) is not None
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)}: {'a setting' if len(given) == 1 else 'settings'} of algorithm "
                f"{other.name}, but this run's algorithm is {algorithm.name}"
            )
    defaults = algorithm.defaults.get(role, {})
    fields = {f.name for f in dataclasses.fields(config)}
    missing = sorted(set(defaults) - fields)
    if missing:
        raise ValueError(f"algorithm {algorithm.name} has {role} defaults for unknown settings {missing}")
    fill = {name: value for name, value in defaults.items() if getattr(config, name) is None}
    return dataclasses.replace(config, **fill) if fill else config

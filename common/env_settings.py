"""Which environment a run plays, as settings: its id, the plugin modules imported first (their registrations run),
and the constructor's keyword arguments. Declared here once and used by the fleet, the learner, every actor and
`apexrl evaluate`, so that all of them build the same environment (`apexrl.common.environments.make_env`).

No gymnasium import: the launcher and the role configs read these settings before any environment is made.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apexrl.common.settings import setting


class EnvKwargs:
    """Keyword arguments of the environment's constructor (`gymnasium.make(id, **kwargs)`): a JSON object.

    Kept as canonical JSON text, so a value is hashable, compares by content and is written on a command line as
    it was read (`--env-kwargs '{"map_name": "8x8"}'`); a fleet file gives it as a table, Python as a dict. Its
    errors say what is wrong and leave naming the setting to the caller."""

    __slots__ = ("_text",)
    # How messages name the form (common/settings.py `expected`).
    EXPECTED = 'a JSON object such as \'{"map_name": "8x8"}\''

    def __init__(self, value: Mapping[str, Any] | None = None) -> None:
        value = {} if value is None else value
        if not isinstance(value, Mapping):
            raise ValueError(f"not a JSON object (keyword arguments, a dict in Python): {value!r}")
        bad = [k for k in value if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise ValueError(f"keys must be Python identifiers, got {bad}")
        try:
            self._text = json.dumps(dict(value), sort_keys=True, separators=(", ", ": "), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"JSON values only ({err})") from None

    @classmethod
    def parse(cls, text: str) -> EnvKwargs:
        """From command-line text: a JSON object such as '{"map_name": "8x8", "is_slippery": false}'."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON: {err}") from None
        return cls(value)

    @classmethod
    def from_value(cls, value: Any) -> EnvKwargs:
        """From a fleet file or Python: a table (a dict), or the JSON text of one."""
        if isinstance(value, EnvKwargs):
            return value
        return cls.parse(value) if isinstance(value, str) else cls(value)

    def as_dict(self) -> dict[str, Any]:
        """A fresh copy of the arguments (the caller may change it)."""
        return json.loads(self._text)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"EnvKwargs({self._text})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EnvKwargs) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __bool__(self) -> bool:
        return self._text != "{}"


NO_KWARGS = EnvKwargs()


@dataclass(frozen=True)
class EnvChoice:
    """An environment as every role builds it: `id` (a registered id, or `package.module:Id` whose module
    registers it), `modules` imported first, and the constructor's `kwargs`. `trusted` false marks a choice read
    from a file (a checkpoint, a kept policy): the modules it names are not imported, since importing runs their
    code, until the user names them (`--env-module`) or says to trust them (`--trust-env-modules`)."""

    id: str
    modules: tuple[str, ...] = ()
    kwargs: EnvKwargs = field(default=NO_KWARGS)
    trusted: bool = field(default=True, compare=False)
    # Read from a file: even once trusted, its modules are never looked for in the working directory.
    from_file: bool = field(default=False, compare=False)

    def read_from_file(self) -> EnvChoice:
        """This choice as read from a file: untrusted until the user says otherwise."""
        return dataclasses.replace(self, trusted=False, from_file=True)

    def trusting(self) -> EnvChoice:
        """This choice with its modules trusted (the user said so)."""
        return dataclasses.replace(self, trusted=True)

    @classmethod
    def of(cls, config: Any) -> EnvChoice:
        """The choice a settings object makes (its env, env_module and env_kwargs; the last two optional)."""
        return cls(
            config.env,
            tuple(getattr(config, "env_module", ()) or ()),
            getattr(config, "env_kwargs", None) or NO_KWARGS,
        )

    @property
    def registered_id(self) -> str:
        """The id without its module: `my_envs:Corridor-v0` -> `Corridor-v0`."""
        return self.id.rpartition(":")[2]

    @property
    def all_modules(self) -> tuple[str, ...]:
        """The modules to import before the id is looked up: `modules`, then the one named in the id."""
        module = self.id.rpartition(":")[0]
        return (*self.modules, module) if module else self.modules

    def run_name(self) -> str:
        """A file-name-safe name for run directories: the registered id with every character other than
        letters, digits, '.', '-' and '_' replaced by '_' (`ALE/Pong-v5` -> `ALE_Pong-v5`)."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.registered_id) or "env"

    def describe(self) -> str:
        """The id with its arguments, for messages: `FrozenLake-v1 {"map_name": "8x8"}`."""
        return f"{self.id} {self.kwargs}" if self.kwargs else self.id


def env_module_setting(wiring: str | None = None) -> tuple[str, ...]:
    return setting(
        (),
        "comma-separated Python modules imported before the environment is made, so that their "
        "gymnasium.register(...) calls (or gym 0.26's) run: a plugin package's environments "
        "(installed, on PYTHONPATH, or in the working directory)",
        wiring=wiring,
        metavar="MODULES",
    )


def env_kwargs_setting(wiring: str | None = None) -> EnvKwargs:
    return setting(
        NO_KWARGS,
        "keyword arguments of the environment's constructor, a JSON object: "
        '\'{"map_name": "8x8", "is_slippery": false}\' (in a fleet file: a table)',
        wiring=wiring,
        metavar="JSON",
    )

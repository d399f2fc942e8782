"""Settings declared once: a role's configuration is one frozen dataclass whose fields carry their help text, and
its command-line flags, its fleet-file keys and the launcher's argv for it are all derived from those fields.

    @dataclass(frozen=True)
    class ReplayConfig:
        capacity: int = setting(1_000_000, "rows the shard keeps; the oldest is evicted first")

gives `--capacity` (default and help from the field), the fleet-file key `capacity`, and `to_argv` writes
`--capacity N` when a launcher sets it. Validation lives in the dataclass's `__post_init__` (ValueError naming the
value), so a value is checked the same way whether it came from a flag, a fleet file or Python. Before it, `coerce`
brings a value to the field's type as a fleet file or a Python caller spells it (a list or comma-separated text for
a tuple, an int for a float) and refuses any other with a SettingsError naming the setting and the expected form in
plain words (`seed must be an integer, got 'zero'`), never a Python type name.

Why a small helper and not a library (tyro, pydantic-settings): the three derivations must agree exactly, and the
fleet file needs the same names and parsers as the flags. ~200 lines here do all three with the standard library;
a library would do one of them and leave the other two to glue code.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from apexrl.common.arg_parser import ArgParser, plain

C = TypeVar("C")

# A field whose value the launcher derives from the fleet (addresses, ports it picks, seeds): its metadata names
# where the value comes from, and a fleet file may not set it in a role's table.
_WIRING = "wiring"


class SettingsError(ValueError):
    """A value that cannot be used; the message names the setting, where it came from and the value."""


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    wiring: str | None = None,  # noqa: A002
    metavar: str | None = None,
    choices: Sequence[Any] | None = None,
    positional: bool = False,
) -> Any:
    """A dataclass field that is also a flag and a fleet-file key. `wiring` marks a value the launcher sets
    (and says from what); `choices` restricts the values; `positional` makes it an argument without a flag."""
    if not help:
        raise ValueError("every setting needs a help text")
    metadata = {
        "help": help,
        _WIRING: wiring,
        "metavar": metavar,
        "choices": choices,
        "positional": positional,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a settings dataclass, with everything derived from it."""

    name: str
    type: Any
    default: Any  # dataclasses.MISSING when required
    help: str
    wiring: str | None
    metavar: str | None
    choices: Sequence[Any] | None
    positional: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def base_type(self) -> Any:
        """The type without `| None`."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        if _is_union(self.type) and len(args) == 1:
            return args[0]
        return self.type

    @property
    def optional(self) -> bool:
        return _is_union(self.type) and type(None) in typing.get_args(self.type)

    def parse(self, text: str) -> Any:
        """A value from its command-line text; argparse.ArgumentTypeError saying the expected form otherwise."""
        kind = self.base_type
        if typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            try:
                return tuple(_scalar(item, part.strip()) for part in text.split(",") if part.strip())
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"expected {expected(kind)}, got {text!r}") from None
        return _scalar(kind, text)

    def format(self, value: Any) -> str:
        """The command-line text of a value (the inverse of parse)."""
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return repr(value)
        return str(value)

    def coerce(self, value: Any, where: str | None = None) -> Any:
        """A value from a fleet file (TOML/YAML types) or a Python caller, as the field's type: a list, a tuple or
        comma-separated text for a tuple, an int for a float, a path for text, a type's own text form (a
        signature, environment arguments as JSON) or value (a table of them). SettingsError naming the setting
        (after `where`, the fleet-file table) and the expected form for anything else."""
        what = f"{where}: {self.name}" if where else self.name
        shown = "<redacted>" if self.name == "token" else repr(value)
        if value is None:
            if self.optional:
                return None
            raise SettingsError(f"{what} must not be empty")
        kind = self.base_type
        if isinstance(kind, type) and callable(getattr(kind, "from_value", None)):
            try:  # a type that reads a fleet file's own value (e.g. a table of environment arguments)
                return kind.from_value(value)
            except (ValueError, TypeError) as err:
                raise SettingsError(f"{what}: {err}") from None
        if isinstance(value, str) and (
            typing.get_origin(kind) is tuple or kind not in (int, float, str, bool)
        ):
            try:  # comma-separated items, or a type with its own text form (e.g. a signature)
                return self.parse(value)
            except argparse.ArgumentTypeError as err:
                raise SettingsError(f"{what}: {err}") from None
        if typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            try:
                if not isinstance(value, list | tuple):
                    raise ValueError(value)
                return tuple(_checked(item, v) for v in value)
            except ValueError:
                raise SettingsError(
                    f"{what} must be a list of {_PLURALS.get(item, 'values')}, got {shown}"
                ) from None
        try:
            return _checked(kind, value)
        except ValueError:
            raise SettingsError(f"{what} must be {expected(kind)}, got {shown}") from None


def coerce_fields(config: Any, cls: type | None = None) -> None:
    """Bring every setting of `config` (a settings dataclass, frozen or not; `cls`: the settings class whose fields
    to check, when `config`'s own class adds fields of its own) to its declared type, in place, as `Setting.coerce`
    does: called first thing in `__post_init__`, so that Python callers may write values as they write any others
    (`env_kwargs={"map_name": "8x8"}`, `env_module="corridor"`) and a wrong type (`seed="zero"`) is a
    SettingsError naming the setting, not a TypeError from deep inside a run."""
    for s in settings_of(cls or type(config)):
        value = getattr(config, s.name)
        checked = s.coerce(value)
        if checked is not value:  # the dataclass may be frozen: this is still its construction
            object.__setattr__(config, s.name, checked)


def settings_of(cls: type) -> list[Setting]:
    """The settings of a settings dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    result = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
            )
        )
        result.append(
            Setting(
                f.name,
                hints[f.name],
                default,
                f.metadata["help"],
                f.metadata[_WIRING],
                f.metadata["metavar"],
                f.metadata["choices"],
                f.metadata.get("positional", False),
            )
        )
    return result


def add_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *, overrides: bool = False
) -> None:
    """One flag per setting of `cls`, with the field's default and help. With `overrides`, a flag not given is
    absent from the parsed namespace (so it can override a fleet file's value only when given)."""
    for s in settings_of(cls):
        help_text = s.help
        if s.wiring:
            help_text += f" [set by `apexrl launch` from {s.wiring}]"
        if s.positional:
            parser.add_argument(s.name, type=s.parse, help=help_text, metavar=s.metavar or s.name.upper())
            continue
        if s.base_type is bool:
            parser.add_argument(
                s.flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS if overrides else s.default,
                help=help_text + f" (default: {s.default})",
            )
            continue
        kwargs: dict[str, Any] = {"type": s.parse, "help": help_text, "metavar": s.metavar or s.name.upper()}
        if s.choices is not None:
            kwargs["choices"] = s.choices
        if s.required and not overrides:
            kwargs["required"] = True
        elif not s.required:
            kwargs["default"] = argparse.SUPPRESS if overrides else s.default
            if s.default is not None:  # a None default is explained by the help text itself ("none: ...")
                kwargs["help"] += f" (default: {s.format(s.default)})"
        if overrides:
            kwargs["default"] = argparse.SUPPRESS
        parser.add_argument(s.flag, **kwargs)


def from_namespace(cls: type[C], args: argparse.Namespace) -> C:
    """Build `cls` from parsed flags; SettingsError (naming the flag) when the dataclass refuses a value."""
    values = {s.name: getattr(args, s.name) for s in settings_of(cls)}
    try:
        return cls(**values)
    except (ValueError, TypeError) as err:
        raise SettingsError(_with_flag(str(err), cls)) from None


def coerce_table(
    cls: type,
    table: Mapping[str, Any],
    where: str,
    *,
    placement: Sequence[str] = (),
    allow_wiring: bool = False,
) -> dict[str, Any]:
    """The values a fleet-file table gives `cls`'s settings (keys = field names), type-checked; `placement` keys
    are the caller's and skipped. Unknown keys, wrong types and (unless allowed) keys the launcher sets raise
    SettingsError naming the table and key. Values are checked together when the config is built."""
    by_name = {s.name: s for s in settings_of(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in placement:
            continue
        s = by_name.get(key)
        if s is None:
            allowed = [*placement, *(k for k in settable_keys(cls) if k not in placement)]
            raise SettingsError(f"{where}: unknown key {key!r} (allowed: {', '.join(allowed)})")
        if s.wiring and not allow_wiring:
            raise SettingsError(f"{where}: {key} is set by the launcher from {s.wiring}; remove it")
        values[key] = s.coerce(value, where)
    return values


def settable_keys(cls: type) -> list[str]:
    """The keys a fleet file may set for `cls` (everything but what the launcher wires)."""
    return [s.name for s in settings_of(cls) if not s.wiring]


def to_argv(config: Any, *, skip_defaults: bool = True) -> list[str]:
    """The flags that reproduce `config` (fields equal to their default left out unless asked)."""
    argv: list[str] = []
    for s in settings_of(type(config)):
        value = getattr(config, s.name)
        if s.positional:
            argv.insert(0, s.format(value))
            continue
        if skip_defaults and not s.required and value == s.default:
            continue
        if s.base_type is bool:
            argv.append(s.flag if value else "--no-" + s.flag[2:])
        elif value is not None:
            argv += [s.flag, s.format(value)]
    return argv


def parse_argv(cls: type[C], argv: Sequence[str], prog: str) -> C:
    """Parse a role's argv exactly as its command would (the launcher checks every role before starting any)."""
    parser = _ThrowingParser(prog=prog, add_help=False)
    add_arguments(parser, cls)
    return from_namespace(cls, parser.parse_args(list(argv)))


class _ThrowingParser(ArgParser):
    """The one-line errors of `apexrl`'s parser, raised as a SettingsError for the launcher to report."""

    def error(self, message: str) -> typing.NoReturn:
        raise SettingsError(f"{self.prog}: {plain(message)}")


def _with_flag(message: str, cls: type) -> str:
    """Name the flag as well as the field in a dataclass's own message."""
    for s in settings_of(cls):
        if message.startswith(f"{s.name} "):
            return f"{s.flag}: {message}"
    return message


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


# The plain words for a type in messages (never its Python name: `EnvKwargs` means nothing to a user). A type of
# its own says it with an EXPECTED class attribute.
_EXPECTED = {int: "an integer", float: "a number", bool: "a boolean (true or false)", str: "a string"}
_PLURALS = {int: "integers", float: "numbers", bool: "true/false values", str: "strings"}


def expected(kind: Any) -> str:
    """The form a value of `kind` takes, in plain words: "an integer", "a comma-separated list of strings"."""
    if typing.get_origin(kind) is tuple:
        return f"a comma-separated list of {_PLURALS.get(typing.get_args(kind)[0], 'values')}"
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    return getattr(kind, "EXPECTED", None) or f"a {getattr(kind, '__name__', 'value').lower()}"


def _scalar(kind: Any, text: str) -> Any:
    """One value from its command-line text; argparse.ArgumentTypeError naming the expected form otherwise."""
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(kind, type) and hasattr(kind, "parse") and callable(kind.parse):
            return kind.parse(text)
        return kind(text)
    except (ValueError, TypeError) as err:
        detail = f" ({err})" if kind not in _EXPECTED else ""  # a type of its own says what is wrong
        raise argparse.ArgumentTypeError(f"expected {expected(kind)}, got {text!r}{detail}") from None


def _checked(kind: Any, value: Any) -> Any:
    """`value` as `kind` (an int for a float, a path for text, numpy's numbers too), or ValueError. bool is not
    taken for a number, nor a number for a bool."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        value = int(value) if ok else value
    elif kind is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is str:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        ok = isinstance(value, str)
    else:
        ok = not isinstance(kind, type) or isinstance(value, kind)
    if not ok:
        raise ValueError(value)
    return value

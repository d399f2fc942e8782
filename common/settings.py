"""Settings declared once: a role's configuration is one frozen dataclass whose fields carry their help text, and
its command-line flags, its fleet-file keys and the launcher's argv for it are all derived from those fields.

    @dataclass(frozen=True)
    class ReplayConfig:
        capacity: int = setting(1_000_000, "rows the shard keeps; the oldest is evicted first")

gives `--capacity` (default and help from the field), the fleet-file key `capacity`, and `to_argv` writes
`--capacity N` when a launcher sets it. Validation lives in the dataclass's `__post_init__` (ValueError naming the
value), so a value is checked the same way whether it came from a flag, a fleet file or Python.

Why a small helper and not a library (tyro, pydantic-settings): the three derivations must agree exactly, and the
fleet file needs the same names and parsers as the flags. ~200 lines here do all three with the standard library;
a library would do one of them and leave the other two to glue code.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

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
        """A value from its command-line text."""
        kind = self.base_type
        if typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            return tuple(_scalar(item, part.strip(), self.flag) for part in text.split(",") if part.strip())
        return _scalar(kind, text, self.flag)

    def format(self, value: Any) -> str:
        """The command-line text of a value (the inverse of parse)."""
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return repr(value)
        return str(value)

    def coerce(self, value: Any, where: str) -> Any:
        """Check a value from a fleet file (TOML/YAML types) against the field's type."""
        if value is None:
            if self.optional:
                return None
            raise SettingsError(f"{where}: {self.name} must not be empty")
        kind = self.base_type
        if typing.get_origin(kind) is tuple:
            if isinstance(value, str):
                return self.parse(value)
            if not isinstance(value, list | tuple):
                raise SettingsError(f"{where}: {self.name} must be a list, got {value!r}")
            item = typing.get_args(kind)[0]
            return tuple(_checked(item, v, f"{where}: {self.name}") for v in value)
        if isinstance(kind, type) and callable(getattr(kind, "from_value", None)):
            try:  # a type that reads a fleet file's own value (e.g. a table of environment arguments)
                return kind.from_value(value)
            except (ValueError, TypeError) as err:
                raise SettingsError(f"{where}: {self.name}: {err}") from None
        if kind not in (int, float, str, bool) and isinstance(value, str):
            return self.parse(value)  # a type with its own text form (e.g. a signature)
        return _checked(kind, value, f"{where}: {self.name}")


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


class _ThrowingParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise SettingsError(f"{self.prog}: {message}")


def _with_flag(message: str, cls: type) -> str:
    """Name the flag as well as the field in a dataclass's own message."""
    for s in settings_of(cls):
        if message.startswith(f"{s.name} "):
            return f"{s.flag}: {message}"
    return message


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _scalar(kind: Any, text: str, flag: str) -> Any:
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
        name = getattr(kind, "__name__", str(kind))
        raise argparse.ArgumentTypeError(f"{flag} wants {name}, got {text!r} ({err})") from None


def _checked(kind: Any, value: Any, where: str) -> Any:
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }.get(kind)
    if ok is None:
        return value
    if not ok:
        raise SettingsError(f"{where} must be {kind.__name__}, got {value!r}")
    return float(value) if kind is float else value

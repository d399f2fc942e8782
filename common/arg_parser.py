"""An ArgumentParser whose every error is one line, `PROG: error: MESSAGE` on stderr with exit status 2, like the
settings errors `apexrl` prints.

argparse's own errors print the whole usage first (20 lines for a role), name Python types (`invalid int value`),
and report a subcommand's unknown flag with the top-level usage and no hint. Here a bad value names the flag and the
form it expects, an unknown flag is reported by the subcommand that was given it with the nearest known flag, and an
unknown command or choice suggests the nearest one. `--help` is argparse's, unchanged.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2  # common/process.py's EXIT_BAD_CONFIG (process.py imports this module through settings.py)

# The built-in types argparse names in `invalid TYPE value`, as a user reads them.
_TYPE_WORDS = {"int": "an integer", "float": "a number"}


class ArgParser(argparse.ArgumentParser):
    """argparse with one-line errors (its subparsers are of the same class), and no abbreviated flags: `--max-second`
    is an unknown flag with a suggestion, not a silent `--max-seconds` that a flag added later would make ambiguous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {plain(message)}\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # a subcommand hands what it did not know up to here: report it as that subcommand's
            parser = chosen_parser(self, parsed)
            parser.error(unknown_arguments(parser, extras))
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's hook for `choices` (the subcommand too): its message lists every choice as a Python repr.
        if action.choices is None or value in action.choices:
            return
        known = [str(choice) for choice in action.choices]
        if action.nargs == argparse.PARSER:
            hint = _nearest(str(value), known) or f" (one of: {', '.join(known)})"
            raise argparse.ArgumentError(None, f"unknown command {value!r}{hint}")
        raise argparse.ArgumentError(
            action, f"expected one of {', '.join(known)}, got {value!r}{_nearest(str(value), known)}"
        )


def plain(message: str) -> str:
    """argparse's message in the form of apexrl's others: `argument --seed: invalid int value: 'x'` ->
    `--seed: expected an integer, got 'x'`."""
    match = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
    if match is None:
        return message
    name, text = match.group(1).split("/")[0], match.group(2)
    invalid = re.fullmatch(r"invalid (\w+) value: (.*)", text, re.DOTALL)
    if invalid is not None:
        kind = invalid.group(1)
        text = f"expected {_TYPE_WORDS.get(kind, 'a ' + kind)}, got {invalid.group(2)}"
    elif text == "expected one argument":
        text = "expected a value"
    elif text.startswith("ignored explicit argument "):
        text = f"takes no value, got {text.removeprefix('ignored explicit argument ')}"
    return f"{name}: {text}"


def unknown_arguments(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """What `parser` did not know: each unknown flag with the nearest of its own, else the stray values."""
    flags = [a.partition("=")[0] for a in extras if a.startswith("-") and not _is_number(a)]
    if not flags:
        return f"unexpected argument{'s' if len(extras) > 1 else ''} {' '.join(map(repr, extras))}"
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    return "; ".join(f"unknown flag {flag}{_nearest(flag, known)}" for flag in flags)


def chosen_parser(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand `namespace` names, or `parser` itself when it has none."""
    for action in parser._actions:
        if action.nargs == argparse.PARSER and isinstance(action.choices, dict):
            sub = action.choices.get(getattr(namespace, action.dest, None))
            if isinstance(sub, argparse.ArgumentParser):
                return chosen_parser(sub, namespace)
    return parser


def _nearest(value: str, known: Sequence[str]) -> str:
    """' (did you mean X?)' for the known name closest to `value` (case aside), or '' when none is close."""
    by_folded = {name.casefold(): name for name in known}
    close = difflib.get_close_matches(value.casefold(), list(by_folded), n=1)
    return f" (did you mean {by_folded[close[0]]}?)" if close else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

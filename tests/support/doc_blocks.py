"""The shell blocks of the documentation: fenced blocks tagged bash, sh or shell, and the commands in them.

    for block in shell_blocks(REPO, ["README.md", "docs/*.md"]):
        block.key          # "README.md: apexrl launch --env Pendulum-v1": names the block in a catalogue
        block.commands()   # its commands: continuation lines joined, blank and comment-only lines left out

Pure text: nothing is run here (tests/support/doc_runner.py runs them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGUAGES = ("bash", "sh", "shell")
_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```", re.S | re.M)
KEY_CHARACTERS = (
    72  # of the first command (no trailing comment, whitespace collapsed): tells a file's blocks apart
)


@dataclass(frozen=True)
class Block:
    """One fenced shell block: the file (relative to the repository), its first line number and its text."""

    path: str
    line: int
    text: str

    def commands(self) -> list[str]:
        """The block's commands in order: lines ending in a backslash joined with the next, comment-only and blank
        lines dropped (a command's own trailing comment stays: the shell ignores it)."""
        commands, pending = [], ""
        for raw in self.text.splitlines():
            line = pending + raw
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1] + " "
                continue
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(line.strip())
        return commands

    @property
    def key(self) -> str:
        first = self.commands()[0] if self.commands() else "(no command)"
        first = first.split("  #")[
            0
        ]  # a trailing comment (aligned after two or more spaces) is not the command
        return f"{self.path}: {' '.join(first.split())[:KEY_CHARACTERS]}"


def shell_blocks(root: Path, patterns: Iterable[str]) -> list[Block]:
    """Every shell block of the files `patterns` (globs relative to `root`) match, in file and line order."""
    blocks = []
    for path in sorted({p for pattern in patterns for p in root.glob(pattern)}):
        text = path.read_text()
        for match in _FENCE.finditer(text):
            if match.group(1) in SHELL_LANGUAGES:
                line = text.count("\n", 0, match.start()) + 1
                blocks.append(Block(str(path.relative_to(root)), line, match.group(2)))
    return blocks

"""A role process builds the parser of its own subcommand only (launcher/cli.py): what it imports is what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apexrl.launcher.cli import SUBCOMMANDS, build_parser, chosen_subcommand


@pytest.mark.parametrize(
    ("argv", "chosen"),
    [
        (["replay", "--port", "0"], "replay"),
        (["--log-level", "WARNING", "actor", "--params", "x"], "actor"),
        (["--log-level=DEBUG", "learner"], "learner"),
        (["--help"], None),
        (["--version"], None),
        (["actorx"], None),
        ([], None),
        (["--log-level"], None),
    ],
)
def test_the_subcommand_is_the_first_word_after_the_log_level(argv, chosen):
    assert chosen_subcommand(argv) == chosen


def test_the_parser_of_one_subcommand_parses_like_the_whole_one():
    argv = ["--log-level", "WARNING", "replay", "--port", "0", "--capacity", "100"]
    assert vars(build_parser("replay").parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_a_role_process_loads_no_other_role_module():
    probe = (
        "import sys\n"
        "from apexrl.launcher.cli import build_parser\n"
        "build_parser('replay')\n"
        f"print(sorted(m for m in {sorted(SUBCOMMANDS.values())!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "['apexrl.replay_server.server.main']", done.stdout

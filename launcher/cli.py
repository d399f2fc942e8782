"""`apexrl` command-line entry point: one subcommand per role, each run through the same process skeleton.

A role module (`<role>/main.py`) exposes `CONFIG` (its settings dataclass), `HELP` and `run(config, stop) -> int`;
the flags come from the dataclass (common/settings.py), the process skeleton (logging, the stop event on
SIGTERM/Ctrl-C, exit codes, the bearer token from --token, --token-file or APEXRL_TOKEN) from common/process.py.
Role modules import their heavy dependencies inside `run`, so building the parser is cheap and `apexrl replay`
never imports torch. `launch` parses its own arguments.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from apexrl.common.arg_parser import ArgParser
from apexrl.common.port_check import check_ports_free, listening_ports
from apexrl.common.process import (
    EXIT_BAD_CONFIG,
    EXIT_FAILURE,
    exit_within,
    setup_logging,
    stop_on_signals,
    stop_with_launcher,
    with_token,
)
from apexrl.common.settings import SettingsError, add_arguments, from_namespace

log = logging.getLogger("apexrl")

# subcommand -> module
SUBCOMMANDS: dict[str, str] = {
    "replay": "apexrl.replay_server.server.main",
    "replay-reshard": "apexrl.replay_server.durability.reshard",
    "params": "apexrl.parameter_server.main",
    "actor": "apexrl.actor.main",
    "learner": "apexrl.learner.main",
    "evaluate": "apexrl.learner.evaluate",
    "export": "apexrl.learner.export",
    "launch": "apexrl.launcher.main",
    "signature": "apexrl.actor.signature",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `apexrl` parser; with `only`, the subcommand `only` alone (a role process loads its own module, not the
    eight others: ~0.1 s of imports for each of a fleet's processes)."""
    parser = ArgParser(  # one-line errors, exit status 2, for every subcommand (common/arg_parser.py)
        prog="apexrl",
        description="Distributed prioritized experience replay (Ape-X): replay shards, actors, a learner and a "
        "parameter service talking gRPC. Each subcommand runs one role; see 'apexrl ROLE --help'. "
        "Exit status: 0 clean stop, 1 failure, 2 bad configuration.",
    )
    parser.add_argument("--version", action=VersionAction, help="show the version of apexrl and exit")
    add_log_level(parser, default="INFO")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        help_text = module.HELP
        role = sub.add_parser(name, help=help_text, description=_doc(module))
        add_log_level(role, default=argparse.SUPPRESS)  # after the subcommand too; given there, it wins
        if hasattr(module, "CONFIG"):
            add_arguments(role, module.CONFIG)
        else:
            module.add_arguments(role)
    return parser


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def chosen_subcommand(argv: list[str]) -> str | None:
    """The subcommand `argv` names, when its first word that is not --log-level (and its value) names one; None
    otherwise (no subcommand, --help, --version, a typo: the whole parser answers those)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("--log-level="):
            return word if word in SUBCOMMANDS else None
    return None


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        default=default,
        choices=LOG_LEVELS,
        help="log verbosity (default: INFO); before or after the subcommand",
    )


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, for an editable install of the clone)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apexrl")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class VersionAction(argparse.Action):
    """--version: the installed version, looked up only when asked (importlib.metadata costs a role process
    ~15-35 ms of its start-up)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"apexrl {package_version()}")
        parser.exit()


def _doc(module) -> str:
    """The module docstring's first paragraph, without its leading "`apexrl ROLE`:" (the usage line says it)."""
    text = " ".join((module.__doc__ or "").split("\n\n")[0].split())
    return text.split(": ", 1)[1] if text.startswith("`apexrl") and ": " in text else text


# Thread-pool sizes of the BLAS and OpenMP libraries numpy and torch load, read once when they load.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> None:
    """One BLAS thread per role process unless the environment says otherwise (call before numpy is imported).

    Every role shares the machine's cores with the others, and a BLAS pool per process oversubscribes them: its
    threads spin for work and steal the cores. With the default pool the evaluator's batched forward pass took 2.6x
    longer on a loaded 2-core machine, and the default CartPole fleet ran 1,470 env steps/s instead of 2,280
    (README.md, "Speed"). torch keeps its own `--torch-threads`; child processes inherit the setting."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")


def tune_malloc() -> None:
    """Keep glibc from mmapping (and page-faulting) a fresh buffer for every multi-MiB message.

    Serialising or receiving a 14 MB insert batch otherwise costs ~9,000 page faults per message (bench/README.md);
    raising the mmap threshold to its 32 MiB maximum lets freed buffers be reused. No-op off glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 256 * 1024 * 1024)
        libc.mallopt(m_top_pad, 64 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    limit_blas_threads()
    tune_malloc()
    args = build_parser(chosen_subcommand(argv)).parse_args(argv)
    setup_logging(args.log_level)
    module = importlib.import_module(SUBCOMMANDS[args.command])
    if not hasattr(module, "CONFIG"):
        return int(module.run(args) or 0)
    try:
        config = with_token(from_namespace(module.CONFIG, args))  # --token, --token-file or APEXRL_TOKEN
        if hasattr(
            config, "host"
        ):  # a busy port or a foreign --host: one line naming it, before any server starts
            check_ports_free(config.host, listening_ports(config))
    except SettingsError as err:
        print(f"apexrl {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with stop_on_signals() as stop:
        stop_with_launcher(stop)  # started by `apexrl launch`: stop when it is gone
        try:
            return int(module.run(config, stop) or 0)
        except (
            SettingsError
        ) as err:  # found while starting: an unknown environment, a checkpoint that does not fit
            print(f"apexrl {args.command}: error: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        except (OSError, RuntimeError, TimeoutError) as err:  # cannot bind, peer never came, ...
            log.error("%s failed: %s", args.command, err)
            return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())


def entry() -> None:
    """The `apexrl` command and `python -m apexrl.launcher`: run `main` and end the process with its status, even if
    a stuck thread would hold the interpreter's exit (common/process.py exit_within)."""
    status = main()
    exit_within(status)
    sys.exit(status)

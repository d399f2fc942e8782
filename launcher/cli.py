"""`apexrl` command-line entry point: dispatches to one subcommand per role.

Each role module (`<role>/main.py`) exposes `add_arguments(parser)` and `run(args) -> int` and imports its heavy
dependencies inside `run`, so building the parser is cheap and `apexrl replay` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("apexrl.replay_server.main", "run one prioritized replay shard (gRPC ReplayService)"),
    "params": ("apexrl.parameter_server.main", "run a standalone parameter service (versioned weights)"),
    "actor": ("apexrl.actor.main", "run one Ape-X actor (or an evaluator) that feeds the replay shards"),
    "learner": ("apexrl.learner.main", "run the DQN learner, hosting the parameter service"),
    "launch": ("apexrl.launcher.main", "start the roles of one machine (no arguments: a local CartPole fleet)"),
    "evaluate": ("apexrl.launcher.evaluate", "play a learner checkpoint greedily and report its returns"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apexrl",
        description="Distributed prioritized experience replay (Ape-X): replay shards, actors, a learner and a "
                    "parameter service talking gRPC. Each subcommand runs one role; see 'apexrl ROLE --help'.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log verbosity (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        role = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(role)
    return parser


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
    tune_malloc()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

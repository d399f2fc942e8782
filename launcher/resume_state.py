"""What a resumed run continues from, said in the launch's log before any role starts: the learner's last checkpoint
(or fresh weights, when the run was interrupted before its first one), and each local shard's saved replay (kept
when [fleet] replay_durability, or a shard's own checkpoint_dir, saves one; otherwise the replay starts empty and
the learner waits for min_replay_size new rows). Only files are looked at: no model is loaded, no role started.
"""

from __future__ import annotations

import logging
from pathlib import Path

from apexrl.algorithms.checkpoint_files import CHECKPOINT_NAME
from apexrl.launcher.commands import parsed_commands
from apexrl.launcher.fleet_config import FleetConfig


def resume_lines(
    config: FleetConfig, host: str, run_dir: Path, extra_args: dict[str, list[str]]
) -> list[tuple[int, str]]:
    """(logging level, line) for what this machine's roles of a resumed run start from, the learner's first:
    warnings for what was meant to be kept and was not saved."""
    learner: list[tuple[int, str]] = []
    replay: list[tuple[int, str]] = []
    empty: list[str] = []
    restored: list[str] = []
    for role, settings in parsed_commands(config, host, run_dir, extra_args):
        if role.kind == "learner" and settings.checkpoint_dir is not None:
            path = settings.checkpoint_dir / CHECKPOINT_NAME
            if path.is_file():
                learner.append(
                    (logging.INFO, f"the learner resumes from {path} (networks, optimiser, update count)")
                )
            else:
                learner.append(
                    (
                        logging.WARNING,
                        f"no checkpoint in {settings.checkpoint_dir}: the learner starts from fresh weights",
                    )
                )
        elif role.kind == "replay":
            if settings.checkpoint_dir is None:
                empty.append(role.name)
            elif saved_replay(settings.checkpoint_dir, settings.wal):
                restored.append(f"{role.name} from {settings.checkpoint_dir}")
            else:
                replay.append(
                    (
                        logging.WARNING,
                        f"no replay checkpoint in {settings.checkpoint_dir}: {role.name} starts empty",
                    )
                )
    if restored:
        replay.append((logging.INFO, f"the replay is restored: {', '.join(restored)}"))
    if empty:  # replay_durability is off: it gives every shard a directory
        replay.append(
            (
                logging.INFO,
                f"the replay starts empty on {', '.join(empty)} ([fleet] replay_durability is off; "
                f"'checkpoint' keeps it across a resume)",
            )
        )
    return learner + replay


def saved_replay(checkpoint_dir: str | Path, wal: str | Path | None) -> bool:
    """Whether a shard's directories hold anything it restores at start: a checkpoint file or a log segment."""
    from apexrl.replay_server.durability.checkpointer import Checkpointer
    from apexrl.replay_server.durability.wal_format import SEGMENT_NAME

    if Path(checkpoint_dir).is_dir() and Checkpointer.list_files(checkpoint_dir):
        return True
    return (
        wal is not None
        and Path(wal).is_dir()
        and any(SEGMENT_NAME.fullmatch(p.name) for p in Path(wal).iterdir())
    )

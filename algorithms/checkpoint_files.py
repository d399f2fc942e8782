"""Where a run's checkpoints live, and which one a path names; no torch import, so the launcher can name them.

RUN_DIR/checkpoints/checkpoint.pt is the learner's last state (what a resume continues from); best.npz beside it is
the policy the evaluator kept (actor/kept_policy.py). Playing, exporting and `load_policy` take the kept policy by
default and the last checkpoint on request (`--weights last`).
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKPOINT_NAME = "checkpoint.pt"  # the learner's last state
KEPT_POLICY_NAME = "best.npz"  # the policy the evaluator kept (algorithms/policy_file.py)
POLICY_SUFFIX = ".npz"  # a policy file, not a torch checkpoint
BEST, LAST = "best", "last"
WEIGHTS_CHOICES = (BEST, LAST)


def resolve_checkpoint(path: str | os.PathLike, weights: str = BEST) -> Path:
    """A checkpoint file, or in a run directory / checkpoint directory the kept policy (`best.npz`; weights="best",
    falling back to the last checkpoint when the run kept none) or the learner's last checkpoint
    (`checkpoint.pt`; weights="last"). A file named directly is taken as it is."""
    if weights not in WEIGHTS_CHOICES:
        raise ValueError(f"weights ({weights!r}) must be one of {', '.join(WEIGHTS_CHOICES)}")
    path = Path(path)
    if path.is_file():
        return path
    names = (KEPT_POLICY_NAME, CHECKPOINT_NAME) if weights == BEST else (CHECKPOINT_NAME,)
    for folder in (path, path / "checkpoints"):
        for name in names:
            if (folder / name).is_file():
                return folder / name
    looked = " or ".join(names)
    raise FileNotFoundError(f"no checkpoint at {path} (looked for {looked}, also under checkpoints/)")


def weights_setting():
    """The `--weights` flag of the commands that play or export a run's policy (one declaration for all)."""
    from apexrl.common.settings import setting

    return setting(
        BEST,
        "which weights of a run directory: best, the policy the evaluator kept (the round that solved the run, "
        "else its best round; the last checkpoint when it kept none), or last, the learner's last checkpoint",
        choices=WEIGHTS_CHOICES,
    )

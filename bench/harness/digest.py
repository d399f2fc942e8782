"""What the digest scripts (dqn_digest.py, dpg_digest.py) share: a short hash of arrays, and the command line that
imports the code of `--checkout` (this one by default) and prints which checkout it was before the digest lines, so
a baseline run that silently imports this working tree shows."""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np


def digest(arrays: Iterable[np.ndarray]) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def run(doc: str, lines: Iterable[Callable[[], str]]) -> int:
    """Parse --checkout, import its code, print `code: PATH` and then each of `lines`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkout",
        default=str(Path(__file__).resolve().parents[2]),
        help="the checkout whose tests/unit/learner/fakes.py makes the batches",
    )
    args = parser.parse_args()
    sys.path.insert(0, args.checkout)
    import torch

    torch.set_num_threads(1)
    import apexrl.learner.learner

    print(f"code: {Path(apexrl.learner.learner.__file__).resolve().parents[1]}")
    for line in lines:
        print(line())
    return 0

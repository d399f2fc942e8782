"""Role logs capped and rotated by the launcher: each role writes RUN_DIR/logs/NAME.log through a descriptor
opened with O_APPEND, so the launcher rotates in place ("copytruncate"): once a log passes its cap, it is copied to
NAME.log.1 (older copies shifted to .2 ... .KEEP, the oldest dropped) and truncated, and the role's next write lands
at the start of the emptied file. Lines written between the copy and the truncation (microseconds) are lost; a
role that logs without bound (a refusal flood, a crash loop) never fills the disk its checkpoints share.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

KEEP = 2  # rotated copies kept beside the live log


def rotate_if_large(path: Path, max_bytes: int, keep: int = KEEP) -> bool:
    """Rotate `path` when it holds more than `max_bytes`; True when it did. A missing file is left alone."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for index in range(keep, 1, -1):  # .1 -> .2, ...: the oldest is overwritten
        older = path.with_name(f"{path.name}.{index - 1}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{index}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)
    return True

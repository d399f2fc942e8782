"""Exactly-once storing of resent batches: each writer's last stored sequence number, least recently used
forgotten first. Pure, no locks (the table owns the lock).

A batch numbered s from writer w is a resend, and is not stored again, when s is not above the last sequence stored
for w. An empty writer id turns de-duplication off. A writer forgotten (over `max_writers`) is trusted afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class WriterSequences(OrderedDict[str, int]):
    """writer id -> its last stored sequence number, oldest use first (a snapshot saves the items in this order)."""

    def __init__(self, max_writers: int, items: Iterable[tuple[str, int]] = ()) -> None:
        super().__init__(items)
        self.max_writers = max_writers

    def is_resend(self, writer_id: str, sequence: int) -> bool:
        """True when (writer_id, sequence) was stored already (the writer then counts as just used)."""
        if writer_id and self.get(writer_id, -1) >= sequence:
            self.move_to_end(writer_id)
            return True
        return False

    def remember(self, writer_id: str, sequence: int) -> None:
        """Record that `sequence` of `writer_id` is stored (forgetting the least recently used writer beyond the
        limit)."""
        if writer_id:
            self[writer_id] = sequence
            self.move_to_end(writer_id)
            if len(self) > self.max_writers:
                self.popitem(last=False)

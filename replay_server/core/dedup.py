"""Exactly-once storing of resent batches: each writer's last stored sequence number, least recently used forgotten
first, within the identity that holds the most writers. Pure, no locks (the table owns the lock).

A batch numbered s from writer w is a resend, and is not stored again, when s is not above the last sequence stored
for w. An empty writer id turns de-duplication off. A writer forgotten (over `max_writers`) is trusted afresh.

Under role identities the shard qualifies writer ids as `NAME/ID` (server/writer_identity.py). When the table is
full, the writer forgotten is the least recently used one of the identity holding the most writers: one actor that
opens writer after writer forgets its own, never another identity's (whose resends would then be stored twice).
Ids without a `/` (the single-token and open modes) are one identity: the least recently used writer goes, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


def identity_of(writer_id: str) -> str:
    """The identity part of a qualified writer id (`NAME/ID` -> `NAME`; "" when unqualified)."""
    name, slash, _ = writer_id.partition("/")
    return name if slash else ""


class WriterSequences(OrderedDict[str, int]):
    """writer id -> its last stored sequence number, oldest use first (a snapshot saves the items in this order)."""

    def __init__(self, max_writers: int, items: Iterable[tuple[str, int]] = ()) -> None:
        super().__init__()
        self.max_writers = max_writers
        self._by_identity: dict[str, OrderedDict[str, None]] = {}  # each identity's writers, oldest use first
        for writer_id, sequence in items:
            self.remember(writer_id, sequence)

    def is_resend(self, writer_id: str, sequence: int) -> bool:
        """True when (writer_id, sequence) was stored already (the writer then counts as just used)."""
        if writer_id and self.get(writer_id, -1) >= sequence:
            self._used(writer_id)
            return True
        return False

    def remember(self, writer_id: str, sequence: int) -> None:
        """Record that `sequence` of `writer_id` is stored (forgetting, beyond the limit, the least recently used
        writer of the identity that holds the most)."""
        if not writer_id:
            return
        self[writer_id] = sequence
        self._by_identity.setdefault(identity_of(writer_id), OrderedDict())[writer_id] = None
        self._used(writer_id)
        while len(self) > self.max_writers:
            self._forget_one()

    def _used(self, writer_id: str) -> None:
        self.move_to_end(writer_id)
        self._by_identity[identity_of(writer_id)].move_to_end(writer_id)

    def _forget_one(self) -> None:
        identity = max(self._by_identity, key=lambda name: len(self._by_identity[name]))
        writers = self._by_identity[identity]
        oldest, _ = writers.popitem(last=False)
        if not writers:
            del self._by_identity[identity]
        del self[oldest]

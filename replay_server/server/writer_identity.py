"""The writer of an Insert stream as a shard sees it: who it is (common/access.py) decides which writer ids it
de-duplicates under and whether its first insert may fix the table's signature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from apexrl.common.access import Identity, Role
from apexrl.common.errors import PermissionDeniedError
from apexrl.common.signature import Signature

# The roles whose first insert may fix the columns of a table started without --signature. Not actors: with any
# actor's credential, one int8[2] first insert would block every real writer, and checkpoints would keep it.
SIGNATURE_ROLES = frozenset({Role.FLEET, Role.LEARNER, Role.OPERATOR})


class HasSignature(Protocol):
    @property
    def signature(self) -> Signature | None: ...


@dataclass(frozen=True)
class Writer:
    identity: Identity

    def qualified(self, writer_id: str) -> str:
        """The writer id the table de-duplicates by. Under role identities it is the caller's own, `NAME/ID`: a
        row stored under another identity's writer id with sequence 2^64-1 would otherwise make that writer's
        later batches come back "duplicate" while nothing is stored. Unchanged in the single-token and open modes
        (one identity: nothing to keep apart). An empty id (de-duplication off) stays empty."""
        if not writer_id or self.identity.role is Role.FLEET:
            return writer_id
        return f"{self.identity.name}/{writer_id}"

    def check_may_fix_signature(self, table: HasSignature) -> None:
        """PermissionDeniedError when the table has no signature yet and this writer's role may not fix one."""
        if table.signature is None and self.identity.role not in SIGNATURE_ROLES:
            raise PermissionDeniedError(
                f"{self.identity} may not fix the columns of this table by a first insert (it has no --signature): "
                f"start the shard with --signature, or let the learner or an operator make the first insert"
            )

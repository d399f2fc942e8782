"""The batches of a merged insert request (InsertRequest.batch_rows) stored exactly once, as if each had come alone
and in order, in as few table calls as that allows.

The table remembers one number per writer, its last stored sequence L, and stores a call numbered s only when
s > L (dedup.py). Batch i is therefore stored alone first (numbered sequence + i): if that stores it, L was below
it, so every later batch of the request is above L and all of them are stored by one more call, numbered with the
last one's sequence, which leaves L where storing them one by one would. When batch i comes back as a duplicate (a
resend after a broken stream), the next batch is tried alone the same way; when the call for the others fails (one
of them is bad, or the table ran out of room), they are stored one by one from then on, so exactly the bad batch is
refused.

Table layer, no gRPC: the servicer (inserts.py) runs each `step` in its turn of the insert lane, retries it while the
table is not ready (the step keeps what it already stored), and answers each `Outcome` that `settle` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apexrl.common.compression import Column, take_rows
from apexrl.common.errors import ApexError
from apexrl.replay_server.core.types import InsertResult

# One table call: (columns, raw priorities or None, sequence) -> its result; raises ApexError.
InsertCall = Callable[[Mapping[str, Column], "np.ndarray | None", int], InsertResult]


@dataclass(frozen=True)
class Outcome:
    """What a run of consecutive batches got: stored (or duplicates) by one table call, or refused (one batch)."""

    last_sequence: int  # the sequence of the run's last batch
    batches: int
    result: InsertResult | ApexError


class MergedBatches:
    """One merged request's batches and how far they are answered (see the module docstring)."""

    def __init__(
        self,
        columns: Mapping[str, Column],
        priorities: np.ndarray | None,
        offsets: Sequence[int],
        first_sequence: int,
    ) -> None:
        self._columns = columns
        self._priorities = priorities
        self._offsets = offsets  # the first row of each batch, and the end of the last
        self._first_sequence = first_sequence
        self.count = len(offsets) - 1
        self.next = 0  # the first batch not answered yet
        self._merge = True  # false once a call for several batches failed: one by one from then on
        self._alone: InsertResult | None = None  # this step's results so far
        self._rest: InsertResult | None = None

    @property
    def done(self) -> bool:
        return self.next >= self.count

    def step(self, insert: InsertCall) -> None:
        """Store batch `next` alone, then, if that stored it, the batches after it in one call. Raises the error of
        the call that failed; called again after an error, it goes on from what it already stored."""
        i = self.next
        if self._alone is None:
            self._alone = self._store(i, i + 1, insert)
        end = self.count if self._merge else i + 1
        if self._rest is None and not self._alone.duplicate and i + 1 < end:
            self._rest = self._store(i + 1, end, insert)

    def settle(self, error: ApexError | None = None) -> list[Outcome]:
        """The outcomes of the step just made (`error`: why it ended early, or None), in batch order; the next
        step starts after the batches they answer."""
        i, alone, rest = self.next, self._alone, self._rest
        self._alone = self._rest = None
        if alone is None:  # the batch alone was refused
            if error is None:
                raise ValueError("settle() without a step or an error")
            self.next = i + 1
            return [Outcome(self._first_sequence + i, 1, error)]
        outcomes = [Outcome(self._first_sequence + i, 1, alone)]
        self.next = i + 1
        if (
            error is not None
        ):  # the call for the others failed: store them one by one, to refuse just the bad one
            self._merge = False
        elif rest is not None:
            outcomes.append(Outcome(self._first_sequence + self.count - 1, self.count - i - 1, rest))
            self.next = self.count
        return outcomes

    def _store(self, first: int, end: int, insert: InsertCall) -> InsertResult:
        """One table call for batches first .. end - 1, numbered with the last one's sequence."""
        lo, hi = self._offsets[first], self._offsets[end]
        rows = slice(lo, hi)
        columns = {name: take_rows(column, rows) for name, column in self._columns.items()}
        priorities = None if self._priorities is None else self._priorities[lo:hi]
        return insert(columns, priorities, self._first_sequence + end - 1)

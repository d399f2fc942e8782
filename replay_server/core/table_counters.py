"""The table's running totals (InfoResponse's *_total fields, the Prometheus counters), saved with a checkpoint.

Pure: a checkpoint stores them by these field names (snapshot.TableState.counters), so a restored shard's counters
go on from where the saved one stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass
class TableCounters:
    evicted: int = 0  # rows dropped by the ring or the byte bound
    sampled: int = 0  # rows handed out by Sample
    updated: int = 0  # priority updates applied
    stale: int = 0  # priority updates ignored (key evicted or unknown)
    duplicates: int = 0  # resent batches not stored again
    inserted_bytes: int = 0  # bytes of row data ever stored

    def saved(self) -> dict[str, int]:
        """The counters as a checkpoint stores them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_saved(cls, saved: Mapping[str, int]) -> TableCounters:
        """Counters read back from a checkpoint (a name it lacks starts at 0)."""
        return cls(**{field.name: int(saved.get(field.name, 0)) for field in dataclasses.fields(cls)})

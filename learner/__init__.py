"""The learner and the cross-shard sampling SDK.

Public SDK (no torch import): `ShardedReplayClient` samples one batch across many replay shards weighted by
their root sums. The DQN learner itself is in `apexrl.learner.learner` and is started with `apexrl learner`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.learner.sharded_client import PrioritizedBatch, ShardedReplayClient

# Public name -> the module that defines it; loaded on first use.
_EXPORTS = {
    "PrioritizedBatch": "apexrl.learner.sharded_client",
    "ShardedReplayClient": "apexrl.learner.sharded_client",
}
__all__ = ["PrioritizedBatch", "ShardedReplayClient"]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

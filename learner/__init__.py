"""The learner and the cross-shard sampling SDK.

Public SDK (no torch import): `ShardedReplayClient` samples one batch across many replay shards weighted by
their root sums. The DQN learner itself is in `apexrl.learner.learner` and is started with `apexrl learner`.
"""

from apexrl.learner.sharded_client import PrioritizedBatch, ShardedReplayClient

__all__ = ["PrioritizedBatch", "ShardedReplayClient"]

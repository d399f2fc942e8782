"""Actors and the client SDK for custom actors.

Public SDK (no torch import): `ReplayClient` (one replay shard) and `ParameterClient` (versioned weights).
The built-in Ape-X actor lives in `apexrl.actor.apex_actor` and is started with `apexrl actor`.
"""

from apexrl.actor.parameter_client import ParameterClient
from apexrl.actor.replay_client import ReplayClient, SampledBatch, UpdateResult
from apexrl.common.shard_info import ShardInfo

__all__ = ["ParameterClient", "ReplayClient", "SampledBatch", "ShardInfo", "UpdateResult"]

"""The built-in Ape-X actor (`apexrl.actor.apex_actor`, started with `apexrl actor`).

For custom actors this package re-exports the SDK (no torch import); its home is beside the services:
`apexrl.replay_server.client.replay_client.ReplayClient` (one shard), `apexrl.replay_server.client.sharded_writer.ShardedWriter` (many
shards: round-robin, failover, back pressure, `dns:///` membership) and
`apexrl.parameter_server.client.ParameterClient`. Loaded on first use, so `apexrl.actor.config` loads no client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.parameter_server.client import ParameterClient
    from apexrl.replay_server.client.replay_client import ReplayClient
    from apexrl.replay_server.client.sharded_writer import Placement, ShardedWriter
    from apexrl.replay_server.core.types import SampledBatch, ShardInfo, UpdateResult

# Public name -> the module that defines it; loaded on first use.
_EXPORTS = {
    "ParameterClient": "apexrl.parameter_server.client",
    "Placement": "apexrl.replay_server.client.sharded_writer",
    "ReplayClient": "apexrl.replay_server.client.replay_client",
    "SampledBatch": "apexrl.replay_server.core.types",
    "ShardInfo": "apexrl.replay_server.core.types",
    "ShardedWriter": "apexrl.replay_server.client.sharded_writer",
    "UpdateResult": "apexrl.replay_server.core.types",
}
__all__ = [
    "ParameterClient",
    "Placement",
    "ReplayClient",
    "SampledBatch",
    "ShardInfo",
    "ShardedWriter",
    "UpdateResult",
]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Replay shard, one folder a floor: core/ (the sum tree, the table and their plain types: numpy only),
durability/ (snapshots, checkpoints, the write-ahead log, resharding: on the table's public interface), server/ (the
servicer and its edge, the shard's settings and main) and client/ (the SDK's ReplayClient and ShardedWriter);
wire.py, here, encodes the types both sides share. Which floor may import which is written once, by folder, in
tests/unit/test_import_rules.py (REPLAY_FLOORS).

The shard needs no torch; install apexrl without the `train` extra for a small replay image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.replay_server.client.replay_client import ReplayClient
    from apexrl.replay_server.client.sharded_writer import ShardedWriter
    from apexrl.replay_server.core.sum_tree import SumTree
    from apexrl.replay_server.core.table import ReplayTable, TableConfig
    from apexrl.replay_server.core.types import SampledBatch, ShardInfo, UpdateResult

# Public name -> the module that defines it; loaded on first use.
_EXPORTS = {
    "ReplayClient": "apexrl.replay_server.client.replay_client",
    "ShardedWriter": "apexrl.replay_server.client.sharded_writer",
    "SumTree": "apexrl.replay_server.core.sum_tree",
    "ReplayTable": "apexrl.replay_server.core.table",
    "TableConfig": "apexrl.replay_server.core.table",
    "SampledBatch": "apexrl.replay_server.core.types",
    "ShardInfo": "apexrl.replay_server.core.types",
    "UpdateResult": "apexrl.replay_server.core.types",
}
__all__ = [
    "ReplayClient",
    "ReplayTable",
    "SampledBatch",
    "ShardInfo",
    "ShardedWriter",
    "SumTree",
    "TableConfig",
    "UpdateResult",
]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

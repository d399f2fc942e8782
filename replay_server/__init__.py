"""Replay shard: a prioritized FIFO table (sum_tree.py, table.py; its results as plain types in types.py) served
over gRPC (service.py, main.py), and its client (client.py); wire.py encodes the types both sides share. Durability
(snapshots, checkpoints, the write-ahead log, resharding) lives in the durability/ subpackage.

The shard needs no torch; install apexrl without the `train` extra for a small replay image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.replay_server.client import ReplayClient
    from apexrl.replay_server.sum_tree import SumTree
    from apexrl.replay_server.table import ReplayTable, TableConfig
    from apexrl.replay_server.types import SampledBatch, ShardInfo, UpdateResult

# Public name -> the module that defines it; loaded on first use.
_EXPORTS = {
    "ReplayClient": "apexrl.replay_server.client",
    "SumTree": "apexrl.replay_server.sum_tree",
    "ReplayTable": "apexrl.replay_server.table",
    "TableConfig": "apexrl.replay_server.table",
    "SampledBatch": "apexrl.replay_server.types",
    "ShardInfo": "apexrl.replay_server.types",
    "UpdateResult": "apexrl.replay_server.types",
}
__all__ = [
    "ReplayClient",
    "ReplayTable",
    "SampledBatch",
    "ShardInfo",
    "SumTree",
    "TableConfig",
    "UpdateResult",
]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Replay shard: a prioritized FIFO table (sum_tree.py, table.py) served over gRPC (service.py, main.py), and its
client (client.py); wire.py holds the message types both sides share. Durability: snapshot.py (a consistent copy
taken while the table serves), checkpoint.py (the file format), checkpointer.py (the checkpoint directory),
wal.py (the write-ahead log), reshard.py (`apexrl replay-reshard`: M checkpoints onto N shards).

The shard needs no torch; install apexrl without the `train` extra for a small replay image.
"""

from apexrl.replay_server.client import ReplayClient
from apexrl.replay_server.sum_tree import SumTree
from apexrl.replay_server.table import ReplayTable, TableConfig
from apexrl.replay_server.wire import SampledBatch, ShardInfo, UpdateResult

__all__ = [
    "ReplayClient",
    "ReplayTable",
    "SampledBatch",
    "ShardInfo",
    "SumTree",
    "TableConfig",
    "UpdateResult",
]

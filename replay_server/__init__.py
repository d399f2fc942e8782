"""Replay shard: a prioritized FIFO table (sum_tree.py, table.py) served over gRPC (service.py, main.py), and its
client (client.py); wire.py holds the message types both sides share.

The shard needs no torch; install apexrl without the `train` extra for a small replay image.
"""

from apexrl.replay_server.client import ReplayClient
from apexrl.replay_server.sum_tree import SumTree
from apexrl.replay_server.table import ReplayTable, TableConfig
from apexrl.replay_server.wire import SampledBatch, ShardInfo, UpdateResult

__all__ = ["ReplayClient", "ReplayTable", "SampledBatch", "ShardInfo", "SumTree", "TableConfig", "UpdateResult"]

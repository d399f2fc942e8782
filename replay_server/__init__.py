"""Replay shard: a prioritized FIFO table (sum_tree.py, table.py) served over gRPC (service.py, main.py).

The shard needs no torch; install apexrl without the `train` extra for a small replay image.
"""

from apexrl.replay_server.sum_tree import SumTree
from apexrl.replay_server.table import ReplayTable, TableConfig

__all__ = ["ReplayTable", "SumTree", "TableConfig"]

"""The replay shard's client floor, the SDK's half of the shard: `ReplayClient` (one shard: its Insert stream and
batches, priority stream, unary calls) and `ShardedWriter` (many shards). It builds on the core's plain types and
wire.py, and never imports the server or durability floors (tests/unit/test_import_rules.py, REPLAY_FLOORS).

`from apexrl.replay_server.client import ReplayClient` still works, as before the client had a folder; the names
load their modules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.replay_server.client.replay_client import ReplayClient
    from apexrl.replay_server.client.sharded_writer import ShardedWriter

_EXPORTS = {
    "ReplayClient": "apexrl.replay_server.client.replay_client",
    "ShardedWriter": "apexrl.replay_server.client.sharded_writer",
}
__all__ = ["ReplayClient", "ShardedWriter"]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

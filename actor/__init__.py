"""The built-in Ape-X actor (`apexrl.actor.apex_actor`, started with `apexrl actor`).

For custom actors this package re-exports the SDK clients (no torch import); their home is beside their
services: `apexrl.replay_server.client.ReplayClient` and `apexrl.parameter_server.client.ParameterClient`.
"""

from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client import ReplayClient
from apexrl.replay_server.wire import SampledBatch, ShardInfo, UpdateResult

__all__ = ["ParameterClient", "ReplayClient", "SampledBatch", "ShardInfo", "UpdateResult"]

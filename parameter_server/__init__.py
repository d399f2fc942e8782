"""The parameter service: versioned model weights as named raw tensors, published by the learner and fetched by
actors in chunks. Hosted inside the learner process by default (`create_parameter_server(store=...)`), or run
standalone with `apexrl params`. Its client is `apexrl.parameter_server.client.ParameterClient`.
"""

from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.limits import PublishLimits
from apexrl.parameter_server.service import ParameterServicer, create_parameter_server
from apexrl.parameter_server.store import Snapshot, TensorEntry, VersionRefusedError, WeightStore
from apexrl.parameter_server.wire import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES, SERVICE_NAME

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "ParameterClient",
    "ParameterServicer",
    "PublishLimits",
    "Snapshot",
    "TensorEntry",
    "VersionRefusedError",
    "WeightStore",
    "create_parameter_server",
]

"""The parameter service: versioned model weights as named raw tensors, published by the learner and fetched by
actors in chunks. Hosted inside the learner process by default (`create_parameter_server(store=...)`), or run
standalone with `apexrl params`. The client is `apexrl.actor.parameter_client.ParameterClient`.
"""

from apexrl.parameter_server.service import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    ParameterServicer,
    create_parameter_server,
)
from apexrl.parameter_server.store import Snapshot, TensorEntry, WeightStore

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "ParameterServicer",
    "Snapshot",
    "TensorEntry",
    "WeightStore",
    "create_parameter_server",
]

"""The parameter service: versioned model weights as named raw tensors, published by the learner and fetched by
actors in chunks. Hosted inside the learner process by default (`create_parameter_server(store=...)`), or run
standalone with `apexrl params`. Its client is `apexrl.parameter_server.client.ParameterClient`; the weights
format and the version rules, without protobuf or gRPC, are `apexrl.parameter_server.weights`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.parameter_server.client import ParameterClient
    from apexrl.parameter_server.limits import PublishLimits
    from apexrl.parameter_server.service import ParameterServicer, create_parameter_server
    from apexrl.parameter_server.store import Snapshot, WeightStore
    from apexrl.parameter_server.weights import (
        MAX_VERSION,
        MAX_VERSION_STEP,
        TensorEntry,
        VersionRefusedError,
    )
    from apexrl.parameter_server.wire import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MESSAGE_BYTES, SERVICE_NAME

# Public name -> the module that defines it; loaded on first use.
_EXPORTS = {
    "ParameterClient": "apexrl.parameter_server.client",
    "PublishLimits": "apexrl.parameter_server.limits",
    "ParameterServicer": "apexrl.parameter_server.service",
    "create_parameter_server": "apexrl.parameter_server.service",
    "Snapshot": "apexrl.parameter_server.store",
    "WeightStore": "apexrl.parameter_server.store",
    "MAX_VERSION": "apexrl.parameter_server.weights",
    "MAX_VERSION_STEP": "apexrl.parameter_server.weights",
    "TensorEntry": "apexrl.parameter_server.weights",
    "VersionRefusedError": "apexrl.parameter_server.weights",
    "DEFAULT_CHUNK_BYTES": "apexrl.parameter_server.wire",
    "DEFAULT_MAX_MESSAGE_BYTES": "apexrl.parameter_server.wire",
    "SERVICE_NAME": "apexrl.parameter_server.wire",
}
__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_VERSION",
    "MAX_VERSION_STEP",
    "ParameterClient",
    "ParameterServicer",
    "PublishLimits",
    "SERVICE_NAME",
    "Snapshot",
    "TensorEntry",
    "VersionRefusedError",
    "WeightStore",
    "create_parameter_server",
]  # the keys of _EXPORTS
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

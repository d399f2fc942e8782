"""apexrl's public Python API: the names a user imports from `apexrl` itself.

    import apexrl
    policy = apexrl.load_policy("runs/CartPole-v1-20250101-120000")
    action = policy.act(obs)

Each name is imported on first use, so `import apexrl` loads neither torch nor gymnasium (the SDK's clients live
beside their services: `apexrl.replay_server.client`, `apexrl.parameter_server.client`, re-exported by
`apexrl.actor` and `apexrl.learner`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apexrl.learner.policy import TrainedPolicy, load_policy

# Public name -> the module that defines it.
_EXPORTS = {
    "load_policy": "apexrl.learner.policy",
    "TrainedPolicy": "apexrl.learner.policy",
}
__all__ = ["TrainedPolicy", "load_policy"]  # the keys of _EXPORTS


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'apexrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

"""apexrl's public Python API: the names a user imports from `apexrl` itself.

    import apexrl
    policy = apexrl.load_policy("runs/CartPole-v1-20250101-120000")
    action = policy.act(obs)

    with apexrl.launch(apexrl.local_fleet(num_actors=2, max_seconds=300)) as run:   # a local fleet, from code
        result = run.wait()

Each name is imported on first use, so `import apexrl` loads neither torch nor gymnasium (the SDK's clients live
beside their services: `apexrl.replay_server.client.replay_client`, `apexrl.parameter_server.client`, re-exported by
`apexrl.actor` and `apexrl.learner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apexrl.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from apexrl.launcher.api import FleetRun, launch, resume
    from apexrl.launcher.fleet_config import ConfigError, FleetConfig
    from apexrl.launcher.progress import ProgressRow
    from apexrl.launcher.run import RunResult
    from apexrl.launcher.topology import local_fleet
    from apexrl.learner.policy import TrainedPolicy, load_policy

# Public name -> the module that defines it.
_EXPORTS = {
    "load_policy": "apexrl.learner.policy",
    "TrainedPolicy": "apexrl.learner.policy",
    "launch": "apexrl.launcher.api",
    "resume": "apexrl.launcher.api",
    "FleetRun": "apexrl.launcher.api",
    "local_fleet": "apexrl.launcher.topology",
    "FleetConfig": "apexrl.launcher.fleet_config",
    "ConfigError": "apexrl.launcher.fleet_config",
    "ProgressRow": "apexrl.launcher.progress",
    "RunResult": "apexrl.launcher.run",
}
__all__ = [  # the keys of _EXPORTS
    "ConfigError",
    "FleetConfig",
    "FleetRun",
    "ProgressRow",
    "RunResult",
    "TrainedPolicy",
    "launch",
    "load_policy",
    "local_fleet",
    "resume",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

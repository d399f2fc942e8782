"""`apexrl learner`: train from the replay shards and host the parameter service, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from apexrl.common.settings import SettingsError
from apexrl.learner.config import LearnerConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from apexrl.common.spaces import EnvSpaces
    from apexrl.learner.learner import Learner

log = logging.getLogger("apexrl.learner")

CONFIG = LearnerConfig
HELP = "run the learner (Ape-X DQN or DPG), hosting the parameter service"


def run(config: LearnerConfig, stop: threading.Event) -> int:
    import torch
    from prometheus_client import CollectorRegistry

    from apexrl.learner.learner import Learner, make_sampler

    torch.set_num_threads(config.torch_threads)
    spaces = checked_spaces(config)
    registry = CollectorRegistry()
    weights = WeightsService(config)
    # The learner (and its checkpoint) first: the hosted service reports SERVING only for a learner that can run.
    learner = Learner(
        config,
        spaces,
        make_sampler(config),
        weights.publish,
        registry,
        _curves(config),
        service_version=weights.version,
    )
    weights.continue_above(learner)
    where, metrics = weights.serve(config, registry)
    log.info(
        "learner for %s (observations %s %s, %s): %s; batch %d; shards %s; parameter service %s; metrics %s",
        config.env,
        "x".join(map(str, spaces.obs_shape)),
        spaces.obs_dtype,
        _actions(spaces),
        learner.learning.describe(),
        config.batch_size,
        ",".join(config.replay),
        where,
        metrics,
    )
    try:
        learner.run(stop)
    finally:
        learner.close()
        weights.close()
        log.info(
            "learner stopped after %d updates (weights version %d)", learner.updates, learner.weight_version
        )
    return 0


def checked_spaces(config: LearnerConfig) -> EnvSpaces:
    """The environment's spaces, with the algorithm and network checked against them (SettingsError naming the
    flag, before anything starts)."""
    from apexrl.algorithms.registry import for_spaces
    from apexrl.algorithms.torso_specs import resolve_network
    from apexrl.common.env_settings import EnvChoice
    from apexrl.common.environments import env_spaces

    try:
        spaces = env_spaces(EnvChoice.of(config))
    except ValueError as err:
        raise SettingsError(f"--env: {err}") from None
    try:
        for_spaces(config.algorithm, spaces, config.env)
    except ValueError as err:
        raise SettingsError(f"--algorithm: {err}") from None
    try:
        resolve_network(config.network, spaces)
    except ValueError as err:
        raise SettingsError(f"--network: {err}") from None
    return spaces


def _curves(config: LearnerConfig):
    from apexrl.common.tensorboard_curves import TensorBoardCurves

    if not config.run_dir:
        return None
    return TensorBoardCurves(Path(config.run_dir) / "tensorboard" / "learner", "learner/", logger=log)


def _actions(spaces: EnvSpaces) -> str:
    if spaces.num_actions:
        return f"{spaces.num_actions} actions"
    low, high = (", ".join(f"{v:g}" for v in bound) for bound in (spaces.action_low, spaces.action_high))
    return f"actions in [{low}]..[{high}]"


class WeightsService:
    """Where the learner publishes: the parameter service it hosts (a WeightStore served through the serving
    skeleton, common/serving.py) or a standalone one it reaches as a client (--params)."""

    def __init__(self, config: LearnerConfig) -> None:
        self.serving = None
        self.client = self.store = None
        if config.params:
            from apexrl.common.tls import tls_of
            from apexrl.parameter_server.client import ParameterClient

            self.client = ParameterClient(config.params, token=config.token, tls=tls_of(config))
            self.publish, self.version = self.client.publish, self.client.version
        else:
            from apexrl.parameter_server.store import WeightStore

            store = self.store = WeightStore()
            self.publish, self.version = store.publish, lambda: store.version

    def continue_above(self, learner: Learner) -> None:
        """A standalone service outlives this process and may hold versions newer than the checkpoint (published
        after it was written): continue above them, since versions may only grow."""
        if self.client is not None:
            learner.weight_version = max(learner.weight_version, self.client.version())

    def serve(self, config: LearnerConfig, registry: CollectorRegistry) -> tuple[str, str]:
        """Serve the hosted service (its port file written) and the metrics; (where weights go, metrics URL)."""
        from apexrl.common.metrics import serve_metrics

        if self.store is None:
            return config.params, serve_metrics(registry, config.metrics_port, config.host)
        from apexrl.common.access import Role
        from apexrl.common.call_limits import CallLimitSettings
        from apexrl.common.serving import Serving
        from apexrl.parameter_server.service import create_parameter_server

        service = create_parameter_server(
            config.address(),
            store=self.store,
            registry=registry,
            tls=config.tls(),
            # The learner publishes in-process: no caller needs its identity here, so its token (or certificate)
            # is no use against this service over the network.
            access=config.access().without(Role.LEARNER),
            # No heap trimming nor arena limit in the learner's process (common/memory.py): torch's threads
            # allocate here, and the hosted service's requests are held to 2 MiB from their length prefix anyway.
            call_limits=CallLimitSettings(trim_memory_seconds=0.0),
            health_address=config.health_address(),
        )
        self.serving = Serving(service.server, service.port, config, registry, log)
        metrics = self.serving.serve_metrics()
        self.serving.write_port_file()
        return f"{config.address(service.port)} (hosted, {self.serving.describe()})", metrics

    def close(self) -> None:
        if self.serving is not None:
            self.serving.close(grace=2.0)
        if self.client is not None:
            self.client.close()

"""`apexrl learner`: train from the replay shards and host the parameter service, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from apexrl.common.access import AccessPolicy, describe_access
from apexrl.common.addresses import join_host_port
from apexrl.common.settings import SettingsError
from apexrl.learner.config import LearnerConfig

log = logging.getLogger("apexrl.learner")

CONFIG = LearnerConfig
HELP = "run the learner (Ape-X DQN or DPG), hosting the parameter service"


def run(config: LearnerConfig, stop: threading.Event) -> int:
    import torch
    from prometheus_client import CollectorRegistry

    from apexrl.algorithms.registry import for_spaces
    from apexrl.algorithms.torso_specs import resolve_network
    from apexrl.common.env_settings import EnvChoice
    from apexrl.common.environments import env_spaces
    from apexrl.common.files import atomic_write
    from apexrl.common.metrics import serve_metrics
    from apexrl.common.tensorboard_curves import TensorBoardCurves
    from apexrl.common.tls import describe, tls_of
    from apexrl.learner.learner import Learner, make_sampler

    torch.set_num_threads(config.torch_threads)
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
    registry = CollectorRegistry()
    tls = tls_of(config)
    server = client = None
    if config.params:
        from apexrl.parameter_server.client import ParameterClient

        client = ParameterClient(config.params, token=config.token, tls=tls)
        publish, service_version, store = client.publish, client.version, None
        where = config.params
    else:
        from apexrl.parameter_server.store import WeightStore

        store = WeightStore()
        publish, service_version = store.publish, lambda: store.version
    # The learner (and its checkpoint) first: the hosted service reports SERVING only for a learner that can run.
    curves = (
        TensorBoardCurves(Path(config.run_dir) / "tensorboard" / "learner", "learner/", logger=log)
        if config.run_dir
        else None
    )
    learner = Learner(
        config, spaces, make_sampler(config), publish, registry, curves, service_version=service_version
    )
    if client is not None:
        # A standalone service outlives this process and may hold versions newer than the checkpoint (published
        # after it was written): continue above them, since versions may only grow.
        learner.weight_version = max(learner.weight_version, client.version())
    if store is not None:
        from apexrl.parameter_server.service import create_parameter_server

        service = create_parameter_server(
            join_host_port(config.host, config.port),
            store=store,
            registry=registry,
            tls=tls,
            access=AccessPolicy.from_settings(config.token, config.role_tokens, config.certificate_roles),
            health_address=None
            if config.health_port is None
            else join_host_port(config.host, config.health_port),
        )
        server, port = service.server, service.port
        where = f"{config.host}:{port} (hosted, {describe(tls)}, {describe_access(config)}" + (
            ")" if config.health_port is None else f", plaintext health on port {config.health_port})"
        )
        if config.port_file:
            atomic_write(config.port_file, f"{port}\n")
    metrics = serve_metrics(registry, config.metrics_port, config.host)
    actions = (
        f"{spaces.num_actions} actions"
        if spaces.num_actions
        else f"actions in [{', '.join(f'{lo:g}' for lo in spaces.action_low)}]..[{', '.join(f'{hi:g}' for hi in spaces.action_high)}]"
    )
    log.info(
        "learner for %s (observations %s %s, %s): %s; batch %d; shards %s; parameter service %s; metrics %s",
        config.env,
        "x".join(map(str, spaces.obs_shape)),
        spaces.obs_dtype,
        actions,
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
        if server is not None:
            server.enter_graceful_shutdown()
            server.stop(2).wait()
        if client is not None:
            client.close()
        log.info(
            "learner stopped after %d updates (weights version %d)", learner.updates, learner.weight_version
        )
    return 0

"""`apexrl actor`: run one Ape-X actor (or, with --evaluate, the greedy evaluator) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import threading

from apexrl.actor.config import ActorConfig

log = logging.getLogger("apexrl.actor")

CONFIG = ActorConfig
HELP = "run one Ape-X actor (or an evaluator) that feeds the replay shards"


def run(config: ActorConfig, stop: threading.Event) -> int:
    from prometheus_client import CollectorRegistry

    from apexrl.actor.apex_actor import ApeXActor
    from apexrl.common.episodes import EpisodeLog
    from apexrl.common.metrics import serve_metrics

    registry = CollectorRegistry()
    actor = ApeXActor(config, registry, EpisodeLog(config.episodes_csv) if config.episodes_csv else None)
    metrics = serve_metrics(registry, config.serving_metrics_port, config.host)
    role = "evaluator" if config.evaluate else "actor"
    log.info(
        "%s %d/%d on %s (%s): %s, %d env(s), shards %s, params %s; metrics %s",
        role,
        config.actor_index,
        config.num_actors,
        config.env,
        actor.algorithm.name,
        actor.explorer.describe(),
        config.num_envs,
        ",".join(config.replay),
        config.params,
        metrics,
    )
    try:
        actor.run(stop)
    finally:
        actor.close()
        log.info(
            "%s %d stopped after %d env steps, %d episodes (weights version %d)",
            role,
            config.actor_index,
            actor.env_steps,
            actor.episodes,
            actor.weight_version,
        )
    return 0

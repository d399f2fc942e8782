"""`apexrl actor`: run one Ape-X actor (or, with --evaluate, an evaluator) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from apexrl.common.grpc_util import parse_addresses

log = logging.getLogger("apexrl.actor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replay", type=parse_addresses, default=(),
                        help="comma-separated host:port of the replay shards (required unless --evaluate)")
    parser.add_argument("--params", required=True, help="host:port of the parameter service to pull weights from")
    parser.add_argument("--actor-index", type=int, default=0, help="this actor's index i in the fleet (default: 0)")
    parser.add_argument("--num-actors", type=int, default=1,
                        help="actors in the fleet N; with i it sets epsilon = 0.4 ** (1 + 7 i / (N - 1)) (default: 1)")
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium environment id (default: %(default)s)")
    parser.add_argument("--num-envs", type=int, default=1,
                        help="environments stepped together by this actor (default: %(default)s)")
    parser.add_argument("--epsilon", type=float, default=None,
                        help="fixed exploration rate instead of the Ape-X schedule (evaluators default to 0)")
    parser.add_argument("--evaluate", action="store_true",
                        help="evaluator: play with the newest weights (pulled before every episode), insert nothing")
    parser.add_argument("--n-step", type=int, default=3, help="n of the n-step returns (default: %(default)s)")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount factor (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="transitions per replay insert (default: %(default)s)")
    parser.add_argument("--pull-every", type=int, default=100,
                        help="environment steps between checks for newer weights (default: %(default)s)")
    parser.add_argument("--max-steps-per-second", type=float, default=None,
                        help="pace the actor to at most this many environment steps per second (default: "
                             "unlimited; evaluators: 1000)")
    parser.add_argument("--max-env-steps", type=int, default=None, help="stop after this many environment steps")
    parser.add_argument("--max-episodes", type=int, default=None, help="stop after this many episodes")
    parser.add_argument("--episodes-csv", default=None,
                        help="append one CSV line per finished episode to this file")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="interface of the metrics endpoint")
    parser.add_argument("--metrics-port", type=int, default=9300,
                        help="Prometheus endpoint http://HOST:PORT/metrics; -1 disables it (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="seed of environments and exploration")
    parser.add_argument("--token", default=None, help="bearer token for the shards and the parameter service")


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from apexrl.actor.apex_actor import ActorConfig, ApeXActor
    from apexrl.actor.episode_log import EpisodeLog
    from apexrl.common.metrics import serve_metrics

    try:
        config = ActorConfig(
            replay_addresses=args.replay, params_address=args.params, actor_index=args.actor_index,
            num_actors=args.num_actors, env_id=args.env, num_envs=args.num_envs, epsilon=args.epsilon,
            evaluate=args.evaluate, n_step=args.n_step, gamma=args.gamma, batch_size=args.batch_size,
            pull_every=args.pull_every, max_env_steps=args.max_env_steps,
            max_steps_per_second=args.max_steps_per_second or (1000.0 if args.evaluate else None), max_episodes=args.max_episodes,
            seed=args.seed, token=args.token,
        )
    except ValueError as err:
        log.error("bad configuration: %s", err)
        return 2
    registry = CollectorRegistry()
    actor = ApeXActor(config, registry, EpisodeLog(args.episodes_csv) if args.episodes_csv else None)
    metrics = "off"
    if args.metrics_port >= 0:
        metrics = f"http://{args.metrics_host}:{serve_metrics(registry, args.metrics_port, args.metrics_host)}/metrics"
    role = "evaluator" if config.evaluate else "actor"
    log.info("%s %d/%d on %s: epsilon %.4f, %d env(s), shards %s, params %s; metrics %s", role, config.actor_index,
             config.num_actors, config.env_id, actor.epsilon, config.num_envs, ",".join(config.replay_addresses),
             config.params_address, metrics)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        actor.run(stop)
    except TimeoutError as err:
        log.error("%s", err)
        return 1
    finally:
        actor.close()
        log.info("%s %d stopped after %d env steps, %d episodes (weights version %d)", role, config.actor_index,
                 actor.env_steps, actor.episodes, actor.weight_version)
    return 0

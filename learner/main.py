"""`apexrl learner`: train from the replay shards and host the parameter service, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from apexrl.common.grpc_util import parse_addresses

log = logging.getLogger("apexrl.learner")


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replay", type=parse_addresses, required=True,
                        help="comma-separated host:port of every replay shard")
    parser.add_argument("--env", default="CartPole-v1",
                        help="Gymnasium environment id; sets the network's input and output sizes (default: %(default)s)")
    parser.add_argument("--params-host", default="0.0.0.0",
                        help="interface of the parameter service hosted in this process (default: %(default)s)")
    parser.add_argument("--params-port", type=int, default=7100,
                        help="port of the hosted parameter service; 0 picks one (default: %(default)s)")
    parser.add_argument("--params", default=None,
                        help="publish to a standalone parameter service at host:port instead of hosting one")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="interface of the metrics endpoint")
    parser.add_argument("--metrics-port", type=int, default=9200,
                        help="Prometheus endpoint http://HOST:PORT/metrics; -1 disables it (default: %(default)s)")
    parser.add_argument("--run-dir", default=None,
                        help="directory for checkpoints (RUN_DIR/checkpoints/checkpoint.pt); resumes from it if present")
    parser.add_argument("--hidden", type=_sizes, default=(128, 128), help="hidden layer sizes (default: 128,128)")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per update (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: %(default)s)")
    parser.add_argument("--target-update-period", type=int, default=250,
                        help="updates between target network copies (default: %(default)s)")
    parser.add_argument("--publish-every", type=int, default=10,
                        help="updates between published weight versions (default: %(default)s)")
    parser.add_argument("--beta", type=float, default=0.4, help="initial importance-sampling exponent (default: %(default)s)")
    parser.add_argument("--beta-anneal-updates", type=int, default=20_000,
                        help="updates over which beta rises linearly to 1 (default: %(default)s)")
    parser.add_argument("--min-replay-size", type=int, default=1_000,
                        help="rows the shards must hold in total before training starts (default: %(default)s)")
    parser.add_argument("--max-grad-norm", type=float, default=10.0, help="gradient clipping norm (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=2_000,
                        help="updates between checkpoints; one more is written at exit (default: %(default)s)")
    parser.add_argument("--max-updates", type=int, default=None, help="stop after this many updates")
    parser.add_argument("--device", default="auto", help="torch device: auto (CUDA when available), cpu, cuda:0, ...")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="CPU threads for torch (the fleet shares the machine's cores) (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="seed of network initialisation and sampling")
    parser.add_argument("--token", default=None, help="bearer token for shards and the parameter service")
    parser.add_argument("--port-file", default=None, help="write the parameter service's port here once serving")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch
    from prometheus_client import CollectorRegistry

    from apexrl.actor.apex_actor import env_spaces
    from apexrl.common.grpc_util import write_port_file
    from apexrl.common.metrics import serve_metrics
    from apexrl.learner.learner import Learner, LearnerConfig

    torch.set_num_threads(args.torch_threads)
    obs_dim, num_actions = env_spaces(args.env)
    try:
        config = LearnerConfig(
            replay_addresses=args.replay, obs_dim=obs_dim, num_actions=num_actions, env_id=args.env,
            hidden_sizes=args.hidden, batch_size=args.batch_size, learning_rate=args.lr,
            max_grad_norm=args.max_grad_norm, target_update_period=args.target_update_period,
            beta_start=args.beta, beta_anneal_updates=args.beta_anneal_updates,
            min_replay_size=args.min_replay_size, publish_every=args.publish_every,
            checkpoint_dir=str(Path(args.run_dir) / "checkpoints") if args.run_dir else None,
            checkpoint_every=args.checkpoint_every, max_updates=args.max_updates, device=args.device,
            seed=args.seed, token=args.token,
        )
    except ValueError as err:
        log.error("bad configuration: %s", err)
        return 2
    registry = CollectorRegistry()
    server = health = client = None
    if args.params:
        from apexrl.parameter_server.client import ParameterClient

        client = ParameterClient(args.params, token=args.token)

        def publish(weights, version):
            return client.publish(weights, version)
        where = args.params
    else:
        from apexrl.parameter_server.service import create_parameter_server

        server, port, store, health = create_parameter_server(
            f"{args.params_host}:{args.params_port}", registry=registry, token=args.token)
        publish = store.publish
        where = f"{args.params_host}:{port} (hosted)"
        if args.port_file:
            write_port_file(args.port_file, port)
    learner = Learner(config, publish, registry)
    metrics = "off"
    if args.metrics_port >= 0:
        metrics = f"http://{args.metrics_host}:{serve_metrics(registry, args.metrics_port, args.metrics_host)}/metrics"
    log.info("learner for %s (%d -> %s -> %d), batch %d, lr %g; shards %s; parameter service %s; metrics %s",
             config.env_id, obs_dim, config.hidden_sizes, num_actions, config.batch_size, config.learning_rate,
             ",".join(config.replay_addresses), where, metrics)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        learner.run(stop)
    finally:
        learner.close()
        if health is not None:
            health.enter_graceful_shutdown()
        if server is not None:
            server.stop(2).wait()
        if client is not None:
            client.close()
        log.info("learner stopped after %d updates (weights version %d)", learner.updates, learner.weight_version)
    return 0

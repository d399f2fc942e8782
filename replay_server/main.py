"""`apexrl replay`: run one replay shard until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging

from apexrl.common import grpc_util
from apexrl.common.grpc_util import write_port_file
from apexrl.common.metrics import serve_metrics
from apexrl.common.signature import Signature

log = logging.getLogger("apexrl.replay")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=7000,
                        help="gRPC port of the ReplayService; 0 picks a free port (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=9100,
                        help="port of the Prometheus endpoint http://HOST:PORT/metrics; -1 disables it "
                             "(default: %(default)s)")
    parser.add_argument("--capacity", type=int, default=1_000_000,
                        help="rows the shard keeps; the oldest is evicted first (default: %(default)s)")
    parser.add_argument("--alpha", type=float, default=0.6,
                        help="priority exponent: rows are sampled with probability p**alpha / sum (default: %(default)s)")
    parser.add_argument("--signature", type=Signature.parse, default=None,
                        help="fields of every row, e.g. 'obs:float32[4],action:int64[],reward:float32[]'; "
                             "by default the first insert fixes it")
    parser.add_argument("--min-size-to-sample", type=int, default=1,
                        help="rows the shard must hold before Sample answers (default: %(default)s)")
    parser.add_argument("--samples-per-insert", type=float, default=0.0,
                        help="target ratio of sampled to inserted rows; 0 turns the ratio limiter off "
                             "(default: %(default)s)")
    parser.add_argument("--samples-per-insert-tolerance", type=float, default=10_000.0,
                        help="sampled rows the ratio may run ahead or behind before a side blocks "
                             "(default: %(default)s)")
    parser.add_argument("--max-sample-batch-size", type=int, default=4096,
                        help="largest batch one Sample may ask for (default: %(default)s)")
    parser.add_argument("--max-message-mb", type=float, default=64.0,
                        help="largest gRPC message received or sent, in MiB; larger ones are refused with "
                             "RESOURCE_EXHAUSTED (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=16,
                        help="gRPC handler threads (blocked samplers each hold one) (default: %(default)s)")
    parser.add_argument("--token", default=None,
                        help="require 'authorization: Bearer TOKEN' on every call except health checks")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: from the OS)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound gRPC port to this file once serving (useful with --port 0)")


def run(args: argparse.Namespace) -> int:
    from apexrl.replay_server.service import create_replay_server
    from apexrl.replay_server.table import ReplayTable, TableConfig

    try:
        config = TableConfig(
            capacity=args.capacity,
            alpha=args.alpha,
            signature=args.signature,
            min_size_to_sample=args.min_size_to_sample,
            samples_per_insert=args.samples_per_insert,
            samples_per_insert_tolerance=args.samples_per_insert_tolerance,
            max_sample_batch_size=args.max_sample_batch_size,
            seed=args.seed,
        )
    except ValueError as err:
        log.error("bad configuration: %s", err)
        return 2
    table = ReplayTable(config)
    server, port, health, registry = create_replay_server(
        table,
        f"{args.host}:{args.port}",
        max_message_bytes=int(args.max_message_mb * 1024 * 1024),
        max_workers=args.workers,
        token=args.token,
    )
    metrics = f"http://{args.host}:{serve_metrics(registry, args.metrics_port, args.host)}/metrics" \
        if args.metrics_port >= 0 else "off"
    log.info("replay shard serving on %s:%d (capacity %d, alpha %.2f, signature %s); metrics %s",
             args.host, port, config.capacity, config.alpha, config.signature or "from first insert", metrics)
    if args.port_file:
        write_port_file(args.port_file, port)
    grpc_util.serve_until_signal(server, health, before_stop=table.close)
    info = table.info()
    log.info("replay shard stopped: %d rows held, %d inserted, %d sampled", info.size, info.inserted_total,
             info.sampled_total)
    return 0

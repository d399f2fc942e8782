"""`apexrl params`: run a standalone parameter service until SIGTERM or Ctrl-C.

The learner hosts the same service in its own process by default; run it standalone when several learners or
external tools publish weights, or to test actors without a learner.

    python -m apexrl.parameter_server.main --port 0 --metrics-port -1   # free port, logged at start
"""

from __future__ import annotations

import argparse
import logging
import sys

from prometheus_client import CollectorRegistry

from apexrl.common import grpc_util
from apexrl.common.metrics import serve_metrics
from apexrl.parameter_server.service import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    create_parameter_server,
)

log = logging.getLogger("apexrl.params")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0",
                        help="interface to listen on; 127.0.0.1 keeps the service local (default: %(default)s)")
    parser.add_argument("--port", type=int, default=7100,
                        help="gRPC port of the ParameterService; 0 picks a free port, logged at start "
                             "(default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=9200,
                        help="port of the Prometheus endpoint http://HOST:PORT/metrics; 0 picks a free port, "
                             "-1 disables it (default: %(default)s)")
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                        help="largest piece of weight bytes in one Fetch message; models of any size are sent "
                             "as several messages, so keep it under the clients' message limit "
                             "(default: %(default)s = 1 MiB)")
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                        help="largest gRPC message received or sent; larger ones are refused with "
                             "RESOURCE_EXHAUSTED. Chunking makes gRPC's default enough for any model "
                             "(default: %(default)s = 4 MiB)")
    parser.add_argument("--token", default=None,
                        help="require 'authorization: Bearer TOKEN' on every call except health checks "
                             "(default: no authentication)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound gRPC port to this file once serving (useful with --port 0)")


def run(args: argparse.Namespace) -> int:
    registry = CollectorRegistry()
    address = f"{args.host}:{args.port}"
    try:
        server, port, store, health = create_parameter_server(
            address,
            registry=registry,
            chunk_bytes=args.chunk_bytes,
            max_message_bytes=args.max_message_bytes,
            token=args.token,
        )
    except ValueError as err:
        log.error("bad configuration: %s", err)
        return 2
    except (OSError, RuntimeError) as err:  # grpc raises RuntimeError for some bind failures
        log.error("cannot serve on %s: %s", address, err)
        return 1
    try:
        metrics = (f"http://{args.host}:{serve_metrics(registry, args.metrics_port, args.host)}/metrics"
                   if args.metrics_port >= 0 else "off")
    except OSError as err:
        server.stop(None)
        log.error("cannot serve metrics on %s:%d: %s", args.host, args.metrics_port, err)
        return 1
    log.info("parameter service serving on %s:%d (chunks of %d bytes, messages up to %d bytes, token %s); "
             "metrics %s", args.host, port, args.chunk_bytes, args.max_message_bytes,
             "required" if args.token else "off", metrics)
    if args.port_file:
        grpc_util.write_port_file(args.port_file, port)
    grpc_util.serve_until_signal(server, health)
    log.info("parameter service stopped at version %d", store.version)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apexrl params", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

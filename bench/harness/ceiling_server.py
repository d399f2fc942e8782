"""The raw gRPC ceiling server: bytes in, bytes out, no protobuf. By default gRPC's synchronous thread-pool server
(the ceiling every target is measured against); with `--aio` the same handlers on grpc.aio, the runtime a replay
shard serves on, to tell the runtime's share of a gap from apexrl's. Run as its own process by
`harness.ceiling.start_ceiling_server`:

    .venv/bin/python bench/harness/ceiling_server.py --port-file PATH [--aio]

Methods (generic handlers, no (de)serializers) of the service `apexrl.bench.Echo`:
  Count  client stream: counts messages and bytes, answers both (two little-endian uint64).
  Acked  bidi stream: one answer per message, of the size its first 8 bytes ask for.
  Unary  one answer of the size the request's first 8 bytes ask for.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import sys
import threading
from concurrent import futures

import grpc

from apexrl.common import grpc_util
from apexrl.common.files import atomic_write

ECHO_SERVICE = "apexrl.bench.Echo"
# One zero-filled reply per size asked for, built once (one server per process).
_REPLIES: dict[int, bytes] = {}


def sized_reply(request: bytes) -> bytes:
    """The reply of the size the request's first 8 bytes ask for."""
    size = struct.unpack_from("<Q", request)[0]
    reply = _REPLIES.get(size)
    if reply is None:
        reply = _REPLIES[size] = bytes(size)
    return reply


class _PassThrough(grpc.ServerInterceptor):
    """One interceptor call per RPC and nothing else: what apexrl's request decoding cost this server when it lived
    in common/grpc_util.py (it passes handlers without deserializers, all of the ceiling's, through untouched), so
    the ceiling stays comparable with earlier runs."""

    def intercept_service(self, continuation, handler_call_details):
        return continuation(handler_call_details)


def create_threadpool_server(
    *, max_workers: int = 16, max_message_bytes: int = grpc_util.DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.Server:
    """gRPC's synchronous thread-pool server with apexrl's message limits and no access control: the raw ceiling
    every target is measured against (apexrl's own services run on grpc.aio, common/aio_grpc.py)."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=[_PassThrough()],
        options=grpc_util.message_size_options(max_message_bytes) + [("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=None,
    )


def make_handler() -> grpc.GenericRpcHandler:
    def count(request_iterator, context) -> bytes:
        n = nbytes = 0
        for request in request_iterator:
            n += 1
            nbytes += len(request)
        return struct.pack("<QQ", n, nbytes)

    def acked(request_iterator, context):
        for request in request_iterator:
            yield sized_reply(request)

    def unary(request: bytes, context) -> bytes:
        return sized_reply(request)

    return grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "Count": grpc.stream_unary_rpc_method_handler(count),
            "Acked": grpc.stream_stream_rpc_method_handler(acked),
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
        },
    )


def make_aio_handler() -> grpc.GenericRpcHandler:
    """The same methods as coroutines, for a grpc.aio server."""

    async def count(request_iterator, context) -> bytes:
        n = nbytes = 0
        async for request in request_iterator:
            n += 1
            nbytes += len(request)
        return struct.pack("<QQ", n, nbytes)

    async def acked(request_iterator, context):
        async for request in request_iterator:
            yield sized_reply(request)

    async def unary(request: bytes, context) -> bytes:
        return sized_reply(request)

    return grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "Count": grpc.stream_unary_rpc_method_handler(count),
            "Acked": grpc.stream_stream_rpc_method_handler(acked),
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
        },
    )


async def serve_aio(port_file: str) -> None:
    server = grpc.aio.server(options=grpc_util.message_size_options(grpc_util.DEFAULT_MAX_MESSAGE_BYTES))
    server.add_generic_rpc_handlers((make_aio_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    atomic_write(port_file, f"{port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="raw gRPC ceiling server for the benchmarks")
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--aio", action="store_true", help="serve on grpc.aio (a replay shard's runtime)")
    args = parser.parse_args(argv)
    if args.aio:
        asyncio.run(serve_aio(args.port_file))
        return 0
    server = create_threadpool_server()
    server.add_generic_rpc_handlers((make_handler(),))
    port = grpc_util.bind(server, "127.0.0.1:0")
    server.start()
    atomic_write(args.port_file, f"{port}\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

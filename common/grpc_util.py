"""gRPC plumbing shared by every apexrl server and client: server/channel options, health and reflection,
token authentication, and a graceful SIGTERM/Ctrl-C shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from apexrl.common.errors import CancelledError, DeadlineExceededError, from_rpc_error

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HEALTH_SERVICE = "grpc.health.v1.Health"
_AUTH_HEADER = "authorization"


T = TypeVar("T")


class CallFuture(Generic[T]):
    """A gRPC call in flight, as the SDK hands it out: `result()` decodes the answer in the caller's thread and
    raises apexrl exceptions, so code above the clients never sees grpc.RpcError or a protobuf message."""

    def __init__(self, call: grpc.Future, decode: Callable[[Any], T], what: str) -> None:
        self._call = call
        self._decode = decode
        self._what = what

    def result(self, timeout: float | None = None) -> T:
        try:
            reply = self._call.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise DeadlineExceededError(f"{self._what}: no answer within {timeout}s (the call goes on)") from None
        except grpc.FutureCancelledError:
            raise CancelledError(f"{self._what}: cancelled") from None
        except grpc.RpcError as err:
            raise from_rpc_error(err, self._what) from None
        return self._decode(reply)

    def done(self) -> bool:
        return self._call.done()

    def cancel(self) -> bool:
        return self._call.cancel()


def message_size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


UNAUTHENTICATED_MESSAGE = "missing or wrong bearer token"


def token_checked(handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails, expected: str,
                  deny: Callable) -> grpc.RpcMethodHandler | None:
    """`handler`, or one of the same streaming kind that runs `deny` (answers UNAUTHENTICATED) when the call lacks
    `authorization: <expected>`. Health checks always pass (Kubernetes probes cannot send tokens); an unknown
    method (handler None) stays unknown. Shared by the thread-pool and the asyncio interceptors."""
    if handler is None or details.method.startswith(f"/{HEALTH_SERVICE}/"):
        return handler
    if dict(details.invocation_metadata or ()).get(_AUTH_HEADER) == expected:
        return handler
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(deny)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuses every call without `authorization: Bearer <token>` with UNAUTHENTICATED (see token_checked)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

    def intercept_service(self, continuation, handler_call_details):
        return token_checked(continuation(handler_call_details), handler_call_details, self._expected, _deny)


def _deny(request_or_iterator, context) -> None:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


class _TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call."""

    def __init__(self, token: str) -> None:
        self._header = (_AUTH_HEADER, f"Bearer {token}")

    def _with_token(self, details):
        metadata = list(details.metadata or ()) + [self._header]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def make_channel(
    address: str,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
    root_certificates: bytes | None = None,
) -> grpc.Channel:
    """A channel to an apexrl server: plaintext unless root certificates are given, bearer token when set."""
    options = message_size_options(max_message_bytes) + [
        # Keep idle connections alive through NATs and notice dead peers within ~30 s.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # Reconnect to a restarted server within a second: gRPC's own backoff grows to 2 minutes, which would keep
        # a shard that came back out of sampling far longer than the sampler's stated bound.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
    ]
    if root_certificates is not None:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _TokenClientInterceptor(token))
    return channel


def create_server(
    *,
    max_workers: int = 16,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
) -> grpc.Server:
    """A thread-pool gRPC server with apexrl's message limits (and token check when a token is given)."""
    interceptors = [TokenAuthInterceptor(token)] if token else []
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=interceptors,
        options=message_size_options(max_message_bytes) + [("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=None,
    )


def bind(
    server: grpc.Server,
    address: str,
    *,
    tls_cert_chain: bytes | None = None,
    tls_private_key: bytes | None = None,
) -> int:
    """Bind `host:port` (port 0 picks a free one); return the bound port or raise OSError."""
    if tls_cert_chain is not None and tls_private_key is not None:
        creds = grpc.ssl_server_credentials([(tls_private_key, tls_cert_chain)])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address} (address in use or not local?)")
    return port


def add_health_and_reflection(server: grpc.Server, service_names: Iterable[str]) -> health.HealthServicer:
    """Serve grpc.health.v1 (overall and per service SERVING) and server reflection for the given services."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    names = list(service_names)
    for name in ["", *names]:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, HEALTH_SERVICE, reflection.SERVICE_NAME], server)
    return servicer


def wait_for_health(address: str, *, timeout: float, service: str = "", token: str | None = None) -> None:
    """Block until the server at `address` reports SERVING; TimeoutError after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    channel = make_channel(address, token=token)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as err:
                last = f"{err.code().name}"
            time.sleep(0.1)
        raise TimeoutError(f"{address} not healthy after {timeout:.0f}s (last: {last})")
    finally:
        channel.close()


def serve_until(
    stop: threading.Event,
    server: grpc.Server,
    health_servicer: health.HealthServicer | None,
    *,
    grace: float = 5.0,
    before_stop: Callable[[], None] | None = None,
) -> None:
    """Block until `stop` is set (by SIGTERM/SIGINT: common/process.py), then stop cleanly: report NOT_SERVING,
    run `before_stop` (wake calls that wait on something, so they answer UNAVAILABLE), let calls in flight
    finish for up to `grace` seconds."""
    while not stop.wait(0.5):
        pass
    log.info("shutting down (grace %.1fs)", grace)
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    if before_stop is not None:
        before_stop()
    server.stop(grace).wait()

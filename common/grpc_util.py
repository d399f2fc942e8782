"""gRPC plumbing shared by every apexrl server and client: server/channel options, TLS credentials, the pieces of
access control both need (the policy: common/access.py; the servers' interceptor: common/aio_grpc.py), health
checks and a graceful SIGTERM/Ctrl-C shutdown.

TLS (common/tls.py holds the files): a server with a certificate serves TLS, and with a CA also requires client
certificates signed by it (mutual TLS); a client given TlsFiles dials TLS, verifying the server with the CA (the
system's roots without one) and presenting its certificate when it has one; with `tls.server_name` it checks the
server's certificate against that name instead of the address dialled (`grpc.ssl_target_name_override`: shards
dialled by pod IP, one certificate for all). The bearer token works alongside. Files renewed on disk are taken up
without a restart: by servers at their next connection, by clients at their next call (common/tls_reload.py).
What a client sees when credentials do not match (gRPC 1.85, checked by tests/integration/test_tls.py): a failed
TLS handshake is UNAVAILABLE, whichever side refuses it (no or a foreign client certificate under mutual TLS, a
server certificate the client's CA did not sign, plaintext to a TLS port, TLS to a plaintext port); the details
say "Tls handshake failed" when the client refused, "Socket closed" when the server did, and "Hostname
Verification Check failed" when the server's certificate names neither the address dialled nor tls_server_name.
A missing or wrong token over a good connection is UNAUTHENTICATED; a call the caller's role may not make is
PERMISSION_DENIED. No refused call reaches a servicer. Tokens are compared in constant time, and a server that
requires one over plaintext on an address other machines can reach says at start that the token will cross the
network in clear (`warn_if_token_in_clear`).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apexrl.common import certificates
from apexrl.common.access import (
    AccessDenied,
    Identity,
    audit_log,
    method_name,
)
from apexrl.common.addresses import check_address
from apexrl.common.errors import CancelledError, DeadlineExceededError, from_rpc_error
from apexrl.common.refusals import RateLimitedAudit, count_refusal, peer_host
from apexrl.common.tls import TlsFiles
from apexrl.common.tls_reload import ReloadingChannel, reloading_server_credentials

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# How long one connection attempt (TCP connect, TLS handshake, the server's HTTP/2 SETTINGS) may take: gRPC's own
# default. A refused connection (a server down) still fails at once and is redialled within the reconnect backoff;
# 100 ms here once failed every connection slower than that on a loaded machine (tests/integration/test_slow_connect.py).
CONNECT_TIMEOUT_MS = 20_000
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
            raise DeadlineExceededError(
                f"{self._what}: no answer within {timeout}s (the call goes on)"
            ) from None
        except grpc.FutureCancelledError:
            raise CancelledError(f"{self._what}: cancelled") from None
        except grpc.RpcError as err:
            raise from_rpc_error(err, self._what) from None
        return self._decode(reply)

    def done(self) -> bool:
        return self._call.done()

    def cancel(self) -> bool:
        return self._call.cancel()


def message_size_options(
    max_message_bytes: int, max_receive_bytes: int | None = None
) -> list[tuple[str, int]]:
    """gRPC's message limits: `max_message_bytes` both ways, or received messages up to `max_receive_bytes`
    (gRPC refuses a larger one from its length prefix, before buffering it)."""
    return [
        (
            "grpc.max_receive_message_length",
            max_message_bytes if max_receive_bytes is None else max_receive_bytes,
        ),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def same_kind_handler(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s streaming kind, encodings included, served by `behavior`."""
    make = _KINDS[(handler.request_streaming, handler.response_streaming)][0]
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def status_of(denied: AccessDenied) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, denied.code)


_audit_refusal = RateLimitedAudit(audit_log.warning)


def audit_refused(method: str, peer: str, denied: AccessDenied) -> None:
    """Count the refusal (apexrl_refused_calls_total) and audit it, rate-limited per peer, method and reason
    (common/refusals.py)."""
    name = method_name(method)
    count_refusal(name, denied.code)
    _audit_refusal(
        (peer_host(peer), name, denied.code, str(denied)),
        "refused %s from %s: %s %s",
        name,
        peer,
        denied.code,
        denied,
    )


def audit_allowed(method: str, peer: str, identity: Identity) -> None:
    audit_log.info("allowed %s from %s: %s", method_name(method), peer, identity)


def warn_if_token_in_clear(address: str, port: int, token: str | bool | None, tls: TlsFiles | None) -> None:
    """Log a warning when a server that requires a bearer token serves plaintext on `address` (host:port, bound
    to `port`) and the host is not a loopback address: every call then carries the token across the network in
    clear. Loopback binds, TLS and servers without a token stay quiet."""
    host = address.rpartition(":")[0]
    if not token or (tls is not None and tls.cert is not None) or is_loopback(host):
        return
    log.warning(
        "serving %s:%d with a bearer token over plaintext: the token crosses the network in clear on every "
        "call; serve TLS (--tls-cert, --tls-key) or bind 127.0.0.1",
        host,
        port,
    )


def warn_if_open(address: str, port: int, is_open: bool) -> None:
    """Log a warning when a server without any credential (open mode) listens beyond loopback: anyone who reaches
    the port may call every method (insert, sample, publish). Loopback binds and servers with credentials stay
    quiet."""
    host = address.rpartition(":")[0]
    if not is_open or is_loopback(host):
        return
    log.warning(
        "serving %s:%d OPEN (no token, no role tokens): anyone who reaches it may call every method; give a token "
        "(--token-file) or role tokens (--role-tokens), or bind 127.0.0.1 (docs/security.md)",
        host,
        port,
    )


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP addresses ([::1] too); False for any other name or address, and for ""
    or 0.0.0.0 (every interface)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_KINDS = {  # (request_streaming, response_streaming) -> (handler factory, behaviour attribute)
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


def handler_behavior(handler: grpc.RpcMethodHandler) -> Callable:
    """The function that serves calls of `handler` (unary_unary, unary_stream, ... whichever its kind is)."""
    return getattr(handler, _KINDS[(handler.request_streaming, handler.response_streaming)][1])


def streaming_request_handler(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s response kind and encoding whose `behavior` gets the request as a stream of raw
    messages, unary requests included (the same bytes on the wire): gRPC reads none of them until `behavior`
    asks, so a unary call can be refused unread, or read when the server has room for it."""
    make = _KINDS[(True, handler.response_streaming)][0]
    return make(behavior, request_deserializer=None, response_serializer=handler.response_serializer)


def undecodable_message(method: str, err: Exception) -> str:
    return f"{method}: a request message does not parse as protobuf ({type(err).__name__}: {err})"


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
        return (
            details._replace(metadata=metadata)
            if hasattr(details, "_replace")
            else _Details(details, metadata)
        )

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


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Verify the server with tls.ca (the system's roots without one); present tls.cert when there is one."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )


def server_credentials(tls: TlsFiles, *, who: str = "a server") -> grpc.ServerCredentials:
    """Serve tls.cert; with tls.ca, require client certificates signed by it (mutual TLS). Files read from paths
    are followed: renewed files serve the next connections (common/tls_reload.py; `who` names the server in its
    log lines)."""
    if tls.cert is None or tls.key is None:
        raise ValueError("a TLS server needs tls_cert and tls_key")
    if tls.paths:
        return reloading_server_credentials(tls, who)
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=tls.ca is not None
    )


def make_channel(
    address: str,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
    tls: TlsFiles | None = None,
    what: str = "address",
) -> grpc.Channel:
    """A channel to an apexrl server: TLS when `tls` is given (see channel_credentials; the server's
    certificate checked against tls.server_name when set, else the address; files renewed on disk used by the
    calls started after the renewal), else plaintext; the bearer token on every call when set.

    `address` must be HOST:PORT (ValueError naming `what` otherwise): gRPC itself would dial `localhost` at 443,
    wrap an out-of-range port and retry `localhost:abc` forever."""
    check_address(address, what)
    options = message_size_options(max_message_bytes) + [
        # Keep idle connections alive through NATs and notice dead peers within ~30 s.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # Reconnect to a restarted server within a second: gRPC's own backoff grows to 2 minutes, which would keep
        # a shard that came back out of sampling far longer than the sampler's stated bound.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
        # Despite its name, gRPC's minimum connect timeout (subchannel.cc ParseArgsForBackoffValues).
        ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
        # A connection of its own: gRPC otherwise shares one between every channel of a process to an address, so a
        # shard's per-connection call quota would count all of a process's clients together (512 writers and a
        # sampler in one custom actor would be refused).
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is not None:
        if tls.server_name is not None:
            options.append(("grpc.ssl_target_name_override", tls.server_name))

        def secure(files: TlsFiles) -> grpc.Channel:
            return grpc.secure_channel(address, channel_credentials(files), options=options)

        # Files read from paths are followed: calls started after a renewal use the new files (tls_reload).
        channel = ReloadingChannel(tls, secure, f"the channel to {address}") if tls.paths else secure(tls)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _TokenClientInterceptor(token))
    return channel


def bind(server: grpc.Server | grpc.aio.Server, address: str, *, tls: TlsFiles | None = None) -> int:
    """Bind `host:port` (port 0 picks a free one), with TLS when `tls` is given (see server_credentials: renewed
    files serve the next connections); return the bound port or raise OSError (naming a file that does not parse
    or a key that is not the certificate's)."""
    if tls is not None:
        try:
            certificates.check(tls)  # a renewal is checked the same way before it is served
            port = server.add_secure_port(address, server_credentials(tls, who=f"the server on {address}"))
        except ValueError as err:
            raise OSError(f"cannot serve TLS on {address}: {err}") from None
        except RuntimeError:  # gRPC could not build a TLS handshaker from the files
            raise OSError(
                f"cannot serve TLS on {address}: gRPC refused the certificate and key (is tls_key the "
                f"private key of tls_cert?)"
            ) from None
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address} (address in use or not local?)")
    return port


def wait_for_health(
    address: str, *, timeout: float, service: str = "", token: str | None = None, tls: TlsFiles | None = None
) -> None:
    """Block until the server at `address` reports SERVING (over TLS when `tls` is given); TimeoutError after
    `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    channel = make_channel(address, token=token, tls=tls)
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


class GracefulServer(Protocol):
    """What `drain` stops: common/aio_grpc.py's AioServerThread, named by what it does so that this module,
    which aio_grpc.py builds on, never imports it."""

    def enter_graceful_shutdown(self) -> None: ...

    def stop(self, grace: float | None) -> threading.Event: ...


def wait_for_stop(stop: threading.Event) -> None:
    """Block until `stop` is set (in slices, so the main thread keeps taking signals)."""
    while not stop.wait(0.5):
        pass


# How long a stopping server lets calls in flight finish (Kubernetes' terminationGracePeriodSeconds must exceed it).
DRAIN_GRACE_SECONDS = 5.0


def drain(
    server: GracefulServer,
    *,
    grace: float = DRAIN_GRACE_SECONDS,
    before_stop: Callable[[], None] | None = None,
) -> None:
    """Stop cleanly: report NOT_SERVING, run `before_stop` (wake calls that wait on something, so they answer
    UNAVAILABLE), let calls in flight finish for up to `grace` seconds."""
    log.info("shutting down (grace %.1fs)", grace)
    server.enter_graceful_shutdown()
    if before_stop is not None:
        before_stop()
    server.stop(grace).wait()

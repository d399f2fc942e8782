"""An asyncio gRPC server (grpc.aio) run on its own event-loop thread, for services with many long-lived streams.

A thread-pool server ties one thread to every open stream: a replay shard with 16 workers stops answering once
16 actors hold Insert streams. An aio server serves any number of open streams from one event loop, so a shard
answers Sample and Info at once while hundreds of writers stay connected. The loop runs in a daemon thread so the
rest of a process (its main thread's signal handling, the tests' in-process fixtures) keeps synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NoReturn, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from apexrl.common import refusals
from apexrl.common.access import AUDITED_METHODS, AccessDenied, AccessPolicy, Identity, is_open_method
from apexrl.common.call_limits import CallLimits
from apexrl.common.errors import ApexError, ErrorCode
from apexrl.common.grpc_logs import quiet_peer_gone_errors
from apexrl.common.grpc_util import (
    HEALTH_SERVICE,
    audit_allowed,
    audit_refused,
    bind,
    handler_behavior,
    message_size_options,
    same_kind_handler,
    status_of,
    streaming_request_handler,
    undecodable_message,
    warn_if_open,
    warn_if_token_in_clear,
)
from apexrl.common.memory import trim_periodically
from apexrl.common.tls import TlsFiles

log = logging.getLogger(__name__)
T = TypeVar("T")
# The plaintext health-only server's request limit: a HealthCheckRequest names a service, nothing more.
HEALTH_REQUEST_BYTES = 16 * 1024


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status of an apexrl error code (same name and number)."""
    return grpc.StatusCode[code.name]


async def abort(context: grpc.aio.ServicerContext, err: ApexError) -> NoReturn:
    """End the call with `err`'s status and message: the one place an apexrl error becomes a gRPC status."""
    await context.abort(grpc_status(err.code), str(err))
    raise AssertionError(
        "context.abort returned"
    )  # grpc.aio's abort raises; this line makes the exit visible


def _methods_of(service_names: Iterable[str]) -> list[str]:
    """`Service/Method` of every method of the named services whose descriptors are loaded (apexrl's own)."""
    from google.protobuf import descriptor_pool

    pool, found = descriptor_pool.Default(), []
    for name in service_names:
        try:
            service = pool.FindServiceByName(name)
        except KeyError:
            continue
        found += [f"{service.name}/{method.name}" for method in service.methods]
    return found


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Enforces an AccessPolicy (common/access.py): a call without a known credential is UNAUTHENTICATED, a call
    its role may not make PERMISSION_DENIED naming the identity and the method; neither reaches the servicer, and
    both are written to the audit log with the peer. Allowed Publish and Checkpoint calls are audited too; health
    checks are open. Decided from the call's metadata before it runs, except with certificate roles and no token
    (then in the call, from its TLS auth context). A call refused from its metadata is refused unread: its
    handler takes the request as a stream and never reads it (grpc.aio would otherwise receive a unary request
    whole, up to the message limit, before refusing it). The wrappers keep the behaviour's kind (coroutine or async
    generator), which grpc.aio looks at to decide how to run it."""

    def __init__(self, policy: AccessPolicy) -> None:
        self._policy = policy

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or self._policy.is_open or is_open_method(method):
            return handler
        decision = self._policy.decide(method, handler_call_details.invocation_metadata)
        if isinstance(decision, AccessDenied):

            async def deny(request_or_iterator, context):
                audit_refused(method, context.peer(), decision)
                await context.abort(status_of(decision), str(decision))

            return streaming_request_handler(handler, deny)  # refused unread: see the class docstring
        if decision is None or method in AUDITED_METHODS:
            return same_kind_handler(
                handler, _run_after(handler_behavior(handler), self._checker(method, decision))
            )
        return handler

    def _checker(self, method: str, decision: Identity | None) -> Callable:
        policy = self._policy

        async def check(context) -> None:
            identity = decision
            if identity is None:  # the client certificate decides
                try:
                    identity = policy.identify(context.invocation_metadata(), context.auth_context)
                    policy.check(method, identity)
                except AccessDenied as denied:
                    audit_refused(method, context.peer(), denied)
                    await context.abort(status_of(denied), str(denied))
            if method in AUDITED_METHODS:
                audit_allowed(method, context.peer(), identity)

        return check


def _run_after(behavior: Callable, check: Callable) -> Callable:
    """`behavior` with `await check(context)` first, of the same kind as `behavior`."""
    if inspect.isasyncgenfunction(behavior):

        async def checked_stream(request, context):
            await check(context)
            async with contextlib.aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response

        return checked_stream

    async def checked(request, context):
        await check(context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return checked


class RequestDecodeInterceptor(grpc.aio.ServerInterceptor):
    """Reads and decodes every request message itself, so that what requests make the server hold stays bounded
    (common/call_limits.py): a unary request waits for one of `max_reading_requests` slots before gRPC receives
    it (until then gRPC holds only what HTTP/2's flow-control window let in) and must arrive within
    `request_read_seconds`; a message over its method's limit is RESOURCE_EXHAUSTED, one that does not parse
    INVALID_ARGUMENT (grpc.aio itself answers UNKNOWN, a code that blames the server for a client's bytes), and
    fields the server does not know are dropped once parsed. A unary handler is served as a streaming one (the
    same bytes on the wire) because grpc.aio receives a unary request whole before any Python code sees the call.
    A streaming request takes no slot (it waits for its next message as long as its writer is idle); on a
    streaming call the first bad message ends the call. Installed after the access check, so a refused call is never read. The
    wrapper keeps the behaviour's kind (coroutine or async generator), which grpc.aio looks at to decide how to
    run it."""

    # Wrapped handlers kept per (method, handler): the servicer's handlers are built once, so each call reuses its
    # method's wrapper instead of building closures again (a noticeable share of a small call's CPU).
    _CACHED_HANDLERS = 64

    def __init__(self, limits: CallLimits | None = None) -> None:
        self._limits = limits
        self._wrapped: dict[tuple[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler] = {}
        # Made on the server's loop (the interceptor is built there, in AioServerThread._start). Health checks,
        # open to anyone, take a slot of their own: a stranger trickling them never holds a caller's slot.
        self._slots = None if limits is None else asyncio.Semaphore(limits.max_reading_requests)
        self._open_slots = None if limits is None else asyncio.Semaphore(1)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        key = (handler_call_details.method, handler)
        wrapped = self._wrapped.get(key)
        if wrapped is None:
            wrapped = self._wrap(handler, handler_call_details.method)
            if len(self._wrapped) >= self._CACHED_HANDLERS:
                self._wrapped.clear()  # handlers made per call (none of ours): never let the cache grow
            self._wrapped[key] = wrapped
        return wrapped

    def _reader(self, method: str) -> tuple[Callable, Callable]:
        """(read_next, read_unary): read_next(context) is a stream's next raw message (None at the end),
        read_unary(context) a unary call's one raw message, received in one of the server's reading slots within
        its read timeout; both checked against the method's limit. Each awaits `context.read()` itself, not the
        request iterator grpc.aio passes (its generator holds the last message it yielded until asked for the next
        one: a refused 60 MiB request stayed in memory with it), and a unary read is one coroutine deep: a unary
        call's read is on the path of every Sample (bench/README.md, "Against grpc.aio's own ceiling")."""
        limits = self._limits
        limit = None if limits is None else limits.request_limit(method)
        slots = self._open_slots if is_open_method(method) else self._slots
        seconds = None if limits is None else limits.request_read_seconds

        def checked(raw: bytes | object) -> bytes | None:
            if raw is grpc.aio.EOF:
                return None
            if limit is not None and len(raw) > limit:
                size, raw = len(raw), None
                raise _Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{method}: a request message of {size:,} bytes, over this method's limit of {limit:,} "
                    f"(max_request_bytes)",
                )
            return raw

        async def read_next(context) -> bytes | None:
            return checked(await context.read())

        async def read_unary(context) -> bytes | None:
            if seconds is None:
                return checked(await context.read())
            async with slots:  # gRPC receives a message only once it is asked for it
                return checked(await _within(context.read(), seconds, method))

        return read_next, read_unary

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        parse, behavior = handler.request_deserializer, handler_behavior(handler)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler  # a synchronous behaviour (gRPC runs it in its thread pool): left as it is
        read_next, read_unary = self._reader(method)

        def decode(raw: bytes | None):
            if raw is None:
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the call sent no request message"
                )
            try:
                request = parse(raw)
                request.DiscardUnknownFields()  # a peer's unknown bytes are not kept while the call runs
                return request
            except Exception as err:  # noqa: BLE001 (DecodeError, or anything else these bytes provoke)
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, undecodable_message(method, err)) from None

        async def requests(context):
            while (raw := await read_next(context)) is not None:
                # Parsed inline: no coroutine per message of a stream. Raised, not aborted here: the behaviour may
                # read its requests in another task (the insert stream with a write-ahead log) while this call
                # writes a response, and gRPC refuses a status sent meanwhile (the call would then hang until its
                # deadline). `decoded` aborts instead.
                request = decode(raw)
                del raw  # the parsed request holds its own copy: the received bytes go now
                yield request

        if handler.request_streaming:

            async def stream(context):
                return requests(context)

            return streaming_request_handler(handler, _decoded(behavior, stream, _same))
        return streaming_request_handler(handler, _decoded(behavior, read_unary, decode))


def _same(argument: T) -> T:
    return argument


def _decoded(behavior: Callable, read: Callable, decode: Callable) -> Callable:
    """`behavior` served on the request `decode(await read(context))` (RequestDecodeInterceptor), a _Refused
    answered with its status; of the same kind as `behavior`. The request iterator grpc.aio passes is never read:
    see RequestDecodeInterceptor._reader."""
    if inspect.isasyncgenfunction(behavior):

        async def decoded_stream(_requests, context):
            try:
                async with contextlib.aclosing(behavior(decode(await read(context)), context)) as responses:
                    async for response in responses:
                        yield response
                return
            except _Refused as err:
                refused = err.status()
            await context.abort(*refused)  # out of the except: see _Refused.status

        return decoded_stream

    async def decoded(_requests, context):
        try:
            return await behavior(decode(await read(context)), context)
        except _Refused as err:
            refused = err.status()
        await context.abort(*refused)  # out of the except: see _Refused.status

    return decoded


async def _within(awaitable: Awaitable[T], seconds: float, method: str) -> T:
    """`await awaitable`, cut off after `seconds` (_Refused DEADLINE_EXCEEDED): asyncio.timeout's way (a timer
    that cancels this task), which Python 3.10 lacks, without wait_for's task per call."""
    task, fired = asyncio.current_task(), False

    def expire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not fired:
            raise
        if hasattr(task, "uncancel"):
            task.uncancel()
        raise _Refused(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"{method}: the request message did not arrive within {seconds:g} s (request_read_seconds)",
        ) from None
    finally:
        timer.cancel()


class _Refused(Exception):
    """A request message over its method's limit or that does not parse (RequestDecodeInterceptor answers `code`)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    def status(self) -> tuple[grpc.StatusCode, str]:
        """(code, details), to abort with once this exception is gone: aborting inside its `except` chains it to
        grpc.aio's AbortError, and the chain's frames (the request's bytes among their locals) then live as long
        as that error (refused 60 MiB requests piled up in memory)."""
        return self.code, str(self)


class Changes:
    """Wakes coroutines waiting for "something changed" (a row inserted, a batch sampled): the asyncio
    counterpart of a condition variable, for waits that must not hold a thread."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout: float) -> None:
        """Return at the next notify(), or after `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):  # an alias of TimeoutError from Python 3.11
            await asyncio.wait_for(self._event.wait(), timeout)


class Lane:
    """Runs queued work items in their own turn, at most `slice_seconds` of them per pass of the event loop.

    The loop serves callbacks in arrival order: with hundreds of writers each handing it an insert, a Sample that
    arrives behind them waits for all of them (about 120 ms at 256 writers). Queued here instead, the inserts
    run a slice at a time and every other callback (Sample, Info, updates) gets its turn between two slices."""

    def __init__(self, slice_seconds: float = 0.002) -> None:
        if slice_seconds <= 0:
            raise ValueError(f"slice_seconds ({slice_seconds}) must be positive")
        self._slice_seconds = slice_seconds
        self._queue: deque[tuple[Callable[[], object], asyncio.Future]] = deque()
        self._worker: asyncio.Task | None = None

    def __len__(self) -> int:
        """Work items waiting for their turn."""
        return len(self._queue)

    async def run(self, work: Callable[[], T]) -> T:
        """work() in its turn; its result or its exception. A caller that goes away before its turn runs nothing."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append((work, future))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            end = time.perf_counter() + self._slice_seconds
            while self._queue:  # at least one item per slice, however short the slice
                work, future = self._queue.popleft()
                if not future.cancelled():
                    try:
                        future.set_result(work())
                    except BaseException as err:  # handed to the caller, whose handler maps it to a status
                        future.set_exception(err)
                if time.perf_counter() >= end:
                    break
            await asyncio.sleep(0)  # the end of the slice: every callback queued meanwhile runs first


class AioServerThread:
    """A grpc.aio server on a dedicated event-loop thread, driven from synchronous code.

    `add_services(server)` registers the servicers (it runs on the loop). `start()` binds and returns the port;
    `stop(grace)` returns a threading.Event set once the server has stopped (the grpc.Server.stop contract).
    With `tls` the port serves TLS (grpc_util.server_credentials: files renewed on disk serve the next
    connections, no restart); with `health_address` a second, plaintext
    server on the same loop serves only the health service there (its port: `health_port`). With `serving`
    false, health reports NOT_SERVING from the start until `set_serving()` (a shard restoring its checkpoint)."""

    def __init__(
        self,
        add_services: Callable[[grpc.aio.Server], None],
        service_names: Iterable[str],
        *,
        max_message_bytes: int,
        token: str | None = None,
        access: AccessPolicy | None = None,
        options: Sequence[tuple[str, int | str]] = (),
        tls: TlsFiles | None = None,
        health_address: str | None = None,
        serving: bool = True,
        on_stop: Callable[[], Awaitable[None] | None] | None = None,
        limits: CallLimits | None = None,
    ) -> None:
        quiet_peer_gone_errors()
        self._add_services = add_services
        self._service_names = list(service_names)
        refusals.serving(_methods_of(self._service_names))
        self._max_message_bytes = max_message_bytes
        # No limits given: every method may send max_message_bytes; calls and reads are capped all the same.
        self.limits = limits if limits is not None else CallLimits(max(1024, max_message_bytes))
        self.access = (
            access if access is not None else AccessPolicy.single_token(token) if token else AccessPolicy()
        )
        self._options = list(options)
        self._tls = tls
        self._health_address = health_address
        self._health_server: grpc.aio.Server | None = None
        self.health_port: int | None = None
        self._on_stop = on_stop
        self._serving = serving
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="grpc-aio", daemon=True)
        self._server: grpc.aio.Server | None = None
        self._health: health_aio.HealthServicer | None = None
        self._stopped = threading.Event()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            # Let what the stopped server left behind (cancelled call handlers) finish before the loop closes.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            # Closing the loop unregisters gRPC's poller before the interpreter exits; otherwise gRPC's own exit
            # handler closes the poller's fd under a loop that still watches it ("Bad file descriptor").
            self._loop.close()
            self._stopped.set()

    def start(self, address: str) -> int:
        """Bind `host:port` (0 picks a free port) and serve; return the port or raise OSError."""
        self._thread.start()
        try:
            return self._call(self._start(address))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    async def _start(self, address: str) -> int:
        interceptors = [] if self.access.is_open else [AccessInterceptor(self.access)]
        # After the access check: see RequestDecodeInterceptor.
        interceptors.append(RequestDecodeInterceptor(self.limits))
        limits = self.limits
        trim_periodically(limits.trim_memory_seconds)  # first: it limits the heaps gRPC's threads will use
        server = grpc.aio.server(
            interceptors=interceptors,
            options=message_size_options(
                self._max_message_bytes, limits.receive_limit(self._max_message_bytes)
            )
            + limits.server_options()
            + self._options
            + [("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=limits.max_concurrent_calls,
        )
        self._add_services(server)
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        await self._set_health(self._serving)
        reflection.enable_server_reflection(
            [*self._service_names, HEALTH_SERVICE, reflection.SERVICE_NAME], server
        )
        port = bind(server, address, tls=self._tls)
        warn_if_token_in_clear(address, port, self.access.has_tokens, self._tls)
        warn_if_open(address, port, self.access.is_open)
        if self._health_address is not None:
            # Health checks only: open to anyone, and never more than a service name to read.
            health_server = grpc.aio.server(
                options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", HEALTH_REQUEST_BYTES)],
                maximum_concurrent_rpcs=limits.max_concurrent_calls,
            )
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health_server)
            self.health_port = bind(health_server, self._health_address)
            await health_server.start()
            self._health_server = health_server
        await server.start()
        self._server = server
        return port

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self._service_names]:
            await self._health.set(name, status)

    def set_serving(self) -> None:
        """Report SERVING (after starting with `serving` false)."""
        self._serving = True
        if self._health is not None and not self._stopped.is_set():
            self._call(self._set_health(True))

    def enter_graceful_shutdown(self) -> None:
        """Report NOT_SERVING to health checks (load balancers and probes stop sending new work)."""
        if self._health is not None and not self._stopped.is_set():
            self._call(self._health.enter_graceful_shutdown())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving: calls in flight get `grace` seconds to finish. Returns an event set once stopped."""
        if self._server is not None and not self._stopped.is_set():
            asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        return self._stopped

    async def _stop(self, grace: float | None) -> None:
        try:
            if self._on_stop is not None:
                result = self._on_stop()
                if result is not None:
                    await result
            stopping = [self._server.stop(grace)]
            if self._health_server is not None:
                stopping.append(self._health_server.stop(grace))
            await asyncio.gather(*stopping)
        finally:
            self._loop.stop()  # _run closes the loop and then reports the server stopped

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

"""gRPC calls made with raw bytes (no serializers: any bytes go out, valid protobuf or not), what came back, and a
tally of status codes per RPC for the run's summary."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Every fuzzed call gets this deadline. Nothing in the fuzzed setups may wait (no rate limiter, data present), so a
# call that reaches it counts as a hang. Calls take milliseconds; the margin is for heavily loaded CI machines.
CALL_TIMEOUT = 10.0


@dataclass(frozen=True)
class Outcome:
    """How one call ended: its status, the raw response messages received before it, and how long it took."""

    code: grpc.StatusCode
    details: str
    responses: tuple[bytes, ...]
    seconds: float


class RawClient:
    """Calls the methods of one service with bytes in and bytes out, on one channel."""

    def __init__(self, address: str, service: str) -> None:
        self.address = address
        self.service = service
        # Receive anything the server sends: the server's own send limit is what the tests exercise.
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def call(self, method: str, request: bytes | Sequence[bytes]) -> Outcome:
        """Call `method` with one request (bytes) or a stream of them (a list), whatever its streaming kind."""
        path = f"/{self.service}/{method}"
        streaming_request = not isinstance(request, bytes)
        responses: list[bytes] = []
        start = time.monotonic()
        try:
            if method in _RESPONSE_STREAMING:
                call = (
                    self.channel.stream_stream(path) if streaming_request else self.channel.unary_stream(path)
                )
                for response in call(iter(request) if streaming_request else request, timeout=CALL_TIMEOUT):
                    responses.append(response)
            elif streaming_request:
                responses.append(self.channel.stream_unary(path)(iter(request), timeout=CALL_TIMEOUT))
            else:
                responses.append(self.channel.unary_unary(path)(request, timeout=CALL_TIMEOUT))
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        return Outcome(code, details, tuple(responses), time.monotonic() - start)

    def serving(self) -> str:
        """The health status of the server and of the service, e.g. 'SERVING/SERVING' (or the error code)."""
        names = []
        for service in ("", self.service):
            try:
                reply = self._health.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT
                )
                names.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            except grpc.RpcError as err:
                names.append(err.code().name)
        return "/".join(names)


# Methods whose answer is a stream (the others answer one message).
_RESPONSE_STREAMING = {"Insert", "StreamUpdatePriorities", "Fetch"}


class Tally:
    """Counts of (target, what, status) over the whole module, printed as the run's summary."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.examples: Counter[tuple[str, str]] = Counter()

    def example(self, target: str, rpc: str) -> None:
        self.examples[target, rpc] += 1

    def add(self, target: str, what: str, status: str) -> None:
        self.counts[target, what, status] += 1

    def statuses(self, target: str, what: str) -> Counter[str]:
        return Counter({s: n for (t, w, s), n in self.counts.items() if (t, w) == (target, what)})

    def lines(self) -> list[str]:
        out = []
        for target in sorted({t for t, _ in self.examples}):
            out.append(f"{target}:")
            whats = sorted({w for t, w, _ in self.counts if t == target})
            for what in whats:
                rpc = what.split(" ")[0]
                head = f"{self.examples[target, rpc]} examples" if what == rpc else "per message"
                statuses = ", ".join(f"{s} {n}" for s, n in sorted(self.statuses(target, what).items()))
                out.append(f"  {what:28} {head:>14}: {statuses}")
        return out

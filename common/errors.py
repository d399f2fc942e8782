"""The apexrl exception hierarchy, shared by servers and clients.

Pure cores (sum tree, table, parameter store) raise these; servicers translate them to gRPC status codes at the
edge, and clients translate gRPC status codes back, so the same exception type names the same failure on both
sides of the wire.
"""

from __future__ import annotations

import grpc


class ApexError(Exception):
    """Base class of every error apexrl raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(ApexError, ValueError):
    """The request itself is wrong (schema, encoding, priority value, batch size); retrying cannot help."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhaustedError(ApexError):
    """A message is larger than the receiver accepts."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(ApexError):
    """The server is not in a state to answer (for example: too few rows to sample) and the caller asked not to wait."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class DeadlineExceededError(ApexError, TimeoutError):
    """The call waited (rate limiter, minimum size, network) until its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnavailableError(ApexError, ConnectionError):
    """The server cannot be reached or is shutting down; retrying later may help."""

    code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(ApexError):
    """Missing or wrong credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(ApexError):
    """A known caller whose role may not do this (common/access.py); retrying cannot help."""

    code = grpc.StatusCode.PERMISSION_DENIED


class CancelledError(ApexError):
    """The call was cancelled (by this client closing, or by the server going away mid-call)."""

    code = grpc.StatusCode.CANCELLED


class InternalError(ApexError):
    """The server failed in a way that is not the request's fault; retrying later may help."""

    code = grpc.StatusCode.INTERNAL


class NotFoundError(ApexError, LookupError):
    """The named thing (for example a weights version) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


_BY_CODE: dict[grpc.StatusCode, type[ApexError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        ResourceExhaustedError,
        FailedPreconditionError,
        DeadlineExceededError,
        UnavailableError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotFoundError,
        CancelledError,
        InternalError,
    )
}

# Failures that say nothing about the request itself: the same call may succeed later or on another server.
TRANSIENT_ERRORS: tuple[type[ApexError], ...] = (
    UnavailableError,
    DeadlineExceededError,
    CancelledError,
    InternalError,
    FailedPreconditionError,
)


def is_transient(err: ApexError) -> bool:
    """True for failures a caller should retry or route around (a shard down, busy, restarting or not ready),
    false for a request that is wrong (bad argument, too large, unauthenticated) and would fail again."""
    return isinstance(err, TRANSIENT_ERRORS) or err.code == grpc.StatusCode.UNKNOWN


def error_for_code(code: grpc.StatusCode, message: str) -> ApexError:
    """The apexrl exception for a gRPC status code (ApexError for codes without a dedicated class)."""
    err = _BY_CODE.get(code, ApexError)(message)
    err.code = code
    return err


def from_rpc_error(err: grpc.RpcError, what: str) -> ApexError:
    """Translate a failed call into an apexrl exception whose message says which call failed and why."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_for_code(code, f"{what}: {code.name}: {details}")


def status_code_from_int(value: int) -> grpc.StatusCode:
    """Map the integer status code carried in a message (e.g. InsertAck.error_code) to grpc.StatusCode."""
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN

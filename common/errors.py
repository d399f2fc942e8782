"""The apexrl exception hierarchy, shared by servers and clients.

Pure cores (sum tree, table, parameter store) raise these; the gRPC edge translates them to status codes
(`common/aio_grpc.py grpc_status`, `abort`), and clients translate status codes back (`from_rpc_error`), so the same
exception type names the same failure on both sides of the wire. Pure: this module does not import grpc, so
neither does a core that raises these.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.Enum):
    """A failure's status, with gRPC's numbering and names (the wire carries the number, e.g. InsertAck.error_code).

    A member compares equal to (and hashes like) the grpc.StatusCode of the same name, so code written against
    gRPC's codes (`err.code == grpc.StatusCode.UNAVAILABLE`) keeps working without this module importing grpc."""

    OK = (0, "ok")
    CANCELLED = (1, "cancelled")
    UNKNOWN = (2, "unknown")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    NOT_FOUND = (5, "not found")
    ALREADY_EXISTS = (6, "already exists")
    PERMISSION_DENIED = (7, "permission denied")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    FAILED_PRECONDITION = (9, "failed precondition")
    ABORTED = (10, "aborted")
    OUT_OF_RANGE = (11, "out of range")
    UNIMPLEMENTED = (12, "unimplemented")
    INTERNAL = (13, "internal")
    UNAVAILABLE = (14, "unavailable")
    DATA_LOSS = (15, "data loss")
    UNAUTHENTICATED = (16, "unauthenticated")

    @property
    def number(self) -> int:
        """The status's number on the wire."""
        return self.value[0]

    @classmethod
    def of(cls, code: Any) -> ErrorCode:
        """The member for an ErrorCode, a grpc.StatusCode (by name), a name, or a wire number; UNKNOWN otherwise."""
        if isinstance(code, ErrorCode):
            return code
        if isinstance(code, int) and not isinstance(code, bool):
            return _BY_NUMBER.get(code, cls.UNKNOWN)
        name = code if isinstance(code, str) else getattr(code, "name", None)
        return cls.__members__.get(name, cls.UNKNOWN) if isinstance(name, str) else cls.UNKNOWN

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ErrorCode):
            return self is other
        if type(other).__name__ == "StatusCode" and isinstance(other, enum.Enum):  # grpc.StatusCode
            return other.name == self.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)  # what enum.Enum (and so grpc.StatusCode) hashes


_BY_NUMBER: dict[int, ErrorCode] = {code.number: code for code in ErrorCode}


class ApexError(Exception):
    """Base class of every error apexrl raises on purpose."""

    code: ErrorCode = ErrorCode.UNKNOWN


class InvalidArgumentError(ApexError, ValueError):
    """The request itself is wrong (schema, encoding, priority value, batch size); retrying cannot help."""

    code = ErrorCode.INVALID_ARGUMENT


class ResourceExhaustedError(ApexError):
    """A message is larger than the receiver accepts."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(ApexError):
    """The server is not in a state to answer (for example: too few rows to sample) and the caller asked not to wait."""

    code = ErrorCode.FAILED_PRECONDITION


class DeadlineExceededError(ApexError, TimeoutError):
    """The call waited (rate limiter, minimum size, network) until its deadline."""

    code = ErrorCode.DEADLINE_EXCEEDED


class UnavailableError(ApexError, ConnectionError):
    """The server cannot be reached or is shutting down; retrying later may help."""

    code = ErrorCode.UNAVAILABLE


class UnauthenticatedError(ApexError):
    """Missing or wrong credentials."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(ApexError):
    """A known caller whose role may not do this (common/access.py); retrying cannot help."""

    code = ErrorCode.PERMISSION_DENIED


class CancelledError(ApexError):
    """The call was cancelled (by this client closing, or by the server going away mid-call)."""

    code = ErrorCode.CANCELLED


class InternalError(ApexError):
    """The server failed in a way that is not the request's fault; retrying later may help."""

    code = ErrorCode.INTERNAL


class NotFoundError(ApexError, LookupError):
    """The named thing (for example a weights version) does not exist."""

    code = ErrorCode.NOT_FOUND


_BY_CODE: dict[ErrorCode, type[ApexError]] = {
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
    return isinstance(err, TRANSIENT_ERRORS) or err.code is ErrorCode.UNKNOWN


def error_for_code(code: ErrorCode | Any, message: str) -> ApexError:
    """The apexrl exception for a status (an ErrorCode or a grpc.StatusCode; ApexError for codes without a
    dedicated class)."""
    code = ErrorCode.of(code)
    err = _BY_CODE.get(code, ApexError)(message)
    err.code = code
    return err


def from_rpc_error(err: Exception, what: str) -> ApexError:
    """Translate a failed call (a grpc.RpcError) into an apexrl exception whose message says which call failed and
    why."""
    code = ErrorCode.of(err.code()) if callable(getattr(err, "code", None)) else ErrorCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    return error_for_code(code, f"{what}: {code.name}: {details}")


def status_code_from_int(value: int) -> ErrorCode:
    """The status of the number carried in a message (e.g. InsertAck.error_code); UNKNOWN for a number gRPC does not
    define."""
    return ErrorCode.of(value)

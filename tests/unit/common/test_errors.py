"""The apexrl exception hierarchy (common/errors.py): one class per gRPC status both sides name the same way, and
which failures are transient (retry or route around) rather than the request's fault."""

from __future__ import annotations

import grpc
import pytest

from apexrl.common import errors


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


CLASSES = [
    errors.InvalidArgumentError,
    errors.ResourceExhaustedError,
    errors.FailedPreconditionError,
    errors.DeadlineExceededError,
    errors.UnavailableError,
    errors.UnauthenticatedError,
    errors.NotFoundError,
    errors.CancelledError,
    errors.InternalError,
]


@pytest.mark.parametrize("cls", CLASSES)
def test_each_status_code_maps_to_its_class_and_back(cls):
    err = errors.from_rpc_error(FakeRpcError(cls.code, "why"), "sample on 127.0.0.1:7000")
    assert type(err) is cls and err.code == cls.code and isinstance(err, errors.ApexError)
    assert str(err) == f"sample on 127.0.0.1:7000: {cls.code.name}: why"
    assert errors.status_code_from_int(cls.code.value[0]) == cls.code


def test_codes_without_a_class_keep_their_code():
    err = errors.error_for_code(grpc.StatusCode.ABORTED, "aborted")
    assert type(err) is errors.ApexError and err.code == grpc.StatusCode.ABORTED
    assert errors.status_code_from_int(12345) == grpc.StatusCode.UNKNOWN


@pytest.mark.parametrize(
    ("cls", "transient"),
    [
        (errors.UnavailableError, True),
        (errors.DeadlineExceededError, True),
        (errors.CancelledError, True),
        (errors.InternalError, True),
        (errors.FailedPreconditionError, True),
        (errors.ApexError, True),
        (errors.InvalidArgumentError, False),
        (errors.ResourceExhaustedError, False),
        (errors.UnauthenticatedError, False),
        (errors.NotFoundError, False),
    ],
)
def test_transient_errors_are_the_ones_worth_retrying(cls, transient):
    assert errors.is_transient(cls("x")) is transient


def test_errors_are_also_the_builtin_exceptions_callers_expect():
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.DeadlineExceededError, TimeoutError)
    assert issubclass(errors.UnavailableError, ConnectionError)
    assert issubclass(errors.NotFoundError, LookupError)


def test_error_codes_are_grpcs_by_name_and_number():
    assert [(c.name, c.value) for c in errors.ErrorCode] == [(c.name, c.value) for c in grpc.StatusCode]
    for code in grpc.StatusCode:
        ours = errors.ErrorCode.of(code)
        assert ours.name == code.name and ours.number == code.value[0]
        assert ours == code and code == ours and hash(ours) == hash(code)  # old comparisons keep working
        assert errors.ErrorCode.of(code.value[0]) is ours and errors.ErrorCode.of(code.name) is ours
    assert errors.ErrorCode.UNAVAILABLE != grpc.StatusCode.UNKNOWN
    assert errors.ErrorCode.of(99) is errors.ErrorCode.UNKNOWN
    assert errors.ErrorCode.of(None) is errors.ErrorCode.UNKNOWN


def test_the_edge_maps_each_error_to_the_grpc_status_of_its_name():
    from apexrl.common.aio_grpc import grpc_status

    for cls in [*CLASSES, errors.PermissionDeniedError]:
        assert grpc_status(cls.code) is grpc.StatusCode[cls.code.name]


def test_the_errors_module_loads_neither_grpc_nor_protobuf():
    """A pure core raises these errors: importing them must not pull in the gRPC runtime (fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, apexrl.common.errors\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

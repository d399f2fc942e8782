"""The weights format and the version rules (parameter_server/weights.py): packing and unpacking named tensors, the
checks a layout and its bytes must pass, and the window a new version must lie in. No protobuf: importing the module
loads neither grpc nor protobuf (tests/unit/test_import_rules.py)."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError
from apexrl.common.signature import MAX_DIM
from apexrl.parameter_server.weights import (
    MAX_VERSION,
    MAX_VERSION_STEP,
    TensorEntry,
    VersionRefusedError,
    check_layout,
    check_packed,
    check_version_in_window,
    check_version_number,
    next_version,
    pack,
    unpack,
    version_window,
)

F4 = np.dtype("<f4")

# --- pack and unpack -----------------------------------------------------------------------------------------------


def test_pack_and_unpack_keep_order_dtype_shape_and_alignment():
    weights = {
        "b": np.arange(3, dtype=np.int8),
        "a": np.arange(6, dtype=">f8").reshape(2, 3),
        "s": np.float32(1.5),
        "m": np.array([True, False]),
    }
    layout, payload = pack(weights)
    assert [e.name for e in layout] == ["b", "a", "s", "m"]
    assert [e.offset for e in layout] == [0, 3, 51, 55] and payload.nbytes == 57
    assert payload.readonly
    check_layout(layout, payload.nbytes)
    arrays = unpack(layout, payload)
    assert arrays["a"].dtype == np.dtype("<f8") and arrays["a"].flags.aligned  # offset 3: copied to align
    for name, value in weights.items():
        np.testing.assert_array_equal(arrays[name], value)
        assert arrays[name].shape == np.shape(value)


def test_unpack_gives_views_of_the_payload_and_copies_only_an_unaligned_tensor():
    """Aligned tensors are views (read-only from a read-only payload, writable from a bytearray the client
    received into); the tensor at an odd offset is a private, aligned copy."""
    layout, payload = pack({"b": np.arange(1, dtype=np.uint8), "w": np.arange(4, dtype=np.float32)})
    assert layout[1].offset == 1
    aligned_layout, aligned_payload = pack({"w": np.arange(4, dtype=np.float32)})
    view = unpack(aligned_layout, aligned_payload)["w"]
    assert np.shares_memory(view, np.frombuffer(aligned_payload, np.uint8)) and not view.flags.writeable
    received = bytearray(payload)
    arrays = unpack(layout, received)
    assert arrays["w"].flags.aligned and not np.shares_memory(arrays["w"], np.frombuffer(received, np.uint8))
    assert arrays["b"].flags.writeable and np.shares_memory(arrays["b"], np.frombuffer(received, np.uint8))
    np.testing.assert_array_equal(arrays["w"], [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({}, "weights have no tensors"),
        ({"": np.zeros(2)}, "tensor names must be non-empty strings, got ''"),
        ({3: np.zeros(2)}, "tensor names must be non-empty strings, got 3"),
        ({"c": np.ones(2, np.complex64)}, "tensor 'c': unsupported dtype complex64"),
        ({"names": np.array(["a", "b"])}, "tensor 'names': unsupported dtype"),
    ],
)
def test_pack_refuses_what_the_format_cannot_carry(weights, message):
    with pytest.raises(InvalidArgumentError, match=f"^{message}"):
        pack(weights)


# --- layouts and their bytes ---------------------------------------------------------------------------------------


def test_check_layout_accepts_any_order_and_empty_tensors():
    check_layout(
        [
            TensorEntry("b", F4, (2,), 8, 8),
            TensorEntry("e", F4, (0,), 16, 0),
            TensorEntry("a", F4, (2,), 0, 8),
        ],
        16,
    )
    check_layout([TensorEntry("big", np.dtype("u1"), (MAX_DIM, 0), 0, 0)], 0)  # MAX_DIM itself is allowed


@pytest.mark.parametrize(
    ("layout", "total", "message"),
    [
        ([], 0, "weights have no tensors"),
        ([TensorEntry("", F4, (1,), 0, 4)], 4, "a tensor has an empty name"),
        (
            [TensorEntry("a", F4, (1,), 0, 4), TensorEntry("a", F4, (1,), 4, 4)],
            8,
            "duplicate tensor name 'a'",
        ),
        ([TensorEntry("a", F4, (-1,), 0, 0)], 0, r"tensor 'a': dimension -1 out of range \[0, 2147483648\]"),
        ([TensorEntry("a", F4, (MAX_DIM + 1,), 0, 0)], 0, "dimension 2147483649 out of range"),
        ([TensorEntry("a", F4, (3,), 0, 8)], 8, r"tensor 'a': nbytes 8, but shape \[3\] of float32 needs 12"),
        ([TensorEntry("a", F4, (1 << 31, 1 << 31, 1 << 31), 0, 0)], 0, "needs"),  # no int64 overflow
        (
            [TensorEntry("a", F4, (2,), 4, 8)],
            8,
            r"tensor 'a' float32\[2\] at bytes \[4, 12\): outside the 8 total",
        ),
        ([TensorEntry("a", F4, (1,), -4, 4)], 4, "outside the 4 total bytes"),
        (
            [TensorEntry("a", F4, (2,), 0, 8), TensorEntry("b", F4, (2,), 4, 8)],
            12,
            r"tensors 'a' float32\[2\] at bytes \[0, 8\) and 'b' float32\[2\] at bytes \[4, 12\) overlap",
        ),
        (
            [TensorEntry("a", F4, (1,), 0, 4), TensorEntry("b", F4, (1,), 8, 4)],
            12,
            r"total_bytes is 12, but the tensors' nbytes sum to 8 \(no gaps are allowed\)",
        ),
    ],
)
def test_check_layout_names_the_first_problem(layout, total, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_layout(layout, total)


def test_check_packed_returns_the_bytes_read_only_and_refuses_bool_bytes_other_than_0_or_1():
    layout = (TensorEntry("m", np.dtype("bool"), (3,), 0, 3),)
    with pytest.raises(InvalidArgumentError, match="^tensor 'm': bool bytes must be 0 or 1, found 2$"):
        check_packed(layout, bytearray(b"\1\0\2"))
    received = bytearray(b"\1\0\1")
    view = check_packed(layout, received)
    assert view.readonly and view.nbytes == 3 and view.obj is received  # kept as given, not copied
    with pytest.raises(InvalidArgumentError, match="nbytes sum to 3"):
        check_packed(layout, b"\1\0\1\0")


# --- versions ------------------------------------------------------------------------------------------------------


def test_the_window_above_a_version():
    assert MAX_VERSION == 2**63 - 1 and MAX_VERSION_STEP == 2**20
    assert version_window(0) == (1, MAX_VERSION_STEP)
    assert version_window(7) == (8, 7 + MAX_VERSION_STEP)
    assert version_window(MAX_VERSION - 3) == (MAX_VERSION - 2, MAX_VERSION)
    low, high = version_window(MAX_VERSION)
    assert low > high  # nothing follows the largest version
    assert next_version(0) == 1 and next_version(MAX_VERSION - 1) == MAX_VERSION
    with pytest.raises(
        VersionRefusedError, match=rf"^no version is left after the current one \({MAX_VERSION}, "
    ):
        next_version(MAX_VERSION)


@pytest.mark.parametrize("version", [8, 9, 7 + MAX_VERSION_STEP])
def test_a_version_in_the_window_is_accepted(version):
    check_version_in_window(version, 7)


@pytest.mark.parametrize(
    ("version", "why"),
    [
        (7, "not greater than the current version 7"),
        (1, "not greater than the current version 7"),
        (8 + MAX_VERSION_STEP, f"more than {MAX_VERSION_STEP} above the current version 7: "),
        (2**63, f"above the largest version {MAX_VERSION}: "),
        (2**64 - 1, f"above the largest version {MAX_VERSION}: "),
    ],
)
def test_a_version_outside_the_window_is_refused_naming_both_versions(version, why):
    with pytest.raises(VersionRefusedError) as info:
        check_version_in_window(version, 7)
    message = str(info.value)
    assert message.startswith(f"version {version} is {why}")
    if "not greater" not in why:
        assert message.endswith(
            f"the current version is 7, so the next must be in [8, {7 + MAX_VERSION_STEP}]"
        )
    assert isinstance(info.value, FailedPreconditionError)  # FAILED_PRECONDITION on the wire


def test_without_the_current_version_only_the_largest_is_checked():
    """A client does not know the service's version: it refuses what no service could accept, nothing more."""
    for version in (1, 10**9, MAX_VERSION):
        check_version_in_window(version)
    with pytest.raises(
        VersionRefusedError, match=rf"^version {2**64 - 1} is above the largest version {MAX_VERSION}$"
    ):
        check_version_in_window(2**64 - 1)


def test_what_is_no_version_at_all_is_an_invalid_argument():
    assert check_version_number(None) is None
    assert check_version_number(5) == 5
    assert type(check_version_number(np.int64(5))) is int
    for bad in (True, 1.5, "3", np.float32(2)):
        with pytest.raises(InvalidArgumentError, match="^version must be an integer or None, got "):
            check_version_number(bad)
    for bad in (0, -1, np.int64(0)):
        with pytest.raises(InvalidArgumentError, match=r"^version must be >= 1 \(0 means 'none'\), got "):
            check_version_number(bad)

"""The ParameterService under fuzzing: Publish streams drawn from valid ones (packed with parameter_server/weights.py,
headers from parameter_server/wire.py) and then mutated (header fields, layout, chunk order and lengths, bytes), the
published state before and after, and what each answer implies.

As for the replay shard, the oracle checks an accepted Publish against the contract with its own code (layout
tiles total_bytes, dtypes, dimensions, BOOL bytes, a newer version) and expects exactly the bytes it sent to be
published; a rejected Publish must leave version and bytes as they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
import numpy as np
from hypothesis import strategies as st

from apexrl.common import codec
from apexrl.parameter_server import wire
from apexrl.parameter_server.weights import pack
from apexrl.proto import parameters_pb2, parameters_pb2_grpc
from tests.integration.fuzzing.mutations import (
    DTYPE_NUMBERS,
    SPECIAL_DIMS,
    Draw,
    chance,
    mangle,
    oversize_string_field,
)
from tests.integration.fuzzing.raw import CALL_TIMEOUT, Outcome

SERVICE = wire.SERVICE_NAME
UINT64_MAX = 2**64 - 1
MAX_VERSION = 2**63 - 1  # parameters.proto: versions are at most 2**63 - 1 ...
MAX_VERSION_STEP = 2**20  # ... and at most 2**20 above the current one
MAX_DIM = 2**31
OK, INVALID, EXHAUSTED = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)
REFUSED = grpc.StatusCode.FAILED_PRECONDITION
# parameters.proto: every problem in a Publish stream is INVALID_ARGUMENT, a version outside the window above the
# current one FAILED_PRECONDITION, a message over the size limit (or a header over max_weights_bytes)
# RESOURCE_EXHAUSTED; Fetch and GetVersion have no errors of their own. INVALID_ARGUMENT also answers a message that
# does not parse. UNAUTHENTICATED, UNAVAILABLE, DEADLINE_EXCEEDED (nothing waits here), INTERNAL, UNKNOWN: failures.
ALLOWED = {
    "Publish": {OK, INVALID, EXHAUSTED, REFUSED},
    "Fetch": {OK, INVALID, EXHAUSTED},
    "GetVersion": {OK, INVALID, EXHAUSTED},
}
_ITEMSIZE = {1: 4, 2: 8, 3: 2, 4: 1, 5: 2, 6: 4, 7: 8, 8: 1, 9: 2, 10: 4, 11: 8, 12: 1}
_DTYPES = (
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
)


@dataclass(frozen=True)
class StoreState:
    """The published version: number, layout (name, wire dtype, shape, offset, nbytes) and bytes; for an
    in-process service also how many versions were ever published."""

    version: int
    layout: tuple
    payload: bytes
    published_total: int | None = None


def exact_state(store) -> StoreState:
    latest = store.latest()
    if latest is None:
        return StoreState(0, (), b"", store.published_total)
    layout = tuple(
        (e.name, codec.dtype_to_wire(e.dtype), tuple(e.shape), e.offset, e.nbytes) for e in latest.layout
    )
    return StoreState(latest.version, layout, bytes(latest.payload), store.published_total)


def fetched_state(channel: grpc.Channel) -> StoreState:
    """The published state as a client sees it: GetVersion, then Fetch(0)."""
    stub = parameters_pb2_grpc.ParameterServiceStub(channel)
    version = stub.GetVersion(parameters_pb2.GetVersionRequest(), timeout=CALL_TIMEOUT).version
    messages = list(stub.Fetch(parameters_pb2.FetchRequest(have_version=0), timeout=CALL_TIMEOUT))
    if messages[0].HasField("not_newer"):
        return StoreState(version, (), b"")
    header = messages[0].header
    assert header.version == version
    return StoreState(version, _layout(header), b"".join(m.chunk for m in messages))


def _layout(header: parameters_pb2.WeightsHeader) -> tuple:
    return tuple((t.name, t.dtype, tuple(t.shape), t.offset, t.nbytes) for t in header.tensors)


# --- requests ------------------------------------------------------------------------------------------------------


def draw_weights(draw: Draw) -> dict[str, np.ndarray]:
    names = draw(
        st.lists(
            st.sampled_from(["w", "b", "layer.0.weight", "é"]) | st.text(min_size=1, max_size=8),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = {}
    for name in names:
        dtype = draw(st.sampled_from(_DTYPES))
        shape = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 3), (4, 0, 2), (17,)]))
        values = rng.integers(0, 2, shape) if dtype is np.bool_ else rng.standard_normal(shape) * 10
        weights[name] = values.astype(dtype)
    return weights


def draw_version(draw: Draw, current: int, log: list[str], far: bool) -> int:
    """A header's version: mostly near the current one; with `far`, often beyond the window above it too."""
    choices = ["auto", "auto", "auto", "next", "skip", "current", "older", "one"]
    choice = draw(
        st.sampled_from(choices + (["uint64_max", "max", "edge", "beyond", "beyond"] if far else []))
    )
    if choice not in ("auto", "next", "skip"):
        log.append(f"version:{choice}")
    version = {
        "auto": 0,
        "next": current + 1,
        "skip": current + draw(st.integers(2, 1000)),
        "current": current,
        "older": max(current - 1, 0),
        "one": 1,
        "uint64_max": UINT64_MAX,
        "max": MAX_VERSION,
        "edge": current + MAX_VERSION_STEP,
        "beyond": current + MAX_VERSION_STEP + 1,
    }[choice]
    return min(version, UINT64_MAX)  # a uint64 field


def draw_publish_stream(
    draw: Draw, current: int, limit: int, log: list[str], far: bool = False
) -> tuple[list[bytes], str]:
    """One Publish stream: the header (first message) and the packed bytes in 1-4 pieces, then 0-2 mutations of
    header, layout or chunks, then possibly damaged bytes; rarely a message over the size limit, either before
    the last message or after all of them. Returns the messages and where the oversize one is ("", "inside" or
    "last")."""
    layout, payload = pack(draw_weights(draw))
    payload = bytearray(payload)
    header = wire.header_to_proto(draw_version(draw, current, log, far), layout, len(payload))
    cuts = sorted(draw(st.lists(st.integers(0, len(payload)), max_size=3)))
    pieces = [bytes(payload[a:b]) for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    if draw(st.booleans()):
        pieces.insert(0, b"")  # the header alone in the first message
    messages = [parameters_pb2.PublishRequest(chunk=piece) for piece in pieces]
    messages[0].header.CopyFrom(header)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        messages = _mutate_publish(draw, messages, log)
    raw = [
        mangle(draw, m.SerializeToString(), log, f"publish[{i}]", probability=12)
        for i, m in enumerate(messages)
    ]
    oversize = draw(st.sampled_from(["inside", "last"])) if chance(draw, 5) else ""
    if oversize:
        log.append(f"publish:oversize-{oversize}")
        raw.insert(
            len(raw) - 1 if oversize == "inside" and raw else len(raw), oversize_string_field(2, limit + 1)
        )
    return raw, oversize


def _mutate_publish(draw: Draw, messages: list, log: list[str]) -> list:
    op = draw(
        st.sampled_from(
            [
                "tensor",
                "tensor",
                "tensor",
                "total_bytes",
                "version",
                "drop_tensor",
                "duplicate_tensor",
                "clear_tensors",
                "header_late",
                "header_twice",
                "no_header",
                "extra_byte",
                "missing_byte",
                "swap_chunks",
                "bool_byte",
                "empty_stream",
            ]
        )
    )
    if not messages:
        return messages
    header = messages[0].header
    tensors = header.tensors
    if op == "tensor" and tensors:
        tensor = tensors[draw(st.integers(0, len(tensors) - 1))]
        what = draw(st.sampled_from(["name", "dtype", "dim", "rank", "offset", "nbytes"]))
        log.append(f"layout:{what}")
        if what == "name":
            tensor.name = draw(st.sampled_from(["", tensors[0].name, tensors[-1].name]))
        elif what == "dtype":
            tensor.dtype = draw(st.sampled_from(DTYPE_NUMBERS))
        elif what == "dim":
            shape = list(tensor.shape) or [1]
            shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from(SPECIAL_DIMS))
            tensor.shape[:] = shape
        elif what == "rank":
            tensor.shape.extend([1] * draw(st.sampled_from([31, 32, 63, 64, 65])))
        elif what == "offset":
            tensor.offset = draw(
                st.sampled_from(
                    [
                        min(tensor.offset + 1, UINT64_MAX),
                        max(tensor.offset - 1, 0),
                        0,
                        header.total_bytes,
                        UINT64_MAX,
                    ]
                )
            )  # uint64: at most UINT64_MAX
        else:
            tensor.nbytes = draw(
                st.sampled_from(
                    [min(tensor.nbytes + 1, UINT64_MAX), max(tensor.nbytes - 1, 0), 0, UINT64_MAX]
                )
            )
        return messages
    log.append(f"publish:{op}")
    chunks = [m.chunk for m in messages]
    if op == "total_bytes":
        header.total_bytes = draw(
            st.sampled_from(
                [min(header.total_bytes + 1, UINT64_MAX), max(header.total_bytes - 1, 0), 0, UINT64_MAX]
            )
        )
    elif op == "version":
        header.version = draw(st.sampled_from([0, 1, 2**32, 2**63]))
    elif op == "drop_tensor" and tensors:
        del tensors[draw(st.integers(0, len(tensors) - 1))]
    elif op == "duplicate_tensor" and tensors:
        tensors.add().CopyFrom(tensors[0])
    elif op == "clear_tensors":
        del tensors[:]
    elif op == "header_late":
        if len(messages) == 1:
            messages.append(parameters_pb2.PublishRequest())
        messages[1].header.CopyFrom(header)
        messages[0].ClearField("header")
    elif op == "header_twice":
        messages.append(parameters_pb2.PublishRequest(header=header))
    elif op == "no_header":
        messages[0].ClearField("header")
    elif op == "extra_byte":
        messages[-1].chunk = chunks[-1] + b"\x00"
    elif op == "missing_byte":
        nonempty = [i for i, c in enumerate(chunks) if c]
        if nonempty:
            messages[nonempty[-1]].chunk = chunks[nonempty[-1]][:-1]
    elif op == "swap_chunks" and len(messages) > 1:
        i, j = draw(st.permutations(range(len(messages))))[:2]
        messages[i].chunk, messages[j].chunk = chunks[j], chunks[i]
    elif op == "bool_byte":
        payload = bytearray(b"".join(chunks))
        bools = [t for t in tensors if t.dtype == 12 and t.nbytes and t.offset + t.nbytes <= len(payload)]
        if bools:
            payload[bools[0].offset] = draw(st.integers(2, 255))
            start = 0
            for m, c in zip(messages, chunks, strict=True):
                m.chunk = bytes(payload[start : start + len(c)])
                start += len(c)
    elif op == "empty_stream":
        return []
    return messages


def draw_fetch_request(draw: Draw, current: int, log: list[str]) -> bytes:
    have = draw(
        st.sampled_from([0, current, current, max(current - 1, 0), min(current + 1, UINT64_MAX)])
        | st.integers(0, UINT64_MAX)
    )
    return mangle(draw, parameters_pb2.FetchRequest(have_version=have).SerializeToString(), log, "fetch")


# --- oracles -------------------------------------------------------------------------------------------------------


def _parse(message_type, raw: bytes):
    try:
        return message_type.FromString(raw)
    except Exception:  # noqa: BLE001 (any parse failure: the message is not valid protobuf)
        return None


def expect_publish(before: StoreState, raw: list[bytes], outcome: Outcome, context: str) -> StoreState:
    """The state after a Publish call: unchanged unless it ended OK; then exactly what was sent, checked first
    against the contract, and the stored version is the one the answer names."""
    if outcome.code == REFUSED:
        first = _parse(parameters_pb2.PublishRequest, raw[0]) if raw else None
        assert first is not None and first.HasField("header"), (
            f"FAILED_PRECONDITION without a header: {context}"
        )
        version = first.header.version
        low, high = before.version + 1, min(before.version + MAX_VERSION_STEP, MAX_VERSION)
        assert not low <= (version or low) <= high, (
            f"version {version} refused after {before.version}: {context}"
        )
    if outcome.code != OK:
        return before
    state = published(before, raw, context)
    response = parameters_pb2.PublishResponse.FromString(outcome.responses[0])
    assert response.version == state.version, (
        f"stored version {response.version}, expected {state.version}: {context}"
    )
    return state


def published(before: StoreState, raw: list[bytes], context: str) -> StoreState:
    """The state after storing the stream `raw`, which must be a valid Publish stream by the contract."""
    messages = [_parse(parameters_pb2.PublishRequest, m) for m in raw]
    assert messages and all(m is not None for m in messages), f"published from bad messages: {context}"
    assert messages[0].HasField("header"), f"published without a header: {context}"
    assert not any(m.HasField("header") for m in messages[1:]), f"published with a late header: {context}"
    header = messages[0].header
    payload = b"".join(m.chunk for m in messages)
    assert len(payload) == header.total_bytes, (
        f"published {len(payload)} of {header.total_bytes} bytes: {context}"
    )
    names = [t.name for t in header.tensors]
    assert names and all(names) and len(set(names)) == len(names), f"published names {names}: {context}"
    spans = []
    for t in header.tensors:
        assert t.dtype in _ITEMSIZE, f"published dtype {t.dtype}: {context}"
        assert all(0 <= d <= MAX_DIM for d in t.shape), f"published shape {list(t.shape)}: {context}"
        assert t.nbytes == math.prod(t.shape) * _ITEMSIZE[t.dtype], f"published nbytes {t.nbytes}: {context}"
        assert t.offset + t.nbytes <= header.total_bytes, context
        if t.nbytes:
            spans.append((t.offset, t.offset + t.nbytes))
            if t.dtype == 12:
                assert max(payload[t.offset : t.offset + t.nbytes]) <= 1, (
                    f"published a BOOL byte > 1: {context}"
                )
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), f"published overlaps: {context}"
    assert sum(t.nbytes for t in header.tensors) == header.total_bytes, context
    version = header.version or before.version + 1
    assert before.version < version <= min(before.version + MAX_VERSION_STEP, MAX_VERSION), (
        f"published version {version} after {before.version}: {context}"
    )
    total = None if before.published_total is None else before.published_total + 1
    return StoreState(version, _layout(header), payload, total)


def check_fetch(state: StoreState, raw: bytes, outcome: Outcome, context: str) -> None:
    request = _parse(parameters_pb2.FetchRequest, raw)
    if outcome.code == INVALID:
        assert request is None, f"Fetch refused a valid request: {context}"
        return
    if outcome.code != OK:
        return
    assert request is not None, f"Fetch answered a message that does not parse: {context}"
    messages = [parameters_pb2.FetchResponse.FromString(r) for r in outcome.responses]
    assert messages, context
    if state.version in (0, request.have_version):
        assert len(messages) == 1 and messages[0].not_newer and not messages[0].chunk, context
        return
    first = messages[0]
    assert first.HasField("header") and first.header.version == state.version, context
    assert _layout(first.header) == state.layout and first.header.total_bytes == len(state.payload), context
    assert not any(m.HasField("header") or m.HasField("not_newer") for m in messages[1:]), context
    assert b"".join(m.chunk for m in messages) == state.payload, f"Fetch sent other bytes: {context}"


def check_get_version(state: StoreState, outcome: Outcome, context: str) -> None:
    if outcome.code == OK:
        version = parameters_pb2.GetVersionResponse.FromString(outcome.responses[0]).version
        assert version == state.version, f"GetVersion {version}, published {state.version}: {context}"

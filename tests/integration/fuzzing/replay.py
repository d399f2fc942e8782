"""The ReplayService under fuzzing: requests drawn from valid ones (built with replay_server/wire.py and the tensor
codec) and then mutated, the shard's state before and after a call, and the state each answer implies.

The oracle never asks the server what it should have done: from the shard's state before the call and the acks or
responses it sent, it predicts the state after (an accepted batch stored exactly as sent at the keys its ack
names, an applied update setting exactly the live keys it names, a rejected call changing nothing) and checks
every accepted request against the contract with its own numpy code (signature, priority range, key range).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from hypothesis import strategies as st

from apexrl.common import codec
from apexrl.common.signature import FieldSpec, Signature
from apexrl.proto import replay_pb2
from apexrl.replay_server import wire
from tests.integration.fuzzing.mutations import (
    SPECIAL_U64,
    Draw,
    chance,
    mangle,
    mutate_tensor,
    oversize_string_field,
    special_values,
)
from tests.integration.fuzzing.raw import Outcome

SERVICE = wire.SERVICE_NAME
SIGNATURE = Signature.parse(
    "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"
)
CAPACITY = 256
MAX_SAMPLE_BATCH = 4096
MAX_PRIORITY = 1e25
OK, INVALID, EXHAUSTED = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION

# What each RPC may end with here (replay.proto, minus what this setup rules out: no call may wait, no token, no
# shutdown; so DEADLINE_EXCEEDED, FAILED_PRECONDITION, UNAVAILABLE and UNAUTHENTICATED count as failures, as do
# INTERNAL and UNKNOWN). INVALID_ARGUMENT as a call's status also answers a message that does not parse.
ALLOWED = {
    "Insert": {OK, INVALID, EXHAUSTED},  # per-batch errors travel in acks; the stream ends OK
    "Sample": {OK, INVALID, EXHAUSTED},  # EXHAUSTED: the answer exceeds the shard's send limit
    "UpdatePriorities": {OK, INVALID, EXHAUSTED},
    "StreamUpdatePriorities": {OK, INVALID, EXHAUSTED},
    "Info": {OK, INVALID, EXHAUSTED},
    # A shard with a checkpoint directory writes one (OK); without one it answers FAILED_PRECONDITION.
    "Checkpoint": {OK, INVALID, EXHAUSTED},
    "Checkpoint without a directory": {PRECONDITION, INVALID, EXHAUSTED},
}
ALLOWED_ACK_CODES = {0, 3}  # OK, INVALID_ARGUMENT (4 and 14 need a rate limiter or a shutdown)


# --- requests ------------------------------------------------------------------------------------------------------


@dataclass
class Sequences:
    """Sequence numbers that mostly increase across examples, so most valid batches get stored."""

    last: int = 0

    def draw(self, draw: Draw, log: list[str]) -> int:
        kind = draw(st.sampled_from(["next", "next", "next", "same", "old", "zero", "max"]))
        if kind != "next":
            log.append(f"sequence:{kind}")
        if kind == "next":
            self.last += 1
            return self.last
        return {"same": self.last, "old": max(0, self.last - 5), "zero": 0, "max": 2**64 - 1}[kind]


def rows_of(draw: Draw, rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return {
        "obs": rng.standard_normal((rows, 4)).astype(np.float32),
        "action": rng.integers(0, 2, rows).astype(np.int64),
        "reward": rng.random(rows).astype(np.float32),
        "discount": np.full(rows, 0.99, np.float32),
        "next_obs": rng.standard_normal((rows, 4)).astype(np.float32),
    }


def draw_insert_request(draw: Draw, sequences: Sequences, log: list[str]) -> bytes:
    """A one-batch request, or (a quarter of the time) one merging 2-4 batches (InsertRequest.batch_rows)."""
    batch_rows: list[int] = []
    if chance(draw, 25):
        batch_rows = [
            draw(st.sampled_from([1, 1, 2, 3, 8, 16, CAPACITY])) for _ in range(draw(st.integers(2, 4)))
        ]
        log.append(f"insert:merged{batch_rows}")
    rows = sum(batch_rows) or draw(
        st.sampled_from([1, 1, 2, 3, 4, 8, 16, 32, CAPACITY - 1, CAPACITY, CAPACITY + 1])
    )
    columns = rows_of(draw, rows)
    if draw(st.booleans()):  # any column order is valid
        names = draw(st.permutations(list(columns)))
        columns = {name: columns[name] for name in names}
    kind = draw(st.sampled_from(["none", "none", "float64", "float32", "special"]))
    priorities = None
    if kind in ("float64", "float32"):
        priorities = np.random.default_rng(rows).uniform(0, 10, rows).astype(kind)
    elif kind == "special":
        dtype = draw(st.sampled_from([np.float32, np.float64]))
        wire_dtype = codec.dtype_to_wire(np.dtype(dtype))
        priorities = np.frombuffer(special_values(draw, wire_dtype, rows * np.dtype(dtype).itemsize), dtype)
    writer_id = draw(st.sampled_from(["", "w0", "w1", "w2"]) | st.text(max_size=24))
    request = wire.encode_insert(columns, priorities, writer_id, batch_rows)
    request.sequence = sequences.draw(draw, log)
    if batch_rows and request.sequence == sequences.last:  # the merged batches are numbered on from it
        sequences.last += len(batch_rows) - 1
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        _mutate_insert(draw, request, rows, log)
    return mangle(draw, request.SerializeToString(), log, "insert")


def _mutate_insert(draw: Draw, request: replay_pb2.InsertRequest, rows: int, log: list[str]) -> None:
    cols = request.batch.columns
    op = draw(
        st.sampled_from(
            [
                "column",
                "column",
                "drop_column",
                "duplicate_column",
                "rename_column",
                "extra_column",
                "ragged",
                "scalar_column",
                "clear_batch",
                "priorities",
                "empty_priorities",
                "clear_priorities",
                "writer_id",
                "batch_rows",
            ]
        )
    )
    if op == "column" and cols:
        col = cols[draw(st.integers(0, len(cols) - 1))]
        mutate_tensor(draw, col.tensor, log, f"column {col.name}")
        return
    log.append(f"insert:{op}")
    if op == "drop_column" and cols:
        del cols[draw(st.integers(0, len(cols) - 1))]
    elif op == "duplicate_column" and cols:
        cols.add().CopyFrom(cols[draw(st.integers(0, len(cols) - 1))])
    elif op == "rename_column" and cols:
        cols[draw(st.integers(0, len(cols) - 1))].name = draw(
            st.sampled_from(["", "unknown", "obs", "action", "obs ", "Obs", "obs\x00", "ÖBS"])
        )
    elif op == "extra_column":
        col = cols.add(name=draw(st.sampled_from(["extra", "obs"])))
        codec.encode_tensor(np.zeros(rows, np.float32), col.tensor)
    elif op == "ragged" and cols:
        col = cols[draw(st.integers(0, len(cols) - 1))]
        spec = next((f for f in SIGNATURE.fields if f.name == col.name), SIGNATURE.fields[0])
        other = max(0, rows + draw(st.sampled_from([-1, 1, 5])))
        codec.encode_tensor(np.zeros((other, *spec.shape), spec.dtype), col.tensor)
    elif op == "scalar_column" and cols:
        col = cols[draw(st.integers(0, len(cols) - 1))]
        col.tensor.shape[:] = []
        col.tensor.data = col.tensor.data[:8]
    elif op == "clear_batch":
        request.ClearField("batch")
    elif op == "priorities":
        if not request.HasField("priorities"):
            codec.encode_tensor(np.ones(rows), request.priorities)
        mutate_tensor(draw, request.priorities, log, "priorities")
    elif op == "empty_priorities":  # present but empty: INVALID_ARGUMENT (dtype unspecified)
        request.priorities.Clear()
        request.priorities.SetInParent()
    elif op == "clear_priorities":
        request.ClearField("priorities")
    elif op == "writer_id":
        request.writer_id = draw(st.text(min_size=100, max_size=2000))
    elif op == "batch_rows":  # boundaries that do not fit the rows, a zero entry, too many, or none
        kind = draw(st.sampled_from(["bump", "zero", "append", "split", "clear", "too_many"]))
        log.append(f"insert:batch_rows-{kind}")
        entries = list(request.batch_rows) or [rows]
        if kind == "bump":
            entries[-1] += draw(st.sampled_from([-1, 1]))
        elif kind == "zero":
            entries.insert(draw(st.integers(0, len(entries))), 0)
        elif kind == "append":
            entries.append(1)
        elif kind == "split" and entries[0] > 1:  # still fits: one more batch
            entries[:1] = [1, entries[0] - 1]
        elif kind == "too_many":
            entries = [1] * (wire.MAX_MERGED_BATCHES + 1)
        request.batch_rows[:] = [] if kind == "clear" else [max(0, e) for e in entries]


def draw_insert_stream(
    draw: Draw, sequences: Sequences, limit: int, log: list[str]
) -> tuple[list[bytes], bool]:
    """Zero to three InsertRequests for one stream; rarely, a first message over the shard's size limit (then
    nothing after it is processed, so every ack that comes back is for a known request)."""
    requests = [
        draw_insert_request(draw, sequences, log) for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3])))
    ]
    oversize = chance(draw, 4)
    if oversize:
        log.append("insert:oversize-first")
        requests.insert(0, oversize_string_field(1, limit + 1))  # writer_id of limit + 1 bytes
    return requests, oversize


def draw_sample_request(draw: Draw, limit: int, log: list[str]) -> tuple[bytes, bool]:
    batch_size = draw(
        st.sampled_from(
            [
                0,
                1,
                2,
                7,
                64,
                256,
                1024,
                2048,
                MAX_SAMPLE_BATCH - 1,
                MAX_SAMPLE_BATCH,
                MAX_SAMPLE_BATCH + 1,
                2**31,
                2**32 - 1,
            ]
        )
        | st.integers(1, MAX_SAMPLE_BATCH)
    )
    request = replay_pb2.SampleRequest(batch_size=batch_size, no_wait=draw(st.booleans()))
    if chance(draw, 3):  # several batches per answer: batch_rows summing to batch_size, or not, or with a 0
        log.append("sample:batch_rows")
        cuts = sorted(draw(st.lists(st.integers(0, batch_size), max_size=4)))
        rows = [b - a for a, b in zip([0, *cuts], [*cuts, batch_size], strict=True)]
        request.batch_rows.extend(draw(st.sampled_from([rows, rows + [1], [0, *rows], [2**32 - 1]])))
    if chance(draw, 4):
        log.append("sample:oversize")
        return request.SerializeToString() + oversize_string_field(14, limit), True
    return mangle(draw, request.SerializeToString(), log, "sample"), False


def draw_update_request(draw: Draw, view: ShardState, log: list[str]) -> bytes:
    lo, hi = view.info["inserted_total"] - view.info["size"], view.info["inserted_total"]
    keys: list[int] = []
    for _ in range(draw(st.sampled_from([0, 1, 2, 3, 8, 64]))):
        kind = draw(st.sampled_from(["live", "live", "live", "stale", "future", "huge", "repeat"]))
        if kind == "live" and hi > lo:
            keys.append(draw(st.integers(lo, hi - 1)))
        elif kind == "stale" and lo > 0:
            keys.append(draw(st.integers(0, lo - 1)))
        elif kind == "repeat" and keys:
            keys.append(keys[-1])
        elif kind == "future":
            keys.append(hi + draw(st.integers(0, 1000)))
        else:
            keys.append(draw(st.sampled_from(SPECIAL_U64)))
    key_dtype = draw(st.sampled_from([np.uint64, np.uint64, np.int64]))
    key_array = np.array(keys, dtype=np.uint64).view(key_dtype) if keys else np.zeros(0, key_dtype)
    prio_dtype = draw(st.sampled_from([np.float64, np.float64, np.float32]))
    rng = np.random.default_rng(len(keys))
    priorities = rng.uniform(0, 10, len(keys)).astype(prio_dtype)
    if keys and chance(draw, 25):
        log.append("update:special-priorities")
        priorities = np.frombuffer(
            special_values(draw, codec.dtype_to_wire(np.dtype(prio_dtype)), priorities.nbytes), prio_dtype
        )
    incarnation = view.info["incarnation"]
    choice = draw(st.sampled_from(["zero", "zero", "current", "current", "other", "max"]))
    if choice != "zero" and choice != "current":
        log.append(f"update:incarnation-{choice}")
    request = replay_pb2.UpdatePrioritiesRequest(
        incarnation={"zero": 0, "current": incarnation, "other": incarnation ^ 1, "max": 2**64 - 1}[choice]
    )
    codec.encode_tensor(key_array, request.keys)
    codec.encode_tensor(priorities, request.priorities)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        op = draw(
            st.sampled_from(
                [
                    "keys",
                    "priorities",
                    "priorities",
                    "shape_mismatch",
                    "two_d",
                    "clear_keys",
                    "clear_priorities",
                ]
            )
        )
        if op in ("keys", "priorities"):
            mutate_tensor(draw, getattr(request, op), log, op)
            continue
        log.append(f"update:{op}")
        if op == "shape_mismatch":
            request.priorities.shape[:] = [max(0, len(keys) + draw(st.sampled_from([-1, 1])))]
        elif op == "two_d":
            request.keys.shape[:] = [len(keys), 1]
            request.priorities.shape[:] = [len(keys), 1]
        else:
            request.ClearField(op.removeprefix("clear_"))
    return mangle(draw, request.SerializeToString(), log, "update")


def draw_info_request(draw: Draw, log: list[str]) -> bytes:
    return mangle(draw, b"", log, "info", probability=70)


def draw_checkpoint_request(draw: Draw, limit: int, log: list[str]) -> tuple[bytes, bool]:
    """CheckpointRequest is empty: mangled bytes (some parse, with unknown fields), or one over the size limit."""
    if chance(draw, 4):
        log.append("checkpoint:oversize")
        return oversize_string_field(15, limit), True  # an unknown field: valid, too large
    return mangle(draw, b"", log, "checkpoint", probability=70), False


# --- state ---------------------------------------------------------------------------------------------------------

# InfoResponse fields an oracle can predict exactly (the float sums are checked against the leaves instead).
_COUNTED = (
    "size",
    "inserted_total",
    "evicted_total",
    "inserted_bytes_total",
    "updated_total",
    "stale_updates_total",
    "duplicate_batches_total",
    "sampled_total",
)


@dataclass
class ShardState:
    """What a shard holds: its Info scalars, and for an in-process shard the exact table (every column, every
    sum-tree leaf, every writer's last stored sequence)."""

    info: dict[str, object]
    storage: dict[str, np.ndarray] | None = None
    leaves: np.ndarray | None = None
    writers: dict[str, int] | None = None
    changed: bool = field(default=False, compare=False)  # set by the oracle when accepted calls changed data

    @property
    def exact(self) -> bool:
        return self.storage is not None


def info_scalars(response: replay_pb2.InfoResponse) -> dict[str, object]:
    return {
        f.name: getattr(response, f.name)
        for f in replay_pb2.InfoResponse.DESCRIPTOR.fields
        if f.name != "signature"
    }


def exact_state(table) -> ShardState:
    """Copy an in-process ReplayTable's contents (reads the table's internals under its lock; nothing else runs)."""
    with table._lock:
        storage = {name: array.copy() for name, array in table._storage.items()}
        leaves = table._tree.get(np.arange(table.config.capacity))
        writers = dict(table._writers)
    return ShardState(info_scalars(wire.encode_info(table.info())), storage, leaves, writers)


def assert_state(actual: ShardState, expected: ShardState, context: str) -> None:
    """The shard holds what the oracle expects: exactly the same when nothing was accepted."""
    for name, want in expected.info.items():
        got = actual.info[name]
        if name in ("total_priority", "min_priority") and expected.changed:
            if expected.exact:  # recomputed from the expected leaves
                positive = expected.leaves[expected.leaves > 0]
                want = (
                    float(expected.leaves.sum())
                    if name == "total_priority"
                    else (float(positive.min()) if positive.size else 0.0)
                )
                assert got == pytest.approx(want, rel=1e-9, abs=1e-300), f"{name}: {got} != {want}; {context}"
            continue
        assert got == want, f"Info.{name} is {got}, expected {want}; {context}"
    if expected.exact:
        for name, column in expected.storage.items():
            assert np.array_equal(actual.storage[name], column), f"column {name} differs; {context}"
        assert np.array_equal(actual.leaves, expected.leaves), (
            f"priorities differ at slots {np.flatnonzero(actual.leaves != expected.leaves)[:10]}; {context}"
        )
        assert actual.writers == expected.writers, f"writers differ; {context}"


# --- oracles -------------------------------------------------------------------------------------------------------


def _parse(message_type, raw: bytes):
    try:
        return message_type.FromString(raw)
    except Exception:  # noqa: BLE001 (any parse failure: the message is not valid protobuf)
        return None


def _valid_priorities(p: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(p) & (p >= 0) & (p <= MAX_PRIORITY)))


def answered_batches(
    requests: list[bytes], acks: list[replay_pb2.InsertAck], context: str
) -> tuple[list[tuple[replay_pb2.InsertRequest, int, replay_pb2.InsertAck]], int]:
    """Pair each ack with the batches it answers, in order: (request, index of its first batch answered, ack). A
    one-batch request gets exactly one ack; a merged one (batch_rows) acks that cover consecutive runs of its
    batches, each naming the last one. Also returns how many requests were answered completely."""
    pairs, r, b = [], 0, 0
    for ack in acks:
        assert r < len(requests), f"an ack beyond the last batch: {context}"
        request = _parse(replay_pb2.InsertRequest, requests[r])
        assert request is not None, f"acked a message that does not parse: {context}"
        batches = len(request.batch_rows) or 1
        assert 1 <= ack.batches <= batches - b, (
            f"ack answers {ack.batches} of {batches - b} batches: {context}"
        )
        assert ack.sequence == min(request.sequence + b + ack.batches - 1, 2**64 - 1), (
            f"ack sequence {ack.sequence} for batches {b}..{b + ack.batches - 1} from {request.sequence}: {context}"
        )
        pairs.append((request, b, ack))
        b += ack.batches
        if b == batches:
            r, b = r + 1, 0
    assert b == 0, f"a merged request was answered only in part: {context}"
    return pairs, r


def batch_of(request: replay_pb2.InsertRequest, index: int, context: str) -> replay_pb2.InsertRequest:
    """Batch `index` of a merged request as the one-batch request it stands for (its rows of every tensor)."""
    if not request.batch_rows:
        return request
    lo = sum(request.batch_rows[:index])
    hi = lo + request.batch_rows[index]
    batch = replay_pb2.InsertRequest(writer_id=request.writer_id, sequence=request.sequence + index)

    def rows(tensor, out, what: str) -> None:
        shape = list(tensor.shape)
        assert shape and shape[0] == sum(request.batch_rows), (
            f"stored a merged {what} of shape {shape}: {context}"
        )
        row_bytes = math.prod(shape[1:]) * codec.dtype_from_wire(tensor.dtype).itemsize
        assert len(tensor.data) == shape[0] * row_bytes, f"stored a merged {what} of bad length: {context}"
        out.dtype = tensor.dtype
        out.shape[:] = [hi - lo, *shape[1:]]
        out.data = tensor.data[lo * row_bytes : hi * row_bytes]

    for column in request.batch.columns:
        rows(column.tensor, batch.batch.columns.add(name=column.name).tensor, f"column {column.name!r}")
    if request.HasField("priorities"):
        rows(request.priorities, batch.priorities, "priorities")
    return batch


def expect_insert(
    before: ShardState,
    requests: list[bytes],
    outcome: Outcome,
    oversize: bool,
    acks: list[replay_pb2.InsertAck],
    context: str,
) -> ShardState:
    """The state after an Insert stream whose acks say what was stored; checks every ack on the way."""
    state = copy.deepcopy(before)
    info = state.info
    if oversize:
        assert outcome.code == EXHAUSTED and not acks, f"oversize first message: {context}"
        return state
    pairs, complete = answered_batches(requests, acks, context)
    if outcome.code == OK:
        assert complete == len(requests), f"{complete} of {len(requests)} requests answered: {context}"
    elif outcome.code == INVALID:  # a message that does not parse ends the stream; those before were acked
        assert _parse(replay_pb2.InsertRequest, requests[complete]) is None, (
            f"stream ended INVALID_ARGUMENT at a parseable request: {context}"
        )
    for request, first, ack in pairs:
        assert ack.error_code in ALLOWED_ACK_CODES, f"ack error_code {ack.error_code}: {context}"
        assert ack.incarnation == info["incarnation"], context
        if ack.error_code or ack.duplicate:
            assert (ack.rows, ack.first_key) == (0, 0), context
            assert not (ack.error_code and ack.duplicate), context
            if ack.duplicate:
                info["duplicate_batches_total"] += ack.batches
                assert request.writer_id, f"duplicate without a writer id: {context}"
                if state.exact:
                    last = request.sequence + first + ack.batches - 1
                    assert state.writers.get(request.writer_id, -1) >= last, context
            continue
        key, rows = ack.first_key, 0
        for index in range(first, first + ack.batches):  # stored one after the other, at consecutive keys
            batch = batch_of(request, index, context)
            stored = batch.batch.columns[0].tensor.shape[0] if batch.batch.columns else 0
            _store(state, batch, replay_pb2.InsertAck(first_key=key, rows=stored), context)
            key, rows = key + stored, rows + stored
        assert ack.rows == rows, f"ack says {ack.rows} rows stored, its batches hold {rows}: {context}"
    return state


def _store(
    state: ShardState, request: replay_pb2.InsertRequest, ack: replay_pb2.InsertAck, context: str
) -> None:
    """Check that a stored batch obeys the contract, and apply it to `state`."""
    info = state.info
    columns = {c.name: c.tensor for c in request.batch.columns}
    assert len(columns) == len(request.batch.columns), f"stored a batch with duplicate columns: {context}"
    assert set(columns) == set(SIGNATURE.names), f"stored columns {sorted(columns)}: {context}"
    arrays = {}
    for spec in SIGNATURE.fields:
        tensor = columns[spec.name]
        assert tensor.dtype == codec.dtype_to_wire(spec.dtype), (
            f"stored {spec.name} dtype {tensor.dtype}: {context}"
        )
        shape = tuple(tensor.shape)
        assert len(shape) >= 1 and shape[1:] == spec.shape, f"stored {spec.name} {shape}: {context}"
        assert len(tensor.data) == math.prod(shape) * spec.dtype.itemsize, (
            f"stored {spec.name} bytes: {context}"
        )
        arrays[spec.name] = np.frombuffer(tensor.data, spec.dtype).reshape(shape)
    rows = {a.shape[0] for a in arrays.values()}
    assert len(rows) == 1, f"stored a ragged batch: {context}"
    rows = rows.pop()
    assert 1 <= rows <= CAPACITY and ack.rows == rows, f"stored {ack.rows} of {rows} rows: {context}"
    assert ack.first_key == info["inserted_total"], f"first_key {ack.first_key}: {context}"
    if request.writer_id and state.exact:
        assert state.writers.get(request.writer_id, -1) < request.sequence, (
            f"stored a resent batch: {context}"
        )
        state.writers[request.writer_id] = request.sequence
    priorities = None
    if request.HasField("priorities"):
        p = request.priorities
        dtype = {1: np.float32, 2: np.float64}.get(p.dtype)
        assert dtype is not None and list(p.shape) == [rows], (
            f"stored priorities {p.dtype}{p.shape}: {context}"
        )
        assert len(p.data) == rows * np.dtype(dtype).itemsize, f"stored priorities bytes: {context}"
        priorities = np.frombuffer(p.data, dtype).astype(np.float64)
        assert _valid_priorities(priorities), f"stored priorities {priorities}: {context}"
    if state.exact:
        slots = (ack.first_key + np.arange(rows)) % CAPACITY
        for name, array in arrays.items():
            state.storage[name][slots] = array
        state.leaves[slots] = priorities if priorities is not None else info["max_priority"]  # alpha is 1
    if priorities is not None:
        info["max_priority"] = max(info["max_priority"], float(priorities.max()))
    info["evicted_total"] += max(0, info["size"] + rows - CAPACITY)
    info["size"] = min(CAPACITY, info["size"] + rows)
    info["inserted_total"] += rows
    info["inserted_bytes_total"] += rows * SIGNATURE.row_nbytes
    info["stored_bytes"] = info["size"] * SIGNATURE.row_nbytes
    state.changed = True


def expect_sample(
    before: ShardState, raw: bytes, oversize: bool, outcome: Outcome, context: str
) -> ShardState:
    state = copy.deepcopy(before)
    request = None if oversize else _parse(replay_pb2.SampleRequest, raw)
    if outcome.code == INVALID:
        assert request is None or not _valid_sample_request(request), context
        return state
    if outcome.code == EXHAUSTED:  # the request was too large, or the answer was (its rows count as sampled)
        if not oversize:
            state.info["sampled_total"] += request.batch_size
        return state
    assert request is not None and _valid_sample_request(request), f"sampled: {context}"
    n = request.batch_size
    state.info["sampled_total"] += n
    response = replay_pb2.SampleResponse.FromString(outcome.responses[0])
    assert list(response.batch_rows) == list(request.batch_rows), (
        f"batch_rows {response.batch_rows}: {context}"
    )
    keys = codec.decode_tensor(response.keys).astype(np.int64)
    priorities = codec.decode_tensor(response.priorities)
    columns = codec.decode_batch(response.batch)
    assert keys.shape == (n,) and priorities.shape == (n,) and list(columns) == list(SIGNATURE.names), context
    info = state.info
    assert (response.size, response.incarnation) == (info["size"], info["incarnation"]), context
    assert np.all((keys >= info["inserted_total"] - info["size"]) & (keys < info["inserted_total"])), context
    if state.exact:
        slots = keys % CAPACITY
        assert np.array_equal(priorities, state.leaves[slots]), f"sampled priorities: {context}"
        assert response.total_priority == info["total_priority"], context
        for name, array in columns.items():
            assert np.array_equal(array, state.storage[name][slots]), f"sampled {name}: {context}"
    return state


def _valid_sample_request(request: replay_pb2.SampleRequest) -> bool:
    """A batch_size in range and, when batches are asked for, each >= 1 and summing to it (replay.proto)."""
    rows = list(request.batch_rows)
    return 1 <= request.batch_size <= MAX_SAMPLE_BATCH and (
        not rows or (min(rows) >= 1 and sum(rows) == request.batch_size)
    )


def expect_updates(
    before: ShardState, requests: list[bytes], outcome: Outcome, oversize: bool, context: str
) -> ShardState:
    """The state after UpdatePriorities (one request) or StreamUpdatePriorities: each response answers the
    request at its position, applied whole; the call's status answers the first request not answered."""
    state = copy.deepcopy(before)
    info = state.info
    assert len(outcome.responses) <= len(requests), context
    if oversize:
        assert outcome.code == EXHAUSTED, context
    if outcome.code == OK:
        assert len(outcome.responses) == len(requests), context
    for raw, raw_response in zip(requests, outcome.responses, strict=False):
        request = _parse(replay_pb2.UpdatePrioritiesRequest, raw)
        assert request is not None, f"answered a message that does not parse: {context}"
        keys = codec.decode_tensor(request.keys, "keys")
        priorities = codec.decode_tensor(request.priorities, "priorities")
        assert keys.ndim == 1 and keys.dtype in (np.uint64, np.int64), (
            f"applied keys {keys.dtype}{keys.shape}"
        )
        assert priorities.dtype in (np.float32, np.float64) and priorities.shape == keys.shape, context
        p = priorities.astype(np.float64)
        assert _valid_priorities(p), f"applied priorities {p}: {context}"
        lo, hi = info["inserted_total"] - info["size"], info["inserted_total"]
        current = request.incarnation in (0, info["incarnation"])
        live = [current and lo <= int(k) < hi for k in keys]
        for k, value, ok in zip(keys, p, live, strict=True):
            if ok and state.exact:
                state.leaves[int(k) % CAPACITY] = value  # alpha is 1; the last entry for a key wins
        applied = sum(live)
        if applied:
            info["max_priority"] = max(info["max_priority"], float(p[live].max()))
            state.changed = True
        info["updated_total"] += applied
        info["stale_updates_total"] += len(keys) - applied
        response = replay_pb2.UpdatePrioritiesResponse.FromString(raw_response)
        assert (response.applied, response.stale) == (applied, len(keys) - applied), f"{response}: {context}"
        assert (response.size, response.incarnation) == (info["size"], info["incarnation"]), context
    return state


def expect_info(before: ShardState, outcome: Outcome, context: str) -> ShardState:
    if outcome.code == OK:
        response = replay_pb2.InfoResponse.FromString(outcome.responses[0])
        got = info_scalars(response)
        for name in (*_COUNTED, "incarnation", "capacity", "max_priority", "total_priority", "min_priority"):
            assert got[name] == before.info[name], (
                f"Info.{name} {got[name]} != {before.info[name]}: {context}"
            )
        assert codec.decode_signature(response.signature) == SIGNATURE, context
    return copy.deepcopy(before)


def expect_checkpoint(
    before: ShardState, raw: bytes, oversize: bool, outcome: Outcome, directory: bool, context: str
) -> ShardState:
    """A Checkpoint changes nothing the shard holds; an OK answer describes the table as it was (its rows, keys and
    incarnation) in a file it names; FAILED_PRECONDITION only on a shard without a checkpoint directory."""
    request = None if oversize else _parse(replay_pb2.CheckpointRequest, raw)
    if oversize:
        assert outcome.code == EXHAUSTED, context
    elif request is None:
        assert outcome.code == INVALID, f"a message that does not parse: {context}"
    elif not directory:
        assert outcome.code == PRECONDITION and "checkpoint directory" in outcome.details, context
    else:
        assert outcome.code == OK, context
        response = replay_pb2.CheckpointResponse.FromString(outcome.responses[0])
        info = before.info
        assert (response.rows, response.inserted_total, response.incarnation) == (
            info["size"],
            info["inserted_total"],
            info["incarnation"],
        ), f"{response}: {context}"
        assert response.bytes > 0 and response.path.endswith(".apexrl"), f"{response}: {context}"
    return copy.deepcopy(before)


# --- a fresh shard: the first stored batch fixes the signature ------------------------------------------------------

_ROW_SHAPES = (
    (),
    (),
    (4,),
    (2, 3),
    (0,),
    (1,) * 62,
    (1,) * 63,
    (3, 0, 2**31),
    (2**31, 0),
    (0, 2**31, 2**31),
    (2**31, 2**20, 0),
    (2**31, 2**25, 0),
    (2**31, 2**31, 0),
)
_WIRE_DTYPES = (
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


def draw_first_batch(draw: Draw, sequences: Sequences, log: list[str]) -> bytes:
    """An InsertRequest of 1-3 columns of any wire dtype and a per-row shape that is ordinary, empty, of rank at
    numpy's limit, or empty with other dimensions up to 2**31 (what a shard without a declared signature must
    either adopt or refuse)."""
    rows = draw(st.sampled_from([1, 2, 5, CAPACITY, CAPACITY + 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    request = replay_pb2.InsertRequest(
        writer_id=draw(st.sampled_from(["", "w0"])), sequence=sequences.draw(draw, log)
    )
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["obs", "a", "é", "obs", ""]))
        dtype = np.dtype(draw(st.sampled_from(_WIRE_DTYPES)))
        shape = draw(st.sampled_from(_ROW_SHAPES))
        log.append(f"column {name!r}:{dtype.name}{list(shape)[:4]}{'...' if len(shape) > 4 else ''}")
        column = request.batch.columns.add(name=name)
        column.tensor.dtype = codec.dtype_to_wire(dtype)
        column.tensor.shape[:] = [rows, *shape]
        count = math.prod((rows, *shape))
        column.tensor.data = (
            (rng.integers(0, 2, count) if dtype == np.bool_ else rng.integers(0, 100, count))
            .astype(dtype)
            .tobytes()
        )
    if chance(draw, 20):
        columns = request.batch.columns
        mutate_tensor(draw, columns[draw(st.integers(0, len(columns) - 1))].tensor, log, "column")
    return mangle(draw, request.SerializeToString(), log, "first", probability=10)


def signature_of(request: replay_pb2.InsertRequest) -> Signature:
    """The signature a stored batch implies: its columns in order, each with its dtype and per-row shape."""
    return Signature(
        tuple(
            FieldSpec(c.name, codec.dtype_from_wire(c.tensor.dtype), tuple(c.tensor.shape[1:]))
            for c in request.batch.columns
        )
    )


def expect_first_inserts(
    requests: list[bytes], acks: list[replay_pb2.InsertAck], context: str
) -> tuple[Signature | None, int]:
    """The signature fixed by the first stored batch (None when none was stored) and the rows stored; every later
    stored batch must match it."""
    signature, stored = None, 0
    for merged, first, ack in answered_batches(requests, acks, context)[0]:
        assert ack.error_code in ALLOWED_ACK_CODES, f"ack error_code {ack.error_code}: {context}"
        if ack.error_code or ack.duplicate:
            continue
        assert ack.first_key == stored, context
        rows_acked = stored
        for index in range(first, first + ack.batches):  # a mangled request may have become a merged one
            request = batch_of(merged, index, context)
            signature, stored = _first_stored(request, signature, stored, context)
        assert ack.rows == stored - rows_acked, context
    return signature, stored


def _first_stored(
    request: replay_pb2.InsertRequest, signature: Signature | None, stored: int, context: str
) -> tuple[Signature | None, int]:
    """One stored batch of a shard without a declared signature: it fixes the signature or matches it."""
    implied = signature_of(request)
    rows = request.batch.columns[0].tensor.shape[0]
    assert all(c.tensor.shape[0] == rows for c in request.batch.columns), f"stored a ragged batch: {context}"
    assert 1 <= rows <= CAPACITY, context
    if signature is None:
        signature = implied
    else:
        assert {(f.name, f.dtype, f.shape) for f in implied.fields} == {
            (f.name, f.dtype, f.shape) for f in signature.fields
        }, f"stored {implied} into {signature}: {context}"
    return signature, stored + rows

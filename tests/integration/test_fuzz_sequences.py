"""Hostile input to a sequence table (issue 30 item 2): Insert requests carrying sequence items, built valid from a
model of one writer's three trajectories and then mutated in the new fields (items.end, items.length, their counts,
the item columns' tensors and names, item priorities, the trajectory, merged batch_rows beside items, row
priorities, an empty writer id, two items at one start), and a third of the time damaged as bytes (truncated,
bits flipped, bytes inserted, repeated, garbage appended). Over a real socket to a shard in this process.

Oracle: an identical table fed directly (ReplayTable.insert) with what the shard acknowledged. A refused request
(ack error_code 3, or the stream ending INVALID_ARGUMENT / RESOURCE_EXHAUSTED) must leave the shard exactly as it
was; an accepted one must leave it exactly as the oracle is after the same insert: every step column, every link,
item length and item field, every sum-tree leaf (a snapshot of each, compared byte for byte) and the Info counters.
Every sample drawn afterwards answers whole windows. Reproducible: the examples come from a seeded generator
(not hypothesis: the requests depend on what the shard holds, which hypothesis's replay of its choices cannot
follow), and a failure names the mutations it applied.
"""

from __future__ import annotations

import hashlib

import grpc
import numpy as np
import pytest

from apexrl.common import codec
from apexrl.common.errors import ApexError
from apexrl.common.signature import Signature
from apexrl.proto import replay_pb2
from apexrl.replay_server import wire
from apexrl.replay_server.core.item_batch import ItemBatch
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.durability.snapshot import Snapshot
from apexrl.replay_server.server.service import create_replay_server
from tests.integration.fuzzing.raw import RawClient

pytestmark = pytest.mark.slow

EXAMPLES = 1500
WINDOW = 6
STEP = Signature.parse("obs:float32[2],action:int64[]")
STATE = Signature.parse("state:float32[3]")
LIMIT = 256 * 1024


def config() -> TableConfig:
    return TableConfig(
        capacity=400, max_sequence_length=WINDOW, signature=STEP, item_signature=STATE, seed=0, alpha=0.8
    )


class Model:
    """The writer as the shard has acknowledged it: steps per trajectory and the last sequence number. A damaged
    request may store a huge sequence number (every later batch would be a duplicate): then a new writer starts."""

    def __init__(self) -> None:
        self.writer = 0
        self.fresh()

    def fresh(self) -> None:
        self.writer += 1
        self.writer_id = f"writer-{self.writer}"
        self.steps: dict[int, int] = {0: 0, 1: 0, 2: 0}
        self.sequence = 0


@pytest.fixture(scope="module")
def shard():
    table = ReplayTable(config())
    made = create_replay_server(table, "127.0.0.1:0", max_message_bytes=LIMIT)
    raw = RawClient(f"127.0.0.1:{made.port}", wire.SERVICE_NAME)
    yield table, raw, ReplayTable(config()), Model()
    raw.close()
    table.close()
    made.server.stop(0)


def fingerprint(table: ReplayTable) -> tuple:
    """Every stored byte of the table (columns, sequence columns, leaves) and its counters."""
    digest = hashlib.sha256()
    try:
        snapshot = Snapshot.take(table, 64)
    except ApexError:  # nothing stored yet
        return (table.info(),)
    with snapshot:
        for slot, columns, leaves in snapshot.chunks():
            digest.update(str(slot).encode())
            for name, column in columns.items():
                digest.update(name.encode())
                values = (
                    column.tolist() if column.dtype == object else [np.ascontiguousarray(column).tobytes()]
                )
                for value in values:
                    digest.update(
                        b"-" if value is None else value if isinstance(value, bytes) else repr(value).encode()
                    )
            digest.update(np.ascontiguousarray(leaves).tobytes())
    info = table.info()
    return digest.hexdigest(), info.size, info.steps, info.inserted_total, info.items_inserted_total


def draw_request(rng: np.random.Generator, model: Model, log: list[str]) -> replay_pb2.InsertRequest:
    """A valid request of 1-4 steps of one trajectory with the windows that end in them, before mutations."""
    if model.sequence >= 1 << 62:
        model.fresh()
    trajectory = int(rng.integers(0, 3))
    rows = int(rng.integers(1, 5))
    first = model.steps[trajectory]
    values = 1000 * trajectory + np.arange(first, first + rows, dtype=np.float32)
    ends = [end for end in range(1, rows + 1) if (first + end) % 2 == 0]  # a window every 2 steps
    lengths = [min(WINDOW, first + end) for end in ends]
    items = None
    if ends:
        starts = [1000 * trajectory + first + end - length for end, length in zip(ends, lengths, strict=True)]
        items = ItemBatch(
            np.array(ends, dtype=np.int64),
            np.array(lengths, dtype=np.int64),
            {"state": np.stack([np.full(3, start, np.float32) for start in starts])},
            1.0 + rng.integers(0, 6, len(ends)).astype(np.float64),
        )
    steps = {"obs": np.stack([values, -values], axis=1), "action": values.astype(np.int64)}
    request = wire.encode_insert(steps, None, model.writer_id, items=items, trajectory=trajectory)
    request.sequence = model.sequence + 1
    log.append(
        f"trajectory {trajectory}, steps {first}..{first + rows - 1}, items {list(zip(ends, lengths, strict=True))}"
    )
    return request


OPS = (
    "end",
    "length",
    "drop_end",
    "add_item",
    "state_tensor",
    "state_name",
    "extra_column",
    "priorities_tensor",
    "trajectory",
    "batch_rows",
    "row_priorities",
    "no_writer",
    "same_start",
    "clear_items",
)


def mutate(rng: np.random.Generator, request: replay_pb2.InsertRequest, log: list[str]) -> None:
    """0-2 mutations of the sequence fields (each named in `log`)."""
    items = request.items
    for _ in range(int(rng.integers(0, 3))):
        op = OPS[int(rng.integers(len(OPS)))]
        log.append(op)
        count = len(items.end)
        if op == "end" and count:
            items.end[int(rng.integers(count))] = pick(rng, [0, 5, 2**32 - 1, 1])
        elif op == "length" and len(items.length):
            items.length[int(rng.integers(len(items.length)))] = int(
                rng.choice([0, WINDOW + 1, 2**16, 2**32 - 1, 1])
            )
        elif op == "drop_end" and count:
            del items.end[-1]
        elif op == "add_item":
            items.end.append(1)
            items.length.append(int(rng.integers(1, WINDOW + 1)))
        elif op == "state_tensor" and items.columns.columns:
            mutate_tensor(rng, items.columns.columns[0].tensor, log)
        elif op == "state_name" and items.columns.columns:
            items.columns.columns[0].name = pick(rng, ["", "State", "obs", "@item_fields"])
        elif op == "extra_column":
            codec.encode_batch({"extra": np.zeros(count, np.float32)}, items.columns)
        elif op == "priorities_tensor" and items.HasField("priorities"):
            mutate_tensor(rng, items.priorities, log)
        elif op == "trajectory":
            request.trajectory = pick(rng, [3, 2**63, 2**64 - 1])
        elif op == "batch_rows":
            request.batch_rows.append(request.batch.columns[0].tensor.shape[0])
        elif op == "row_priorities":
            codec.encode_tensor(
                np.ones(request.batch.columns[0].tensor.shape[0], np.float32), request.priorities
            )
        elif op == "no_writer":
            request.writer_id = ""
        elif op == "same_start" and count and len(items.length):
            items.end.append(items.end[0])
            items.length.append(items.length[0])
        elif op == "clear_items":
            request.ClearField("items")


def pick(rng: np.random.Generator, choices: list):
    """One of `choices`, as it is (numpy's choice would turn large ints into floats)."""
    return choices[int(rng.integers(len(choices)))]


def mutate_tensor(rng: np.random.Generator, tensor, log: list[str]) -> None:
    """One change to a tensor: its dtype, a dimension, its rank, its data's length or values, or cleared."""
    op = str(rng.choice(["dtype", "dim", "rank", "truncate", "extend", "nan", "clear"]))
    log.append(f"tensor:{op}")
    if op == "dtype":
        tensor.dtype = int(rng.integers(0, 20))
    elif op == "dim" and tensor.shape:
        tensor.shape[int(rng.integers(len(tensor.shape)))] = pick(rng, [0, 2, 7, 2**31, 2**63 - 1])
    elif op == "rank":
        tensor.shape.extend([1] * pick(rng, [1, 40, 70]))
    elif op == "truncate":
        tensor.data = tensor.data[: int(rng.integers(0, max(1, len(tensor.data))))]
    elif op == "extend":
        tensor.data += bytes(pick(rng, [1, 4, 8]))
    elif op == "nan":
        tensor.data = (
            np.full(len(tensor.data) // 8, np.nan).tobytes() + tensor.data[len(tensor.data) // 8 * 8 :]
        )
    else:
        tensor.Clear()


def damage(rng: np.random.Generator, raw: bytes, log: list[str]) -> bytes:
    """Serialized bytes damaged: truncated, bits flipped, bytes inserted, repeated, or garbage appended."""
    op = str(rng.choice(["truncate", "flip", "insert", "repeat", "garbage"]))
    log.append(f"bytes:{op}")
    n = len(raw)
    if op == "truncate":
        return raw[: int(rng.integers(0, n))]
    if op == "flip":
        data = bytearray(raw)
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(n))] ^= 1 << int(rng.integers(8))
        return bytes(data)
    if op == "insert":
        at = int(rng.integers(0, n + 1))
        return raw[:at] + rng.bytes(int(rng.integers(1, 9))) + raw[at:]
    if op == "repeat":
        return raw + raw
    return raw + rng.bytes(int(rng.integers(1, 17)))


def apply_to_oracle(oracle: ReplayTable, request: replay_pb2.InsertRequest, model: Model) -> int:
    """Insert what the shard acknowledged into the oracle; returns the items it kept."""
    columns, priorities = wire.decode_insert(request)
    result = oracle.insert(
        columns,
        priorities,
        writer_id=request.writer_id,
        sequence=request.sequence,
        items=wire.decode_items(request),
        trajectory=request.trajectory,
    )
    if not result.duplicate and request.writer_id == model.writer_id:
        if request.trajectory in model.steps:
            model.steps[request.trajectory] += result.rows
        model.sequence = request.sequence
    return result.items


def check_sample(table: ReplayTable) -> None:
    """A sample answers whole windows: every item with 1 .. WINDOW steps (what they hold, a damaged request may have
    chosen: the oracle checks that)."""
    if not table.info().size:
        return
    batch = table.sample(64)
    assert batch.columns["obs"].shape == (64 * WINDOW, 2)
    assert ((batch.lengths >= 1) & (batch.lengths <= WINDOW)).all()
    assert batch.item_columns["state"].shape == (64, 3)


def test_mutated_sequence_inserts_are_refused_whole_or_stored_exactly(shard) -> None:
    table, raw, oracle, model = shard
    rng = np.random.default_rng(20261128)
    outcomes: dict[str, int] = {}
    for example in range(EXAMPLES):
        log: list[str] = [f"example {example}"]
        request = draw_request(rng, model, log)
        mutate(rng, request, log)
        payload = request.SerializeToString()
        if rng.random() < 0.33:
            payload = damage(rng, payload, log)
        before = fingerprint(table)
        outcome = raw.call("Insert", [payload])
        context = f"{log}: {outcome.code.name} {outcome.details[:200]}"
        assert outcome.code in {
            grpc.StatusCode.OK,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        }, context
        acks = [replay_pb2.InsertAck.FromString(r) for r in outcome.responses]
        assert all(a.error_code in (0, 3) for a in acks), context
        stored = [a for a in acks if a.error_code == 0 and not a.duplicate]
        kind = "stored" if stored else f"refused {acks[0].error_code if acks else outcome.code.name}"
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if not stored:
            assert fingerprint(table) == before, context
            continue
        sent = replay_pb2.InsertRequest.FromString(payload)  # what the shard parsed and stored
        kept = apply_to_oracle(oracle, sent, model)
        assert fingerprint(table) == fingerprint(oracle), context
        assert stored[0].items == kept, context
        check_sample(table)
    assert raw.serving() == "SERVING/SERVING"
    print(f"sequence fuzz: {EXAMPLES} inserts: {outcomes}")
    assert (
        outcomes.get("stored", 0) > EXAMPLES // 5
        and sum(v for k, v in outcomes.items() if k != "stored") > EXAMPLES // 5
    )

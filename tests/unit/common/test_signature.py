"""Table signatures (common/signature.py): parsing the `--signature` text, the signature a batch implies, and the
check every insert goes through, with the first difference named."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import FieldSpec, Signature, canonical_dtype, check_rows

CARTPOLE = "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4]"


def cartpole(rows: int = 3) -> dict[str, np.ndarray]:
    return {
        "obs": np.zeros((rows, 4), np.float32),
        "action": np.zeros(rows, np.int64),
        "reward": np.zeros(rows, np.float32),
        "discount": np.zeros(rows, np.float32),
        "next_obs": np.zeros((rows, 4), np.float32),
    }


def test_parse_gives_ordered_fields_and_prints_back_the_same_text():
    signature = Signature.parse(CARTPOLE)
    assert signature.names == ("obs", "action", "reward", "discount", "next_obs")
    assert signature.fields[0] == FieldSpec("obs", np.dtype(np.float32), (4,))
    assert signature.fields[1] == FieldSpec("action", np.dtype(np.int64), ())
    assert str(signature) == CARTPOLE and Signature.parse(str(signature)) == signature
    assert signature.row_nbytes == 16 + 8 + 4 + 4 + 16


def test_parse_accepts_spaces_multi_dimensional_shapes_and_no_brackets():
    signature = Signature.parse(" frames : uint8 [2, 84,84] , done:bool , id.x-1:uint64[ ] ")
    assert [(f.name, f.dtype.name, f.shape) for f in signature.fields] == [
        ("frames", "uint8", (2, 84, 84)),
        ("done", "bool", ()),
        ("id.x-1", "uint64", ()),
    ]
    assert signature.fields[0].row_nbytes == 2 * 84 * 84


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("obs", "cannot parse signature field 'obs'"),
        ("obs:float32[4", "cannot parse signature field"),
        ("1obs:float32", "cannot parse signature field '1obs:float32'"),
        ("obs:float32[a]", "cannot parse signature field"),
        ("obs:complex64", "unsupported dtype complex64"),
        ("obs:nonsense", "field 'obs': unknown dtype 'nonsense'"),
        ("obs:float32,obs:int64", "duplicate field names in signature: ['obs']"),
        ("", "a signature needs at least one field"),
        (" , ", "a signature needs at least one field"),
    ],
)
def test_parse_refuses_bad_text(text, message):
    with pytest.raises(InvalidArgumentError) as err:
        Signature.parse(text)
    assert message in str(err.value)


def test_from_batch_uses_the_per_row_shape_and_little_endian_dtypes():
    columns = cartpole()
    columns["big"] = np.zeros((3, 2, 5), ">f8")
    signature = Signature.from_batch(columns)
    assert str(signature) == CARTPOLE + ",big:float64[2,5]"
    assert signature.fields[-1].dtype == np.dtype("<f8")
    with pytest.raises(InvalidArgumentError, match="unsupported dtype"):
        Signature.from_batch({"c": np.zeros(3, np.complex64)})


def test_check_batch_returns_the_row_count_of_a_matching_batch():
    assert Signature.parse(CARTPOLE).check_batch(cartpole(7)) == 7


def _change(**replace) -> dict[str, np.ndarray]:
    columns = cartpole()
    for name, value in replace.items():
        if value is None:
            del columns[name]
        else:
            columns[name] = value
    return columns


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (_change(reward=None), "missing ['reward'], unknown []"),
        (_change(bonus=np.zeros(3, np.float32)), "missing [], unknown ['bonus']"),
        (
            _change(obs=np.zeros((3, 4), np.float64)),
            "column 'obs' is float64[4] per row, the table signature wants float32[4]",
        ),
        (_change(obs=np.zeros((3, 5), np.float32)), "column 'obs' is float32[5] per row"),
        (
            _change(action=np.zeros((3, 1), np.int64)),
            "column 'action' is int64[1] per row, the table signature wants int64[]",
        ),
        (_change(reward=np.zeros(2, np.float32)), "ragged batch: columns have different lengths"),
        (_change(reward=np.float32(1)), "column 'reward' is a scalar"),
        ({}, "batch has no columns"),
        ({k: v[:0] for k, v in cartpole().items()}, "batch has 0 rows"),
    ],
)
def test_check_batch_names_the_first_difference(columns, message):
    with pytest.raises(InvalidArgumentError) as err:
        Signature.parse(CARTPOLE).check_batch(columns)
    assert message in str(err.value)


def test_check_rows_and_canonical_dtype():
    assert check_rows({"a": np.zeros((4, 2)), "b": np.zeros(4)}) == 4
    assert canonical_dtype(">u2") == np.dtype("<u2") and canonical_dtype(np.bool_) == np.dtype(bool)
    with pytest.raises(InvalidArgumentError, match="supported: float32, float64"):
        canonical_dtype(np.complex128)


# --- compressed fields ---------------------------------------------------------------------------------------------


def test_compressed_fields_parse_print_back_and_count_their_fixed_bytes():
    text = "obs:uint8[4,84,84]@zstd,action:int64[],planes:bool[10,10,4]@lz4,reward:float32[]"
    signature = Signature.parse(text)
    assert str(signature) == text and Signature.parse(str(signature)) == signature
    assert signature.fields[0] == FieldSpec("obs", np.dtype(np.uint8), (4, 84, 84), "zstd")
    assert [f.name for f in signature.compressed] == ["obs", "planes"]
    assert signature.fixed_row_nbytes == 8 + 4 and signature.row_nbytes == 28224 + 8 + 400 + 4
    assert Signature.parse(" obs : uint8 [ 2 ] @ lz4 ").fields[0].compression == "lz4"
    assert Signature.parse("x:uint8@zstd").fields[0] == FieldSpec("x", np.dtype(np.uint8), (), "zstd")
    assert Signature.parse("obs:uint8[2]@zstd") != Signature.parse("obs:uint8[2]")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("obs:uint8[4]@gzip", "field 'obs': unknown compression 'gzip' (known: zstd, lz4)"),
        ("obs:uint8[4]@", "cannot parse signature field"),
        ("obs:uint8[4]zstd", "cannot parse signature field"),
        ("obs:uint8[4]@zstd@lz4", "cannot parse signature field"),
    ],
)
def test_bad_compressions_are_refused(text, message):
    with pytest.raises(InvalidArgumentError) as err:
        Signature.parse(text)
    assert message in str(err.value)


def test_a_batch_of_compressed_columns_implies_and_matches_its_signature():
    from apexrl.common.compression import compress

    columns = cartpole(3)
    columns["obs"] = compress(np.zeros((3, 4, 84, 84), np.uint8), "zstd")
    signature = Signature.from_batch(columns)
    assert str(signature).startswith("obs:uint8[4,84,84]@zstd,action:int64[]")
    assert signature.check_batch(columns) == 3
    raw = dict(columns, obs=np.zeros((3, 4, 84, 84), np.uint8))
    with pytest.raises(
        InvalidArgumentError,
        match=r"column 'obs' is uint8\[4, 84, 84\] per row, the table "
        r"signature wants uint8\[4, 84, 84\]@zstd",
    ):
        signature.check_batch(raw)
    lz4 = dict(columns, obs=compress(np.zeros((3, 4, 84, 84), np.uint8), "lz4"))
    with pytest.raises(InvalidArgumentError, match=r"is uint8\[4, 84, 84\]@lz4 per row"):
        signature.check_batch(lz4)
    short = dict(columns, obs=compress(np.zeros((2, 4, 84, 84), np.uint8), "zstd"))
    with pytest.raises(InvalidArgumentError, match="ragged batch"):
        signature.check_batch(short)

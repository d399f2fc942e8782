"""numpy <-> protobuf tensors, batches and signatures (common/codec.py): exact round trips for every wire dtype,
little endian on the wire whatever the input, and every malformed header refused before the payload is touched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from apexrl.common import codec
from apexrl.common.errors import InvalidArgumentError
from apexrl.common.signature import SUPPORTED_DTYPES, Signature
from apexrl.proto import tensor_pb2


def round_trip(array: np.ndarray) -> np.ndarray:
    wire = tensor_pb2.Tensor.FromString(codec.encode_tensor(array).SerializeToString())
    return codec.decode_tensor(wire)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)])
def test_every_dtype_and_shape_round_trips_exactly(dtype, shape):
    rng = np.random.default_rng(0)
    array = (rng.random(shape) * 100 - 50).astype(dtype) if dtype != "bool" else rng.random(shape) > 0.5
    got = round_trip(array)
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    np.testing.assert_array_equal(got, array)
    assert not got.flags.writeable  # a zero-copy view of the message bytes


@given(
    hnp.arrays(
        st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.float16]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    )
)
@settings(max_examples=60, deadline=None)
def test_any_array_round_trips_bit_for_bit(array):
    got = round_trip(array)
    assert got.shape == array.shape and got.dtype == array.dtype
    assert got.tobytes() == np.ascontiguousarray(array).tobytes()  # NaNs and -0.0 included


def test_big_endian_and_non_contiguous_input_travel_as_little_endian_c_order():
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    msg = codec.encode_tensor(big)
    assert msg.dtype == tensor_pb2.INT32 and list(msg.shape) == [2, 3]
    assert msg.data == np.arange(6, dtype="<i4").tobytes()
    got = codec.decode_tensor(msg)
    assert got.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(got, big)
    transposed = np.arange(12, dtype=np.float64).reshape(3, 4).T
    np.testing.assert_array_equal(round_trip(transposed), transposed)
    assert round_trip(np.arange(10, dtype=">f8")[::3]).tolist() == [0.0, 3.0, 6.0, 9.0]


@pytest.mark.parametrize("dtype", [np.complex64, np.dtype("U3"), object, np.dtype("M8[s]")])
def test_unsupported_dtypes_are_refused_when_encoding(dtype):
    with pytest.raises(InvalidArgumentError, match="unsupported dtype"):
        codec.encode_tensor(np.zeros(2, dtype=dtype))


def tensor(dtype: int = tensor_pb2.FLOAT32, shape=(2, 2), data: bytes = b"\0" * 16) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(dtype=dtype, shape=shape, data=data)


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (tensor(dtype=tensor_pb2.DTYPE_UNSPECIFIED), "obs: unknown or unspecified dtype 0"),
        (tensor(dtype=99), "obs: unknown or unspecified dtype 99"),
        (tensor(shape=(2, -2)), "obs: dimension -2 out of range [0, 2147483648] in shape [2, -2]"),
        (tensor(shape=(1 << 40,)), "obs: dimension 1099511627776 out of range"),
        (tensor(data=b"\0" * 15), "obs: 15 data bytes, but shape [2, 2] of float32 needs 16"),
        (tensor(data=b"\0" * 17), "obs: 17 data bytes, but shape [2, 2] of float32 needs 16"),
        (tensor(shape=(), data=b""), "obs: 0 data bytes, but shape [] of float32 needs 4"),
        # The product of in-range dimensions is checked against the payload, never allocated.
        (tensor(shape=(1 << 31, 1 << 31, 1 << 31)), "needs 39614081257132168796771975168"),
    ],
)
def test_malformed_headers_are_refused_precisely(msg, message):
    with pytest.raises(InvalidArgumentError) as err:
        codec.decode_tensor(msg, "obs")
    assert message in str(err.value)


def test_batches_round_trip_and_refuse_bad_column_names():
    columns = {
        "obs": np.ones((3, 4), np.float32),
        "action": np.arange(3),
        "done": np.array([True, False, True]),
    }
    got = codec.decode_batch(tensor_pb2.Batch.FromString(codec.encode_batch(columns).SerializeToString()))
    assert list(got) == list(columns)
    for name, array in columns.items():
        np.testing.assert_array_equal(got[name], array)
    unnamed = codec.encode_batch({"": np.zeros(2)})
    with pytest.raises(InvalidArgumentError, match="a column with an empty name"):
        codec.decode_batch(unnamed)
    twice = codec.encode_batch({"a": np.zeros(2)})
    codec.encode_tensor(np.ones(2), twice.columns.add(name="a").tensor)
    with pytest.raises(InvalidArgumentError, match="duplicate column 'a'"):
        codec.decode_batch(twice)
    bad = codec.encode_batch({"a": np.zeros(2)})
    bad.columns[0].tensor.data = b"x"
    with pytest.raises(InvalidArgumentError, match="column 'a': 1 data bytes"):
        codec.decode_batch(bad)


def test_signatures_round_trip_and_an_empty_one_means_none():
    signature = Signature.parse("obs:float32[4],action:int64[],frames:uint8[2,84,84],mask:bool[3]")
    msg = tensor_pb2.Signature.FromString(codec.encode_signature(signature).SerializeToString())
    assert codec.decode_signature(msg) == signature
    assert codec.decode_signature(tensor_pb2.Signature()) is None
    bad = codec.encode_signature(signature)
    bad.fields[1].dtype = 42
    with pytest.raises(InvalidArgumentError, match="field 'action': unknown or unspecified dtype 42"):
        codec.decode_signature(bad)
    bad = codec.encode_signature(signature)
    bad.fields[0].shape[:] = [-1]
    with pytest.raises(InvalidArgumentError, match="field 'obs': dimension -1 out of range"):
        codec.decode_signature(bad)


def test_wire_dtype_numbers_are_the_proto_enum():
    assert {name: codec.dtype_to_wire(np.dtype(name)) for name in SUPPORTED_DTYPES} == {
        name: tensor_pb2.DType.Value(name.upper()) for name in SUPPORTED_DTYPES
    }
    assert codec.dtype_to_wire(np.dtype(">f4")) == tensor_pb2.FLOAT32


# --- compressed tensors --------------------------------------------------------------------------------------------


def pixels(rows: int = 3) -> np.ndarray:
    out = np.zeros((rows, 4, 84, 84), np.uint8)
    out[:, :, 10:20, 30:40] = np.arange(rows)[:, None, None, None] + 1
    return out


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_tensors_travel_as_their_frames(compression):
    from apexrl.common.compression import CompressedColumn, compress, decompress

    column = compress(pixels(), compression)
    msg = tensor_pb2.Tensor.FromString(codec.encode_tensor(column).SerializeToString())
    assert list(msg.shape) == [3, 4, 84, 84] and msg.dtype == tensor_pb2.UINT8
    assert msg.compression == {"zstd": tensor_pb2.ZSTD, "lz4": tensor_pb2.LZ4}[compression]
    assert msg.data == column.data and len(msg.frame_lengths) == 12
    got = codec.decode_tensor(msg)
    assert isinstance(got, CompressedColumn) and got.compression == compression and got.shape == (4, 84, 84)
    np.testing.assert_array_equal(decompress(got)[0], pixels())
    signature = Signature.parse(f"obs:uint8[4,84,84]@{compression},action:int64[]")
    assert codec.decode_signature(codec.encode_signature(signature)) == signature


def _compressed(**change) -> tensor_pb2.Tensor:
    from apexrl.common.compression import compress

    msg = codec.encode_tensor(compress(pixels(), "zstd"))
    for name, value in change.items():
        if name == "shape":
            msg.shape[:] = value
        else:
            setattr(msg, name, value)
    return msg


def _lengths(*values: int) -> bytes:
    return np.array(values, "<u4").tobytes()


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (_compressed(compression=7), "obs: unknown compression 7"),
        (
            _compressed(compression=tensor_pb2.COMPRESSION_NONE),
            "obs: frame_lengths given without a compression",
        ),
        (_compressed(shape=[]), "needs a first dimension"),
        (_compressed(frame_lengths=b"\0" * 11), "obs: 11 bytes of frame_lengths, 3 rows need 12"),
        (
            _compressed(frame_lengths=_lengths(3, 4, 5)),
            "obs: frame 0 is 3 bytes; frames of rows of 28224 bytes must be 4 .. 29468 bytes",
        ),
        (_compressed(frame_lengths=_lengths(4, 4, 30000)), "obs: frame 2 is 30000 bytes"),
        (_compressed(frame_lengths=_lengths(4, 4, 4)), "obs: frame_lengths sum to 12, data holds"),
        (
            _compressed(data=b"\x01\x02\x03\x04" * 3, frame_lengths=_lengths(4, 4, 4)),
            "obs: frame 0 does not start with the zstd magic number 28 b5 2f fd (3 of 3 frames)",
        ),
    ],
)
def test_malformed_compressed_tensors_are_refused_without_decompressing(msg, message):
    with pytest.raises(InvalidArgumentError) as err:
        codec.decode_tensor(msg, "obs")
    assert message in str(err.value)

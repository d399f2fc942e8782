"""The ParameterService's wire helpers, shared by the servicer and the client: the weights header <-> layout
conversion (the layout and its checks are weights.py's) and the chunking of the concatenated tensor bytes.

Every message stays under gRPC's default 4 MiB limit whatever the model size: weights travel as the header (the
layout of every tensor) followed by chunks of at most `chunk_bytes` of the concatenated tensor bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

from apexrl.common import codec
from apexrl.parameter_server.weights import Layout, TensorEntry, check_layout
from apexrl.proto import parameters_pb2

SERVICE_NAME = parameters_pb2.DESCRIPTOR.services_by_name["ParameterService"].full_name
# Chunks of 1 MiB stream at ~0.6-0.95 GB/s on loopback (FACTS.md) and leave room under any message limit.
DEFAULT_CHUNK_BYTES = 1024 * 1024
# gRPC's own default. Chunking means the parameter service never needs a larger limit.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def header_to_proto(version: int, layout: Layout, total_bytes: int) -> parameters_pb2.WeightsHeader:
    header = parameters_pb2.WeightsHeader(version=version, total_bytes=total_bytes)
    for e in layout:
        header.tensors.add(
            name=e.name, dtype=codec.dtype_to_wire(e.dtype), shape=e.shape, offset=e.offset, nbytes=e.nbytes
        )
    return header


def layout_from_proto(header: parameters_pb2.WeightsHeader) -> tuple[int, Layout, int]:
    """(version, layout, total_bytes) of a header; InvalidArgumentError when the layout is inconsistent."""
    layout = tuple(
        TensorEntry(
            t.name, codec.dtype_from_wire(t.dtype, f"tensor {t.name!r}"), tuple(t.shape), t.offset, t.nbytes
        )
        for t in header.tensors
    )
    check_layout(layout, header.total_bytes)
    return header.version, layout, header.total_bytes


def iter_chunks(payload: memoryview, chunk_bytes: int, first_chunk_bytes: int) -> Iterator[memoryview]:
    """Slices of `payload`: the first of at most `first_chunk_bytes` (possibly empty), then of `chunk_bytes`."""
    yield payload[:first_chunk_bytes]
    for start in range(first_chunk_bytes, payload.nbytes, chunk_bytes):
        yield payload[start : start + chunk_bytes]

"""The newest model weights, versioned: a pure, thread-safe holder (numpy only, no gRPC, no protobuf).

A version is packed once (weights.py: the layout, the bytes and the version rules) and never changes, so every
reader is served from the same bytes (slices, no per-request packing). Publishing swaps in the new version under a
lock after checking its number against the window above the current one (`weights.check_version_in_window`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from apexrl.parameter_server.weights import (
    Layout,
    TensorEntry,
    check_packed,
    check_version_in_window,
    check_version_number,
    next_version,
    pack,
    unpack,
)


class Snapshot(NamedTuple):
    """One published version: its number, its layout and its concatenated bytes (read-only, never modified)."""

    version: int
    layout: Layout
    payload: memoryview

    @property
    def total_bytes(self) -> int:
        return self.payload.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights as read-only numpy views of the payload (copy them to modify)."""
        return unpack(self.layout, self.payload)


class WeightStore:
    """Thread-safe holder of the newest weights version. Publishing replaces the previous version atomically;
    readers get an immutable Snapshot they can serve without holding any lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held only to check a version's number and swap it in
        self._latest: Snapshot | None = None
        self._published_total = 0

    @property
    def version(self) -> int:
        """The newest version number (0 when nothing was published yet)."""
        latest = self._latest
        return latest.version if latest is not None else 0

    @property
    def published_total(self) -> int:
        """How many versions were published into this store."""
        return self._published_total

    def latest(self) -> Snapshot | None:
        """The newest version, or None when nothing was published yet."""
        return self._latest

    def publish(self, weights: Mapping[str, np.ndarray], version: int | None = None) -> int:
        """Store `weights` as a new version (None: the previous version + 1); return its number.

        The arrays are copied, so the caller may keep training them. InvalidArgumentError for no tensors, an
        unsupported dtype or a version that is not a positive integer; VersionRefusedError for a version outside
        the window above the current one (`weights.version_window`).
        """
        version = check_version_number(version)
        layout, payload = pack(weights)
        return self._commit(layout, payload, version)

    def publish_packed(
        self,
        layout: Sequence[TensorEntry],
        payload: memoryview | bytes | bytearray,
        version: int | None = None,
    ) -> int:
        """Store an already packed version (what the Publish RPC receives), checked by `weights.check_packed`. The
        payload is kept as given (made read-only, not copied); the caller must not modify it afterwards."""
        version = check_version_number(version)
        view = check_packed(layout, payload)
        return self._commit(tuple(layout), view, version)

    def check_version(self, version: int) -> None:
        """InvalidArgumentError or VersionRefusedError when `version` could not be published now (fail fast
        before receiving bytes)."""
        version = check_version_number(version)
        if version is not None:
            check_version_in_window(version, self.version)

    def _commit(self, layout: Layout, payload: memoryview, version: int | None) -> int:
        with self._lock:
            current = self.version
            if version is None:
                version = next_version(current)
            else:
                check_version_in_window(version, current)
            self._latest = Snapshot(version, layout, payload)
            self._published_total += 1
        return version

"""The weight store (parameter_server/store.py): a pure, thread-safe holder of the newest versioned weights. The
format and the version rules it applies are tested on their own in test_weights.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError
from apexrl.parameter_server import weights as weights_module
from apexrl.parameter_server.store import WeightStore
from apexrl.parameter_server.weights import (
    MAX_VERSION,
    MAX_VERSION_STEP,
    TensorEntry,
    VersionRefusedError,
    pack,
)


def test_store_concurrent_publishers_get_distinct_increasing_versions():
    store = WeightStore()
    got: list[int] = []
    lock = threading.Lock()

    def publish_many():
        for _ in range(50):
            v = store.publish({"w": np.zeros(2, np.float32)})
            with lock:
                got.append(v)

    threads = [threading.Thread(target=publish_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 201))
    assert store.version == 200 and store.published_total == 200


def test_a_snapshot_is_isolated_from_the_published_arrays_and_from_later_versions():
    store = WeightStore()
    assert store.latest() is None and store.version == 0
    source = np.arange(4, dtype=np.float32)
    assert store.publish({"w": source}) == 1
    snapshot = store.latest()
    assert snapshot is not None and snapshot.version == 1 and snapshot.total_bytes == 16
    source[:] = -1  # the store copied the arrays
    arrays = snapshot.arrays()
    np.testing.assert_array_equal(arrays["w"], [0, 1, 2, 3])
    assert not arrays["w"].flags.writeable
    store.publish({"w": source})
    np.testing.assert_array_equal(snapshot.arrays()["w"], [0, 1, 2, 3])  # a reader's snapshot never changes
    assert store.latest().version == 2


def test_versions_strictly_increase_and_a_refused_publish_changes_nothing():
    store = WeightStore()
    assert store.version == 0 and store.published_total == 0
    assert store.publish({"w": np.zeros(2, np.float32)}) == 1
    assert store.publish({"w": np.ones(2, np.float32)}, version=5) == 5
    assert store.publish({"w": np.full(2, 2.0, np.float32)}) == 6
    for bad in (6, 3):
        with pytest.raises(
            VersionRefusedError, match=f"version {bad} is not greater than the current version 6"
        ):
            store.publish({"w": np.full(2, 9.0, np.float32)}, version=bad)
        with pytest.raises(VersionRefusedError, match="not greater"):
            store.check_version(bad)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            store.publish({"w": np.zeros(2, np.float32)}, version=bad)
    with pytest.raises(InvalidArgumentError, match="no tensors"):
        store.publish({})
    assert store.version == 6 and store.published_total == 3
    np.testing.assert_array_equal(store.latest().arrays()["w"], [2.0, 2.0])


def test_publish_packed_refuses_bool_bytes_other_than_0_or_1():
    store = WeightStore()
    layout = (TensorEntry("m", np.dtype("bool"), (3,), 0, 3),)
    with pytest.raises(InvalidArgumentError, match="bool bytes must be 0 or 1, found 2"):
        store.publish_packed(layout, bytearray(b"\1\0\2"))
    assert store.publish_packed(layout, bytearray(b"\1\0\1")) == 1
    np.testing.assert_array_equal(store.latest().arrays()["m"], [True, False, True])


def test_a_version_beyond_the_window_above_the_current_one_is_refused_and_changes_nothing():
    """Issue 16: one publish of 2**64 - 1 (any credential could send it) left no version after it, so the learner's
    next publish was refused and it exited. A new version is now at most MAX_VERSION_STEP above the current one
    and at most MAX_VERSION (< 2**63)."""
    assert MAX_VERSION < 2**63 and MAX_VERSION_STEP == 2**20
    store = WeightStore()
    assert store.publish({"w": np.zeros(2, np.float32)}, version=7) == 7
    for far in (2**64 - 1, 2**63, MAX_VERSION, 7 + MAX_VERSION_STEP + 1):
        for attempt in (
            lambda v=far: store.check_version(v),
            lambda v=far: store.publish({"w": np.ones(2, np.float32)}, version=v),
            lambda v=far: store.publish_packed(*pack({"w": np.ones(2, np.float32)}), version=v),
        ):
            with pytest.raises(
                VersionRefusedError,
                match=rf"version {far} is .*the current version is 7, so the "
                rf"next must be in \[8, {7 + MAX_VERSION_STEP}\]",
            ):
                attempt()
    assert issubclass(VersionRefusedError, FailedPreconditionError)
    assert store.version == 7 and store.published_total == 1
    np.testing.assert_array_equal(store.latest().arrays()["w"], [0, 0])
    assert store.publish({"w": np.ones(2, np.float32)}, version=7 + MAX_VERSION_STEP) == 7 + MAX_VERSION_STEP


def test_at_the_largest_version_no_version_is_left(monkeypatch):
    """MAX_VERSION takes 2**43 publishes to reach; with a larger step the store shows what happens there."""
    monkeypatch.setattr(weights_module, "MAX_VERSION_STEP", MAX_VERSION)
    store = WeightStore()
    assert store.publish({"w": np.zeros(2, np.float32)}, version=MAX_VERSION) == MAX_VERSION
    with pytest.raises(
        VersionRefusedError, match=f"no version is left after the current one \\({MAX_VERSION}"
    ):
        store.publish({"w": np.zeros(2, np.float32)})
    with pytest.raises(VersionRefusedError, match=f"above the largest version {MAX_VERSION}"):
        store.publish({"w": np.zeros(2, np.float32)}, version=MAX_VERSION + 1)
    assert store.published_total == 1

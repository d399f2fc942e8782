"""The weight store (parameter_server/store.py): a pure, thread-safe holder of the newest versioned weights."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import FailedPreconditionError, InvalidArgumentError
from apexrl.parameter_server import store as store_module
from apexrl.parameter_server.store import (
    MAX_VERSION,
    MAX_VERSION_STEP,
    TensorEntry,
    VersionRefusedError,
    WeightStore,
    check_layout,
    pack,
    unpack,
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


def test_store_wait_newer_and_snapshot_isolation():
    store = WeightStore()
    assert store.latest() is None and store.wait_newer(0, timeout=0.01) is None
    source = np.arange(4, dtype=np.float32)
    threading.Timer(0.05, store.publish, args=({"w": source},)).start()
    snapshot = store.wait_newer(0, timeout=5)
    assert snapshot is not None and snapshot.version == 1
    source[:] = -1  # the store copied the arrays
    arrays = snapshot.arrays()
    np.testing.assert_array_equal(arrays["w"], [0, 1, 2, 3])
    assert not arrays["w"].flags.writeable
    assert store.wait_newer(1, timeout=0.01) is None


def test_check_layout_accepts_any_order_and_empty_tensors():
    f4 = np.dtype("<f4")
    check_layout(
        [
            TensorEntry("b", f4, (2,), 8, 8),
            TensorEntry("e", f4, (0,), 16, 0),
            TensorEntry("a", f4, (2,), 0, 8),
        ],
        16,
    )
    with pytest.raises(InvalidArgumentError, match="needs"):
        check_layout([TensorEntry("a", f4, (1 << 31, 1 << 31, 1 << 31), 0, 0)], 0)  # no int64 overflow


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
    monkeypatch.setattr(store_module, "MAX_VERSION_STEP", MAX_VERSION)
    store = WeightStore()
    assert store.publish({"w": np.zeros(2, np.float32)}, version=MAX_VERSION) == MAX_VERSION
    with pytest.raises(
        VersionRefusedError, match=f"no version is left after the current one \\({MAX_VERSION}"
    ):
        store.publish({"w": np.zeros(2, np.float32)})
    with pytest.raises(VersionRefusedError, match=f"above the largest version {MAX_VERSION}"):
        store.publish({"w": np.zeros(2, np.float32)}, version=MAX_VERSION + 1)
    assert store.published_total == 1

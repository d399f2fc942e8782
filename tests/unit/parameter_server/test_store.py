"""The weight store (parameter_server/store.py): a pure, thread-safe holder of the newest versioned weights."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from apexrl.common.errors import InvalidArgumentError
from apexrl.parameter_server.store import TensorEntry, WeightStore, check_layout, pack, unpack


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
    check_layout([TensorEntry("b", f4, (2,), 8, 8), TensorEntry("e", f4, (0,), 16, 0),
                  TensorEntry("a", f4, (2,), 0, 8)], 16)
    with pytest.raises(InvalidArgumentError, match="needs"):
        check_layout([TensorEntry("a", f4, (1 << 31, 1 << 31, 1 << 31), 0, 0)], 0)  # no int64 overflow



def test_versions_strictly_increase_and_a_refused_publish_changes_nothing():
    store = WeightStore()
    assert store.version == 0 and store.published_total == 0
    assert store.publish({"w": np.zeros(2, np.float32)}) == 1
    assert store.publish({"w": np.ones(2, np.float32)}, version=5) == 5
    assert store.publish({"w": np.full(2, 2.0, np.float32)}) == 6
    for bad in (6, 3):
        with pytest.raises(InvalidArgumentError, match=f"version {bad} is not greater than the current version 6"):
            store.publish({"w": np.full(2, 9.0, np.float32)}, version=bad)
        with pytest.raises(InvalidArgumentError, match="not greater"):
            store.check_version(bad)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            store.publish({"w": np.zeros(2, np.float32)}, version=bad)
    with pytest.raises(InvalidArgumentError, match="no tensors"):
        store.publish({})
    assert store.version == 6 and store.published_total == 3
    np.testing.assert_array_equal(store.latest().arrays()["w"], [2.0, 2.0])


def test_pack_and_unpack_keep_order_dtype_shape_and_alignment():
    weights = {"b": np.arange(3, dtype=np.int8), "a": np.arange(6, dtype=">f8").reshape(2, 3),
               "s": np.float32(1.5), "m": np.array([True, False])}
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

"""n-step returns and discounts against values computed by hand (n = 3, gamma = 0.5)."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.algorithms.nstep import NStepWriter, Transition, item_columns

GAMMA = 0.5


def _obs(i: int) -> np.ndarray:
    """Observation s_i of the hand-written episode: [i, -i]."""
    return np.array([i, -i], dtype=np.float32)


def _run(
    rewards: list[float], terminated_at_end: bool, truncated_at_end: bool, n: int = 3
) -> list[Transition]:
    """Push a single episode s_0..s_T with actions 10+t; return every emitted transition, checking order."""
    acc = NStepWriter(n=n, gamma=GAMMA)
    out: list[Transition] = []
    last = len(rewards) - 1
    for t, r in enumerate(rewards):
        emitted = acc.push(
            _obs(t),
            10 + t,
            r,
            _obs(t + 1),
            terminated=terminated_at_end and t == last,
            truncated=truncated_at_end and t == last,
        )
        if t < last:
            # Mid-episode: nothing until n steps are pending, then exactly the oldest one.
            assert len(emitted) == (1 if t >= n - 1 else 0)
        out += emitted
    assert len(acc) == 0
    assert [tr.action for tr in out] == [10 + t for t in range(len(rewards))]
    return out


def test_terminated_episode() -> None:
    # r_0..r_4 = 1, 2, 3, 4, 5; terminates after the step from s_4 (s_5 is terminal).
    out = _run([1, 2, 3, 4, 5], terminated_at_end=True, truncated_at_end=False)
    expected = [
        # (reward, discount, next_obs index)
        (1 + 0.5 * 2 + 0.25 * 3, 0.125, 3),  # t=0: full 3 steps, bootstrap from s_3 with gamma^3
        (2 + 0.5 * 3 + 0.25 * 4, 0.125, 4),  # t=1
        (3 + 0.5 * 4 + 0.25 * 5, 0.0, 5),  # t=2: its 3rd step terminated
        (4 + 0.5 * 5, 0.0, 5),  # t=3: 2 steps, terminated
        (5.0, 0.0, 5),  # t=4: 1 step, terminated
    ]
    for t, (tr, (ret, disc, nxt)) in enumerate(zip(out, expected, strict=True)):
        np.testing.assert_array_equal(tr.obs, _obs(t))
        assert tr.reward == pytest.approx(ret)
        assert tr.discount == pytest.approx(disc)
        np.testing.assert_array_equal(tr.next_obs, _obs(nxt))


def test_truncated_episode_bootstraps_with_shorter_discounts() -> None:
    # Same rewards, but the time limit ends the episode after the step from s_4: bootstrap from s_5.
    out = _run([1, 2, 3, 4, 5], terminated_at_end=False, truncated_at_end=True)
    assert [tr.reward for tr in out] == pytest.approx([2.75, 4.5, 6.25, 6.5, 5.0])
    assert [tr.discount for tr in out] == pytest.approx([0.125, 0.125, 0.125, 0.25, 0.5])
    assert [int(tr.next_obs[0]) for tr in out] == [3, 4, 5, 5, 5]


def test_episode_shorter_than_n() -> None:
    out = _run([1, 1], terminated_at_end=True, truncated_at_end=False)
    assert [tr.reward for tr in out] == pytest.approx([1.5, 1.0])
    assert [tr.discount for tr in out] == [0.0, 0.0]
    out = _run([1, 1], terminated_at_end=False, truncated_at_end=True)
    assert [tr.discount for tr in out] == pytest.approx([0.25, 0.5])


def test_terminated_and_truncated_together_counts_as_terminated() -> None:
    out = _run([1, 1, 1, 1], terminated_at_end=True, truncated_at_end=True)
    assert [tr.discount for tr in out] == [0.125, 0.0, 0.0, 0.0]


def test_one_step_is_plain_td() -> None:
    out = _run([3, 4], terminated_at_end=False, truncated_at_end=True, n=1)
    assert [(tr.reward, tr.discount) for tr in out] == [(3.0, 0.5), (4.0, 0.5)]


def test_episodes_do_not_leak_into_each_other() -> None:
    acc = NStepWriter(n=3, gamma=GAMMA)
    assert len(acc.push(_obs(0), 0, 1.0, _obs(1), terminated=True, truncated=False)) == 1
    # A new episode starts from scratch: its first step completes nothing.
    assert acc.push(_obs(7), 1, 100.0, _obs(8), terminated=False, truncated=False) == []
    acc.reset()
    assert len(acc) == 0


def test_stored_obs_are_copies() -> None:
    acc = NStepWriter(n=1, gamma=GAMMA)
    obs, nxt = _obs(1), _obs(2)
    (tr,) = acc.push(obs, 0, 1.0, nxt, terminated=False, truncated=False)
    obs[:] = 99
    nxt[:] = 99
    np.testing.assert_array_equal(tr.obs, _obs(1))
    np.testing.assert_array_equal(tr.next_obs, _obs(2))


def test_stack_transitions_columns_and_dtypes() -> None:
    out = _run([1, 2, 3, 4, 5], terminated_at_end=True, truncated_at_end=False)
    cols = item_columns(out)
    assert list(cols) == ["obs", "action", "reward", "discount", "next_obs"]
    assert cols["obs"].dtype == np.float32 and cols["obs"].shape == (5, 2)
    assert cols["next_obs"].dtype == np.float32 and cols["next_obs"].shape == (5, 2)
    assert cols["action"].dtype == np.int64 and cols["action"].shape == (5,)
    assert cols["reward"].dtype == np.float32 and cols["discount"].dtype == np.float32
    np.testing.assert_array_equal(cols["action"], [10, 11, 12, 13, 14])
    np.testing.assert_allclose(cols["reward"], [2.75, 4.5, 6.25, 6.5, 5.0])
    np.testing.assert_array_equal(cols["discount"], [0.125, 0.125, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(cols["next_obs"][:, 0], [3, 4, 5, 5, 5])
    with pytest.raises(ValueError, match="empty"):
        item_columns([])


@pytest.mark.parametrize(
    ("dtype", "stored"),
    [
        (np.uint8, np.uint8),
        (np.bool_, np.bool_),
        (np.float64, np.float32),
        (np.float32, np.float32),
        (np.int32, np.int32),
    ],
)
def test_observations_keep_their_dtype_except_floats_which_become_float32(dtype, stored) -> None:
    """uint8 pixels and bool planes go to replay at one byte per value; floats as float32."""
    acc = NStepWriter(n=2, gamma=0.5)
    frames = [np.full((4, 84, 84), t, dtype=dtype) for t in range(4)]
    out = []
    for t in range(3):
        out += acc.push(frames[t], 0, 1.0, frames[t + 1], terminated=t == 2, truncated=False)
    cols = item_columns(out)
    assert cols["obs"].dtype == stored and cols["next_obs"].dtype == stored
    assert cols["obs"].shape == (3, 4, 84, 84)
    np.testing.assert_array_equal(cols["next_obs"][:, 0, 0, 0], np.array([2, 3, 3]).astype(stored))


@pytest.mark.parametrize(("n", "gamma"), [(0, 0.9), (-1, 0.9), (2.0, 0.9), (True, 0.9), (3, 1.5), (3, -0.1)])
def test_rejects_bad_parameters(n: object, gamma: float) -> None:
    with pytest.raises(ValueError):
        NStepWriter(n=n, gamma=gamma)  # type: ignore[arg-type]


def test_image_columns_are_compressed_one_frame_per_row_and_vectors_stay_raw():
    from apexrl.common.compression import CompressedColumn, compress_image_columns, decompress

    rng = np.random.default_rng(0)
    columns = {
        "obs": rng.integers(0, 3, (5, 4, 84, 84)).astype(np.uint8),  # Atari-like stacks
        "next_obs": rng.random((5, 10, 10, 4)) < 0.1,  # MinAtar-like bool planes
        "action": np.arange(5),
        "reward": np.ones(5, np.float32),
    }
    out = compress_image_columns(columns, "zstd")
    for name in ("obs", "next_obs"):
        assert isinstance(out[name], CompressedColumn) and out[name].compression == "zstd"
        np.testing.assert_array_equal(decompress(out[name])[0], columns[name])
    assert out["action"] is columns["action"]
    assert (
        compress_image_columns(columns, "none") is columns
        and compress_image_columns(columns, None) is columns
    )
    vectors = {"obs": np.zeros((5, 4), np.float32), "next_obs": np.zeros((5, 8), np.uint8)}
    assert compress_image_columns(vectors, "lz4") == vectors  # float vectors and 1-d rows stay raw

"""The environment id decides the preprocessing (common/environments.py): Atari through Gymnasium's
AtariPreprocessing and FrameStackObservation, MinAtar as its package registers it, anything else unchanged."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from apexrl.common.environments import (
    BOX,
    CHW,
    HWC,
    MINATAR_MAX_EPISODE_STEPS,
    VECTOR,
    EnvSpaces,
    check_spaces,
    clips_rewards,
    env_spaces,
    is_atari,
    make_env,
)


def test_atari_ids_get_the_standard_preprocessing_and_clipped_rewards():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    assert env_spaces("ALE/Pong-v5") == EnvSpaces((4, 84, 84), "uint8", 6)
    assert env_spaces("ALE/Pong-v5").layout == CHW
    assert is_atari("ALE/Pong-v5") and clips_rewards("ALE/Pong-v5")
    env = make_env("ALE/Pong-v5")
    try:
        assert isinstance(env, gym.wrappers.FrameStackObservation)
        pre = env.env
        assert isinstance(pre, gym.wrappers.AtariPreprocessing)
        assert (pre.noop_max, pre.frame_skip, pre.screen_size, pre.grayscale_obs) == (30, 4, (84, 84), True)
        assert pre.env.unwrapped._frameskip == 1  # the preprocessing skips frames, not the emulator
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (4, 84, 84)
        obs, *_ = env.step(0)
        assert obs.max() > 0  # real frames
    finally:
        env.close()


def test_minatar_ids_keep_their_observations_and_get_a_time_limit():
    pytest.importorskip("minatar")
    spaces = env_spaces("MinAtar/Breakout-v1")
    assert spaces == EnvSpaces((10, 10, 4), "bool", 3) and spaces.layout == HWC
    assert not is_atari("MinAtar/Breakout-v1") and not clips_rewards("MinAtar/Breakout-v1")
    env = make_env("MinAtar/Breakout-v1")
    try:
        assert env.spec.max_episode_steps == MINATAR_MAX_EPISODE_STEPS
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.bool_ and obs.shape == (10, 10, 4) and obs.any()
    finally:
        env.close()


def test_other_ids_are_made_as_gymnasium_makes_them():
    spaces = env_spaces("CartPole-v1")
    assert spaces == EnvSpaces.vector(4, 2) and spaces.layout == VECTOR and spaces.input_scale == 1.0
    assert not is_atari("CartPole-v1") and not clips_rewards("CartPole-v1")


def test_unknown_ids_and_unsupported_spaces_are_refused():
    with pytest.raises(ValueError, match="cannot make environment 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="Blackjack-v1: the built-in actor needs a Box observation space"):
        env_spaces("Blackjack-v1")
    for space, match in [
        (gym.spaces.MultiDiscrete([2, 3]), "needs a Discrete or a Box action space, got MultiDiscrete"),
        (gym.spaces.Box(-np.inf, np.inf, (2,)), r"needs finite bounds .* got low \[-inf, -inf\]"),
        (gym.spaces.Box(-1, np.array([1, np.inf], np.float32)), r"needs finite bounds"),
        (gym.spaces.Box(-1, 1, (2, 3)), r"must be one-dimensional .* got shape \(2, 3\)"),
        (gym.spaces.Discrete(3, start=1), "must start at 0"),
    ]:
        env = gym.make("CartPole-v1")
        env.action_space = space
        try:
            with pytest.raises(ValueError, match=match):
                check_spaces(env, "Odd-v0")
        finally:
            env.close()


def test_a_box_action_space_gives_its_bounds_per_dimension():
    spaces = env_spaces("Pendulum-v1")
    assert (
        spaces == EnvSpaces.box((3,), (-2.0,), (2.0,))
        and spaces.action_kind == BOX
        and spaces.action_dim == 1
    )
    env = gym.make("CartPole-v1")
    env.action_space = gym.spaces.Box(np.array([-1, 0, -5], np.float32), np.array([3, 1, -4], np.float32))
    try:
        asymmetric = check_spaces(env, "Asymmetric-v0")
    finally:
        env.close()
    assert (asymmetric.action_low, asymmetric.action_high) == ((-1.0, 0.0, -5.0), (3.0, 1.0, -4.0))
    assert asymmetric.num_actions == 0 and asymmetric.action_dim == 3
    with pytest.raises(ValueError, match="either num_actions"):
        EnvSpaces((3,), "float32", 2, (-1.0,), (1.0,))
    with pytest.raises(ValueError, match="finite with low < high"):
        EnvSpaces.box((3,), (1.0,), (1.0,))

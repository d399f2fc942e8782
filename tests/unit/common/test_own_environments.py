"""Bringing your own environment (common/environments.py): one `make_env` builds every environment from an
EnvChoice, with plugin modules, constructor arguments, Discrete observations one-hot encoded, the registration's
reward_threshold honoured, and environments written for gym 0.26 adapted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from apexrl.common.env_settings import EnvChoice, EnvKwargs
from apexrl.common.environments import (
    check_spaces,
    env_spaces,
    make_env,
    make_vector_env,
    reward_threshold,
)
from tests.support.custom_envs import LINE_THRESHOLD, OLD_LINE_THRESHOLD

ROOT = Path(__file__).resolve().parents[3]


def test_discrete_observations_are_one_hot_encoded():
    spaces = env_spaces("FrozenLake-v1")
    assert spaces.obs_shape == (16,) and spaces.obs_dtype == "float32" and spaces.obs_one_hot
    env = make_env("FrozenLake-v1")
    try:
        obs, _ = env.reset(seed=0)
        np.testing.assert_array_equal(obs, np.eye(16, dtype=np.float32)[0])
        obs, *_ = env.step(2)  # right (not slippery enough to matter for the encoding)
        assert obs.dtype == np.float32 and obs.sum() == 1.0
    finally:
        env.close()
    taxi = make_vector_env("Taxi-v3", 3)
    try:
        assert check_spaces(taxi, "Taxi-v3").obs_shape == (500,) and check_spaces(taxi, "Taxi-v3").obs_one_hot
        obs, _ = taxi.reset(seed=0)
        assert obs.shape == (3, 500) and (obs.sum(axis=1) == 1).all()
    finally:
        taxi.close()
    assert not env_spaces("CartPole-v1").obs_one_hot


def test_constructor_arguments_reach_the_environment_and_bad_ones_are_one_line():
    eight = EnvChoice("FrozenLake-v1", kwargs=EnvKwargs({"map_name": "8x8", "is_slippery": False}))
    assert env_spaces(eight).obs_shape == (64,)
    vector = make_vector_env(eight, 2, same_step_autoreset=False)
    try:
        assert vector.single_observation_space.shape == (64,)
    finally:
        vector.close()
    with pytest.raises(ValueError) as info:
        make_env(EnvChoice("CartPole-v1", kwargs=EnvKwargs({"wind": 3})))
    message = str(info.value)
    assert message.startswith("cannot make environment 'CartPole-v1' with {\"wind\": 3}: TypeError:")
    assert "unexpected keyword argument 'wind'" in message and "\n" not in message


def test_a_plugin_modules_environment_and_its_reward_threshold():
    by_module = EnvChoice("Line-v0", ("tests.support.custom_envs",), EnvKwargs({"length": 6}))
    in_id = EnvChoice("tests.support.custom_envs:Line-v0", kwargs=EnvKwargs({"length": 6}))
    for choice in (by_module, in_id):
        assert env_spaces(choice).obs_shape == (6,)
        assert reward_threshold(choice) == LINE_THRESHOLD  # the old code lost it for module:Id (never solved)
    assert reward_threshold("tests.support.odd_envs:UnboundedActions-v0") is None  # registered without one
    assert reward_threshold("Pendulum-v1") == -150.0 and reward_threshold("CartPole-v1") == 475.0
    with pytest.raises(ValueError, match="cannot import environment module 'no_such_envs': No module named"):
        make_env(EnvChoice("Line-v0", ("no_such_envs",)))


def test_an_environment_whose_constructor_takes_no_render_mode_is_made_and_rendering_is_asked_for_only_when_wanted():
    env = make_env(EnvChoice("tests.support.custom_envs:Line-v0"))  # the old make_env passed render_mode=None
    env.close()
    assert env.spec.kwargs == {}
    with pytest.raises(ValueError, match="render_mode"):
        make_env(EnvChoice("tests.support.custom_envs:Line-v0"), render_mode="human")
    with pytest.raises(ValueError, match=r"render_mode \('ansi'\) must be one of human, rgb_array"):
        make_env("CartPole-v1", render_mode="ansi")


def test_a_module_in_the_working_directory_is_found_as_python_m_would(tmp_path):
    """The `apexrl` script does not put the working directory on sys.path; --env-module finds it there last."""
    (tmp_path / "my_cwd_envs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('CwdCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv', "
        "reward_threshold=123.0)\n"
    )
    code = (
        "import sys; sys.path = [p for p in sys.path if p not in ('', '.')]\n"
        "from apexrl.common.environments import env_spaces, reward_threshold\n"
        "from apexrl.common.env_settings import EnvChoice\n"
        "c = EnvChoice('CwdCartPole-v0', ('my_cwd_envs',))\n"
        "print(env_spaces(c).obs_shape, reward_threshold(c), reward_threshold('my_cwd_envs:CwdCartPole-v0'))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert out.stdout.split() == ["(4,)", "123.0", "123.0"], out.stderr


def test_a_gym_0_26_environment_runs_through_the_adapter_with_its_arguments_and_threshold():
    pytest.importorskip("gym")
    pytest.importorskip("shimmy")
    choice = EnvChoice("OldLine-v0", ("tests.support.custom_envs",), EnvKwargs({"length": 5}))
    env = make_env(choice)
    try:
        assert isinstance(env, gym.Env) and isinstance(env.observation_space, gym.spaces.Box)
        obs, _ = env.reset(seed=0)
        total, done, steps = 0.0, False, 0
        while not done:  # always right: 4 steps to the end of 5 cells
            obs, reward, terminated, truncated, _ = env.step(1)
            total, steps, done = total + reward, steps + 1, terminated or truncated
        assert (total, steps, terminated) == (1.0, 4, True)
        assert obs.dtype == np.float32 and obs.tolist() == [1.0]
    finally:
        env.close()
    assert env_spaces(choice).num_actions == 2
    assert reward_threshold(choice) == OLD_LINE_THRESHOLD
    vector = make_vector_env(
        choice, 2
    )  # what an actor plays: numpy 2 and gym's checker (np.bool8) stay apart
    try:
        vector.reset(seed=1)
        for _ in range(10):
            vector.step(np.array([1, 0]))
    finally:
        vector.close()


def test_gyms_own_lunar_lander_v2_which_gymnasium_retired_runs_through_the_adapter():
    pytest.importorskip("gym")
    pytest.importorskip("shimmy")
    pytest.importorskip("Box2D")
    assert env_spaces("LunarLander-v2").num_actions == 4
    assert reward_threshold("LunarLander-v2") == 200.0
    env = make_env("LunarLander-v2")
    try:
        env.reset(seed=0)
        obs, reward, *_ = env.step(0)
        assert obs.shape == (8,) and np.isfinite(reward)
    finally:
        env.close()


def test_cartpole_without_velocities_is_cartpole_with_its_velocity_entries_zeroed():
    """CartPoleNoVel-v1 (rl-baselines3-zoo's name and masking): the same dynamics, time limit and solve bar as
    CartPole-v1, observations with the cart's velocity and the pole's angular velocity set to 0."""
    import numpy as np

    from apexrl.common.environments import env_spaces, make_env, make_vector_env, reward_threshold

    masked, full = make_env("CartPoleNoVel-v1"), make_env("CartPole-v1")
    seen, want = [masked.reset(seed=7)[0]], [full.reset(seed=7)[0]]
    rng = np.random.default_rng(0)
    for _ in range(600):
        action = int(rng.integers(2))
        obs, _, terminated, truncated, _ = masked.step(action)
        seen.append(obs)
        want.append(full.step(action)[0])
        if terminated or truncated:
            break
    seen, want = np.array(seen), np.array(want)
    np.testing.assert_array_equal(seen[:, [1, 3]], 0.0)
    np.testing.assert_array_equal(seen[:, [0, 2]], want[:, [0, 2]])
    assert np.abs(want[:, [1, 3]]).max() > 0  # the velocities it hides are real
    assert masked.spec.max_episode_steps == 500 and reward_threshold("CartPoleNoVel-v1") == 475.0
    assert env_spaces("CartPoleNoVel-v1") == env_spaces("CartPole-v1")
    vector = make_vector_env("CartPoleNoVel-v1", 3, same_step_autoreset=False)  # no unmasked vector shortcut
    np.testing.assert_array_equal(vector.reset(seed=1)[0][:, [1, 3]], 0.0)
    for env in (masked, full, vector):
        env.close()

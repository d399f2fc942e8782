"""`apexrl export` of a recurrent policy (R2D2; learner/export_recurrent.py), from checkpoints of fresh networks
written as the learner writes them: the file takes the observation, the state, the previous action and reward and
gives the action and the next state; carried as its docstring shows, it plays real CartPoleNoVel-v1 episodes as
`load_policy` does (one environment and a batch, reset at episode ends); the state changes what it does; Atari's
rewards are clipped inside; a file made from other weights is refused at the step where it parts from the policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest
import torch

import apexrl
from apexrl.launcher import cli
from apexrl.learner.export import export_policy
from apexrl.learner.export_recurrent import ROLLOUT_ENVS, ROLLOUT_STEPS, check_recurrent_export
from tests.integration.learner.test_policy import run_dir

ENV = "CartPoleNoVel-v1"
CORE = 64  # R2D2's LSTM for vector observations (algorithms/r2d2/defaults.py)
FORMATS = ["torchscript", "onnx"]
# A fresh network that plays both actions on CartPoleNoVel's small observations and whose actions depend on the
# state (seed 0's pushes left throughout a real episode): fixed, so every run sees the same one.
SEED = 3
Step = Callable[
    ..., tuple[np.ndarray, np.ndarray]
]  # (obs, state, prev_action, prev_reward) -> (action, state)


def written(fmt: str, out) -> Step:
    """The exported file as a user runs it: torch.jit.load, or an onnxruntime session fed numpy arrays."""
    if fmt == "torchscript":
        module = torch.jit.load(str(out))

        def step(*arrays):
            action, state = module(*(torch.as_tensor(np.asarray(a)) for a in arrays))
            return action.numpy(), state.numpy()

        return step
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = ("obs", "state", "prev_action", "prev_reward")

    def step(*arrays):
        action, state = session.run(["action", "next_state"], dict(zip(names, arrays, strict=True)))
        return action, state

    return step


def exported(tmp_path, fmt: str, env: str = ENV, seed: int = SEED):
    """(the policy, the file's step) for a fresh R2D2 checkpoint of `env` exported as `fmt`."""
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    folder = run_dir(tmp_path, env, algorithm="r2d2", seed=seed)
    out = tmp_path / f"policy-{fmt}"
    check = export_policy(apexrl.load_policy(folder), fmt, out)
    assert check is not None and check.max_abs_diff == 0
    return apexrl.load_policy(folder), written(fmt, out)


@pytest.mark.parametrize(
    ("env", "obs"),
    [
        (ENV, {"dtype": "float32", "shape": ["batch", 4]}),
        ("FrozenLake-v1", {"dtype": "int64", "shape": ["batch"]}),  # one-hot encoded: the ints
        ("ALE/Pong-v5", {"dtype": "uint8", "shape": ["batch", 4, 84, 84]}),
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_json_line_names_the_state_its_shape_and_how_it_is_carried(tmp_path, capsys, env, obs, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    folder = run_dir(tmp_path, env, algorithm="r2d2")
    out = tmp_path / f"policy.{fmt}"
    assert cli.main(["export", str(folder), "--format", fmt, "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    core = 512 if env == "ALE/Pong-v5" else CORE  # images: the paper's LSTM
    state = ["batch", 2, core]
    assert report["inputs"] == [
        {"name": "obs", **obs},
        {"name": "state", "dtype": "float32", "shape": state},
        {"name": "prev_action", "dtype": "int64", "shape": ["batch"]},
        {"name": "prev_reward", "dtype": "float32", "shape": ["batch"]},
    ]
    assert report["outputs"] == [
        {"name": "action", "dtype": "int64", "shape": ["batch"]},
        {"name": "next_state", "dtype": "float32", "shape": state},
    ]
    assert report["carry"] == {"state": "next_state", "prev_action": "action", "prev_reward": "reward"}
    assert report["episode_start"] == {"state": 0, "prev_action": 0, "prev_reward": 0}
    assert report["checked"] is True and report["path"] == str(out)
    assert report["compared"] == {
        "observations": ROLLOUT_ENVS * ROLLOUT_STEPS,
        "environments": ROLLOUT_ENVS,
        "steps": ROLLOUT_STEPS,
        "max_abs_diff": 0,
    }
    assert "input" not in report and "output" not in report  # the feed-forward keys are a feed-forward file's


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_exported_policy_plays_real_episodes_as_load_policy_carrying_its_state(tmp_path, fmt):
    """The module docstring's loop, one environment without a batch axis: the state, action and reward carried
    from step to step and zeroed at each episode's start; every action is load_policy's (act, observe)."""
    policy, step = exported(tmp_path, fmt)
    env = policy.make_env()

    def start():
        return np.zeros((2, CORE), np.float32), np.asarray(0, np.int64), np.asarray(0, np.float32)

    state, prev_action, prev_reward = start()
    mine = policy.initial_state()
    obs, _ = env.reset(seed=0)
    episodes, actions = 0, []
    for _ in range(150):
        action, state = step(obs, state, prev_action, prev_reward)
        want, mine = policy.act(obs, mine)
        assert action.shape == () and state.shape == (2, CORE) and int(action) == want
        actions.append(want)
        obs, reward, terminated, truncated, _ = env.step(int(action))
        prev_action, prev_reward = action, np.asarray(reward, np.float32)
        mine = policy.observe(mine, reward)
        if terminated or truncated:
            episodes += 1
            obs, _ = env.reset()
            state, prev_action, prev_reward = start()
            mine = policy.initial_state()
    env.close()
    assert episodes >= 2 and len(set(actions)) == 2  # resets and both actions were exercised


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_of_environments_is_stepped_and_reset_row_by_row(tmp_path, fmt):
    """Three environments in one batch; an environment whose episode ended starts again from zeros in its row
    while the others go on; each row acts as load_policy does on that environment alone."""
    policy, step = exported(tmp_path, fmt)
    envs = [policy.make_env() for _ in range(3)]
    obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(envs)])
    state = np.zeros((3, 2, CORE), np.float32)
    prev_action, prev_reward = np.zeros(3, np.int64), np.zeros(3, np.float32)
    mine = [policy.initial_state() for _ in envs]
    resets = 0
    for _ in range(80):
        action, state = step(obs, state, prev_action, prev_reward)
        assert action.shape == (3,) and state.shape == (3, 2, CORE)
        done = np.zeros(3, bool)
        for i, e in enumerate(envs):
            want, mine[i] = policy.act(obs[i], mine[i])
            assert action[i] == want, f"environment {i}"
            obs[i], prev_reward[i], terminated, truncated, _ = e.step(int(action[i]))
            mine[i] = policy.observe(mine[i], prev_reward[i])
            if terminated or truncated:
                done[i], obs[i], mine[i] = True, e.reset()[0], policy.initial_state()
        prev_action = action.copy()
        state[done], prev_action[done], prev_reward[done] = 0.0, 0, 0.0
        resets += int(done.sum())
    for e in envs:
        e.close()
    assert resets >= 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_state_changes_what_the_exported_policy_does(tmp_path, fmt):
    policy, step = exported(tmp_path, fmt)
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(ROLLOUT_STEPS, 64, 4)).astype(np.float32)
    zeros = np.zeros((64, 2, CORE), np.float32)
    no_action, no_reward = np.zeros(64, np.int64), np.zeros(64, np.float32)
    # Carried over a sequence, the actions are load_policy's; with the state zeroed at every step they are not.
    state, action, mine = zeros, no_action, policy.initial_state(64)
    carried, forgetful = [], []
    for t in range(ROLLOUT_STEPS):
        action, state = step(obs[t], state, action, no_reward)
        want, mine = policy.act(obs[t], mine)
        np.testing.assert_array_equal(action, want)
        carried.append(action)
        forgetful.append(step(obs[t], zeros, no_action, no_reward)[0])
    assert (np.stack(carried) != np.stack(forgetful)).any()
    # The same observations from two states: other next states and other actions.
    first, after_zeros = step(obs[0], zeros, no_action, no_reward)
    second, after_carried = step(obs[0], state, no_action, no_reward)
    assert np.abs(after_zeros - after_carried).max() > 1e-3 and (first != second).any()
    # The previous reward is an input too (CartPoleNoVel's rewards are not clipped).
    _, after_reward = step(obs[0], zeros, no_action, np.full(64, 0.5, np.float32))
    assert np.abs(after_zeros - after_reward).max() > 1e-4


def test_atari_rewards_are_clipped_inside_the_export_as_training_clipped_them(tmp_path):
    policy, step = exported(tmp_path, "torchscript", "ALE/Pong-v5")
    obs = np.random.default_rng(0).integers(0, 256, (2, 4, 84, 84)).astype(np.uint8)
    state, action = np.zeros((2, 2, 512), np.float32), np.zeros(2, np.int64)
    _, one = step(obs, state, action, np.ones(2, np.float32))
    _, seven = step(obs, state, action, np.full(2, 7.0, np.float32))
    _, half = step(obs, state, action, np.full(2, 0.5, np.float32))
    np.testing.assert_array_equal(one, seven)
    assert np.abs(one - half).max() > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_that_parts_from_its_checkpoint_over_the_rollout_is_refused(tmp_path, fmt):
    """The check compares: a file written from other weights than those of the policy it is checked against is
    refused, naming the step; checked against the policy it came from, it passes."""
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    policy = apexrl.load_policy(run_dir(tmp_path / "mine", ENV, algorithm="r2d2"))
    other = apexrl.load_policy(run_dir(tmp_path / "other", ENV, algorithm="r2d2", seed=1))
    policy.greedy_module = other.greedy_module  # the file gets other weights than policy.act uses
    out = tmp_path / f"policy.{fmt}"
    with pytest.raises(
        RuntimeError,
        match=rf"^the exported policy {out} disagrees with the checkpoint's at step [0-9]+ of {ROLLOUT_STEPS} of "
        rf"a rollout carrying the state \({ROLLOUT_ENVS} environments\): [1-9][0-9]* of {ROLLOUT_ENVS} actions "
        r"differ \(largest difference 1\)$",
    ):
        export_policy(policy, fmt, out)
    check = check_recurrent_export(other, fmt, out)  # the same file, against the policy it was written from
    assert check is not None and (check.environments, check.steps, check.max_abs_diff) == (16, 20, 0.0)


def test_a_torchscript_export_names_the_shapes_it_takes_when_the_state_does_not_fit(tmp_path):
    _, step = exported(tmp_path, "torchscript")
    with pytest.raises(
        torch.jit.Error,
        match=r"for observations of shape \[3, 4\], state must be of shape \[3, 2, 64\] and prev_action and "
        r"prev_reward of shape \[3\], got \[2, 64\], \[3\] and \[3\]",
    ):
        step(
            np.zeros((3, 4), np.float32), np.zeros((2, CORE), np.float32), np.zeros(3, np.int64), np.zeros(3)
        )

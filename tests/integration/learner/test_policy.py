"""A trained policy used outside the fleet: `apexrl.load_policy` (learner/policy.py) plays one observation or a
batch greedily on the CPU, and `apexrl export` (learner/export.py) writes TorchScript or ONNX files whose actions on
real observations are load_policy's, for Ape-X DQN (CartPole, FrozenLake's one-hot observations) and DPG (Pendulum),
given a batch or one observation alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import apexrl
from apexrl.algorithms.checkpoint import save_checkpoint
from apexrl.common.env_settings import EnvChoice, EnvKwargs
from apexrl.common.environments import env_spaces, make_env
from apexrl.launcher import cli
from apexrl.learner.export import CHECK_ROWS, check_export, export_policy
from tests.integration.learner.test_evaluate import balancing_network
from tests.support.checkpoints import dqn_checkpoint, fresh_checkpoint

ROOT = Path(__file__).resolve().parents[3]


def run_dir(tmp_path: Path, env: EnvChoice | str, **changes) -> Path:
    choice = env if isinstance(env, EnvChoice) else EnvChoice(env)
    folder = tmp_path / choice.run_name()
    save_checkpoint(
        folder / "checkpoints" / "checkpoint.pt",
        fresh_checkpoint(
            choice.id, env_spaces(choice), env_module=choice.modules, env_kwargs=choice.kwargs, **changes
        ),
    )
    return folder


def real_observations(choice: EnvChoice | str, steps: int = 60, raw: bool = False) -> np.ndarray:
    """Observations of random play (as the raw environment gives them with `raw`: FrozenLake's ints)."""
    import gymnasium as gym

    env = gym.make(choice) if raw else make_env(choice)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    seen = []
    for _ in range(steps):
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset(seed=int(rng.integers(1000)))
    env.close()
    return np.asarray(seen)


def test_load_policy_acts_on_one_observation_or_a_batch(tmp_path):
    folder = tmp_path / "balance"
    save_checkpoint(folder / "checkpoints" / "checkpoint.pt", dqn_checkpoint(balancing_network(), (2,)))
    policy = apexrl.load_policy(folder)
    obs = real_observations("CartPole-v1")
    want = (obs @ np.array([0.1, 0.5, 1.0, 1.0]) > 0).astype(np.int64)  # the balancing controller
    np.testing.assert_array_equal(policy.act(obs), want)
    single = policy.act(obs[0])
    assert isinstance(single, int) and single == want[0]
    # The stateful way: (action, state); a feed-forward policy's state is None.
    state = policy.initial_state(len(obs))
    actions, state = policy.act(obs, state)
    np.testing.assert_array_equal(actions, want)
    assert state is None and policy.act(obs[0], policy.initial_state()) == (want[0], None)
    assert (policy.algorithm, policy.updates, policy.env.id) == ("dqn", 12, "CartPole-v1")
    env = policy.make_env()
    first, _ = env.reset(seed=3)
    env.step(policy.act(first))
    env.close()
    with pytest.raises(ValueError, match=r"must be of shape \(4,\) \(one\) or \[batch, 4\]"):
        policy.act(np.zeros(5))
    with pytest.raises(FileNotFoundError):
        apexrl.load_policy(tmp_path / "nothing-here")


def test_a_dpg_policy_acts_inside_its_bounds(tmp_path):
    policy = apexrl.load_policy(run_dir(tmp_path, "Pendulum-v1"))
    obs = real_observations("Pendulum-v1")
    actions = policy.act(obs)
    assert actions.shape == (len(obs), 1) and actions.dtype == np.float32
    assert (np.abs(actions) <= 2.0).all() and np.ptp(actions) > 0
    np.testing.assert_array_equal(policy.act(obs[0]), actions[0])


def test_one_hot_observations_are_taken_as_the_raw_environments_ints_or_as_vectors(tmp_path):
    choice = EnvChoice("FrozenLake-v1", kwargs=EnvKwargs({"map_name": "8x8"}))
    policy = apexrl.load_policy(run_dir(tmp_path, choice))
    assert policy.env == choice and policy.spaces.obs_one_hot
    cells = np.arange(64)
    by_int = policy.act(cells)
    np.testing.assert_array_equal(by_int, policy.act(np.eye(64, dtype=np.float32)))
    assert [policy.act(int(c)) for c in cells] == by_int.tolist()
    assert policy.act(np.int64(5)) == by_int[5]


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1"])
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_an_export_acts_as_load_policy_on_real_observations(tmp_path, capsys, env, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        ort = pytest.importorskip("onnxruntime")
    folder = run_dir(tmp_path, env)
    out = tmp_path / f"policy.{fmt}"
    assert cli.main(["export", str(folder), "--format", fmt, "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["path"] == str(out) and report["checked"] is True and out.stat().st_size > 0
    compared = report["compared"]
    assert compared["observations"] == CHECK_ROWS and 0 <= compared["max_abs_diff"] <= 1e-4, compared
    policy = apexrl.load_policy(folder)
    obs = real_observations(env, raw=env == "FrozenLake-v1")  # FrozenLake: the raw environment's ints
    want = policy.act(obs)
    if fmt == "torchscript":
        module = torch.jit.load(str(out))

        def run(batch: np.ndarray) -> np.ndarray:
            return module(torch.as_tensor(batch)).numpy()
    else:
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])

        def run(batch: np.ndarray) -> np.ndarray:
            return session.run(["action"], {"obs": np.asarray(batch)})[0]

    got = run(obs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # One observation, as the environment gives it, as policy.act takes it: its action without the batch axis.
    for k in (0, len(obs) // 2):
        one, expected = run(obs[k]), np.asarray(policy.act(obs[k]))
        assert one.shape == expected.shape == want.shape[1:] and one.dtype == want.dtype
        np.testing.assert_allclose(one, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_an_export_that_acts_otherwise_than_its_checkpoint_is_refused(tmp_path, env, fmt):
    """The check compares: a file written from other weights than those of the policy it is checked against is
    refused, naming how many observations disagree; checked against the policy it came from, it passes."""
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    policy = apexrl.load_policy(run_dir(tmp_path / "mine", env))
    other = apexrl.load_policy(run_dir(tmp_path / "other", env, seed=1))
    policy.greedy_module = other.greedy_module  # the file gets other weights than policy.act uses
    out = tmp_path / f"policy.{fmt}"
    with pytest.raises(
        RuntimeError,
        match=rf"^the exported policy {out} disagrees with the checkpoint's on [1-9][0-9]* of {CHECK_ROWS} "
        rf"observations \(largest difference ",
    ):
        export_policy(policy, fmt, out)
    check = check_export(other, fmt, out)  # the same file, against the policy it was written from
    assert check is not None and check.observations == CHECK_ROWS and check.max_abs_diff <= 1e-4, check


def test_a_torchscript_export_names_the_shapes_it_takes_when_given_another(tmp_path):
    folder = run_dir(tmp_path, "CartPole-v1")
    out = tmp_path / "policy.pt"
    export_policy(apexrl.load_policy(folder), "torchscript", out)
    module = torch.jit.load(str(out))
    assert module(torch.zeros(3, 2, 4)).shape == (3, 2)  # leading axes are kept, as a batch's
    with pytest.raises(
        torch.jit.Error, match=r"observations must be of shape \[4\] \(one\) or \[batch\] \+ \[4\]"
    ):
        module(torch.zeros(5))


def test_export_defaults_to_the_run_directory_and_names_the_onnx_extra_when_it_is_missing(tmp_path):
    folder = run_dir(tmp_path, "CartPole-v1")
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "export", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (folder / "policy.pt").is_file()
    shadow = tmp_path / "no-onnx"
    (shadow / "onnx").mkdir(parents=True)
    (shadow / "onnx" / "__init__.py").write_text("raise ImportError('No module named onnx')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "export", str(folder), "--format", "onnx"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "apexrl export: error: ONNX export needs the onnx extra: pip install 'apexrl[onnx]'"
    )


def test_importing_apexrl_loads_neither_torch_nor_gymnasium():
    code = "import sys, apexrl; print('torch' in sys.modules, 'gymnasium' in sys.modules, callable(apexrl.load_policy))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False", "True"]

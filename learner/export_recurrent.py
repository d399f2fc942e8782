"""`apexrl export` of a recurrent policy (R2D2): the state goes in and comes out, and the file is checked against
`load_policy` over a rollout that carries the state through both.

The exported module (`apexrl.algorithms.torch_forward.RecurrentOneOrBatch`) takes four inputs and gives two:

    obs          the observations, as the environment gives them (as for a feed-forward export)
    state        float32 [batch, 2, core]: the LSTM's h and c stacked (as replay items store them)
    prev_action  int64 [batch]: the action the previous step returned
    prev_reward  float32 [batch]: the reward the environment answered it with, as the environment gives it
                 (clipped to [-1, 1] inside where training clipped it: Atari)
    ->
    action       int64 [batch]: the greedy actions
    next_state   float32 [batch, 2, core]: the state to give the next step

At an episode's start `state`, `prev_action` and `prev_reward` are all zeros (what `TrainedPolicy.initial_state`
and the actors start from); each step then feeds `next_state`, `action` and the reward back. One packed `state`
rather than `h` and `c`: it is what a caller must carry and zero, and nothing about it needs reading, so one
tensor is one thing to get right (the core's size is its last axis; the JSON line gives the shape). The previous
action and reward stay inputs of their own: the caller's loop holds them anyway (it just acted and was answered).
Like the feed-forward export, the module also takes one environment's
step without the batch axis: obs of the observation's shape, state [2, core], 0-d prev_action and prev_reward,
giving a 0-d action and a [2, core] next state. An ONNX file declares its inputs and outputs by element type alone
(for that), so give it numpy arrays of exactly those types (onnxruntime takes no numpy scalars: np.asarray them).

One environment with onnxruntime (`policy.onnx` from a CartPoleNoVel-v1 run: core 64):

    import apexrl, numpy as np, onnxruntime
    session = onnxruntime.InferenceSession("policy.onnx")
    env = apexrl.load_policy("runs/CartPoleNoVel-v1-TIMESTAMP").make_env()
    start = lambda: (np.zeros((2, 64), np.float32), np.asarray(0, np.int64), np.asarray(0, np.float32))
    state, prev_action, prev_reward = start()
    obs, _ = env.reset(seed=0)
    for _ in range(1000):
        action, state = session.run(["action", "next_state"], {"obs": obs, "state": state,
                                    "prev_action": prev_action, "prev_reward": prev_reward})
        obs, reward, terminated, truncated, _ = env.step(int(action))
        prev_action, prev_reward = action, np.asarray(reward, np.float32)
        if terminated or truncated:          # a new episode starts from zeros
            obs, _ = env.reset()
            state, prev_action, prev_reward = start()

A batch of environments with TorchScript (`obs` [n, ...] from n environments; `done` bool [n] their episode ends):

    module = torch.jit.load("policy.pt")
    state, prev_action, prev_reward = torch.zeros(n, 2, 64), torch.zeros(n, dtype=torch.int64), torch.zeros(n)
    action, state = module(torch.as_tensor(obs), state, prev_action, prev_reward)
    ...                                      # step the environments with action.numpy(): rewards, done
    prev_action, prev_reward = action, torch.as_tensor(rewards, dtype=torch.float32)
    done = torch.as_tensor(done)
    state[done], prev_action[done], prev_reward[done] = 0.0, 0, 0.0   # those environments start again

The check after writing: ROLLOUT_ENVS environments of random observations and random rewards (normal, scale 2,
so clipping shows) for ROLLOUT_STEPS steps, each stepped by the file (its state carried as above) and by
`load_policy` (`act(obs, state)`, `observe(state, reward)`), the actions compared at every step, then the first
environment alone through the file's one-environment form; a disagreement is an error naming the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.learner.export_format import (
    input_dtype,
    load_written,
    obs_shape,
    sample_observations,
    write_module,
)

if TYPE_CHECKING:
    from apexrl.learner.policy import TrainedPolicy

INPUTS = ("obs", "state", "prev_action", "prev_reward")
OUTPUTS = ("action", "next_state")
ROLLOUT_ENVS = 16
ROLLOUT_STEPS = 20
TOLERANCE = 1e-4  # relative and absolute, as the feed-forward check's


@dataclass(frozen=True)
class RolloutCheck:
    """What stepping a written recurrent file and its policy side by side found: `environments` stepped
    `steps` times, and the largest absolute difference between their actions (within the tolerance, or the file
    would have been refused)."""

    environments: int
    steps: int
    max_abs_diff: float

    @property
    def observations(self) -> int:
        return self.environments * self.steps

    def report(self) -> dict[str, Any]:
        """What the JSON line's `compared` says."""
        return {
            "observations": self.observations,
            "environments": self.environments,
            "steps": self.steps,
            "max_abs_diff": self.max_abs_diff,
        }


def state_shape(policy: TrainedPolicy) -> tuple[int, ...]:
    """One environment's exported state ([2, core] for R2D2)."""
    return tuple(policy.greedy_module().state_shape)


def recurrent_signature(policy: TrainedPolicy) -> dict[str, Any]:
    """The JSON line's `inputs` and `outputs` (batch shapes; drop "batch" for one environment), what each state
    input is fed from the step before (`carry`), and its value at an episode's start (`episode_start`)."""
    state = ["batch", *state_shape(policy)]
    return {
        "inputs": [
            {"name": "obs", "dtype": input_dtype(policy).name, "shape": obs_shape(policy)},
            {"name": "state", "dtype": "float32", "shape": state},
            {"name": "prev_action", "dtype": "int64", "shape": ["batch"]},
            {"name": "prev_reward", "dtype": "float32", "shape": ["batch"]},
        ],
        "outputs": [
            {"name": "action", "dtype": "int64", "shape": ["batch"]},
            {"name": "next_state", "dtype": "float32", "shape": state},
        ],
        "carry": {"state": "next_state", "prev_action": "action", "prev_reward": "reward"},
        "episode_start": {"state": 0.0, "prev_action": 0, "prev_reward": 0.0},
    }


def export_recurrent(policy: TrainedPolicy, fmt: str, out: Path) -> RolloutCheck | None:
    """Write the recurrent `policy` to `out` in `fmt` and check it (`check_recurrent_export`)."""
    import torch

    module = policy.greedy_module()
    example = (
        torch.as_tensor(sample_observations(policy, 2, seed=0)),
        torch.zeros(2, *module.state_shape),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2),
    )
    write_module(module, fmt, out, example, INPUTS, OUTPUTS)
    return check_recurrent_export(policy, fmt, out)


def check_recurrent_export(
    policy: TrainedPolicy, fmt: str, out: Path, environments: int = ROLLOUT_ENVS, steps: int = ROLLOUT_STEPS
) -> RolloutCheck | None:
    """Step the file at `out` and `policy` side by side over `steps` steps of `environments` random observations
    and rewards, each carrying its own state, and compare the actions at every step; then the first environment
    alone through the file's one-environment form. None when nothing here can run the file; RuntimeError naming
    the first step where an action differs by more than the tolerance or its shape does."""
    runner = load_written(fmt, out, INPUTS, OUTPUTS)
    if runner is None:
        return None
    rng = np.random.default_rng(1)
    flat = sample_observations(policy, environments * steps, seed=1)
    obs = flat.reshape(steps, environments, *flat.shape[1:])
    rewards = rng.normal(scale=2.0, size=(steps, environments)).astype(np.float32)
    shape = state_shape(policy)
    want = _rollout_policy(policy, obs, rewards)
    carried = (np.zeros((environments, *shape), np.float32), np.zeros(environments, np.int64))
    state, action = carried
    largest = 0.0
    for t in range(steps):
        action, state = runner(obs[t], state, action, rewards[t - 1] if t else np.zeros_like(rewards[0]))
        largest = max(largest, _compare(out, want[t], action, t, steps, f"{environments} environments"))
    state, action = np.zeros(shape, np.float32), np.asarray(0, np.int64)
    for t in range(steps):  # the first environment alone: no batch axis anywhere
        reward = np.asarray(rewards[t - 1, 0] if t else 0.0, np.float32)
        action, state = runner(obs[t, 0], state, action, reward)
        largest = max(largest, _compare(out, want[t, 0], action, t, steps, "one environment alone"))
    return RolloutCheck(environments=environments, steps=steps, max_abs_diff=largest)


def _rollout_policy(policy: TrainedPolicy, obs: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """load_policy's actions [steps, environments] over the rollout, its state carried by act and observe."""
    state = policy.initial_state(obs.shape[1])
    actions = []
    for t in range(len(obs)):
        action, state = policy.act(obs[t], state)
        state = policy.observe(state, rewards[t])
        actions.append(np.asarray(action))
    return np.stack(actions)


def _compare(out: Path, want: np.ndarray, got: np.ndarray, step: int, steps: int, where: str) -> float:
    """The largest absolute difference between the file's actions and the policy's at `step`; RuntimeError when
    they differ in shape or beyond the tolerance."""
    want, got = np.asarray(want), np.asarray(got)
    if want.shape != got.shape:
        raise RuntimeError(
            f"the exported policy {out} gives actions of shape {list(got.shape)} where the checkpoint's give "
            f"{list(want.shape)} at step {step + 1} of {steps} ({where})"
        )
    close = np.isclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
    if not close.all():
        raise RuntimeError(
            f"the exported policy {out} disagrees with the checkpoint's at step {step + 1} of {steps} of a "
            f"rollout carrying the state ({where}): {int(close.size - close.sum())} of {close.size} actions "
            f"differ (largest difference {diff.max():.6g})"
        )
    return float(diff.max(initial=0.0))

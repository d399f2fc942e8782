"""R2D2 on the actor's side: the recurrent Q-network rebuilt from the published weights, its state carried from step
to step per environment (and reset at episode ends), epsilon-greedy exploration with Ape-X's per-actor epsilons,
and the initial priority of a window from the Q-values the actor computed while acting.

`make_policy` evaluates an MLP torso with numpy (an LSTMCell is a few matrix products), a convolutional one with
torch (torch_policy.py, rebuilt from the weights' names and shapes); tests check both against the learner's network
on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from apexrl.algorithms.base import ActorSettings
from apexrl.algorithms.dqn.exploration import apex_epsilon, epsilon_greedy
from apexrl.algorithms.forward import dense, dense_stack, flat_float, is_convolutional, relu_stack
from apexrl.algorithms.r2d2.rescaling import rescale, unscale
from apexrl.common.spaces import EnvSpaces


@dataclass(frozen=True)
class CoreState:
    """What an environment's policy carries between steps: the LSTM's (h, c), and the previous action and reward
    (the core's inputs besides the observation), one row per environment."""

    h: np.ndarray  # float32 [B, core]
    c: np.ndarray  # float32 [B, core]
    prev_action: np.ndarray  # int64 [B]
    prev_reward: np.ndarray  # float32 [B]

    def item_fields(self, rows: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
        """The state of environments `rows` as a window starting now stores it (`state` [n, 2, core])."""
        return {
            "state": np.stack([self.h[rows], self.c[rows]], axis=1),
            "prev_action": self.prev_action[rows],
            "prev_reward": self.prev_reward[rows],
        }


class NumpyRecurrentPolicy:
    """Q(s_t, .) and the next LSTM state of a RecurrentQNetwork with an MLP torso, from its named weights."""

    def __init__(self, weights: Mapping[str, np.ndarray], input_scale: float = 1.0) -> None:
        if is_convolutional(weights):
            raise ValueError("weights of a convolutional network: use make_policy (torch)")
        try:
            self._torso = dense_stack(weights, "torso")
            self._value = dense(weights, "value")
            self._advantage = dense(weights, "advantage")
            self._w_ih = np.asarray(weights["core.weight_ih"], np.float32).T.copy()
            self._w_hh = np.asarray(weights["core.weight_hh"], np.float32).T.copy()
            self._bias = np.asarray(weights["core.bias_ih"], np.float32) + np.asarray(
                weights["core.bias_hh"], np.float32
            )
        except KeyError as err:
            raise ValueError(f"weights are not a RecurrentQNetwork state dict: missing {err}") from None
        self.num_actions = self._advantage[0].shape[1]
        self.core_size = self._w_hh.shape[0]
        self.input_scale = float(input_scale)

    def step(self, obs: np.ndarray, state: CoreState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Q-values [B, A], h, c) after one step of a batch of observations from `state`."""
        features = relu_stack(flat_float(obs, self.input_scale), self._torso)
        one_hot = np.eye(self.num_actions, dtype=np.float32)[state.prev_action]
        x = np.concatenate([features, one_hot, state.prev_reward.astype(np.float32)[:, None]], axis=1)
        gates = x @ self._w_ih + state.h @ self._w_hh + self._bias
        i, f, g, o = np.split(gates, 4, axis=1)
        c = _sigmoid(f) * state.c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        value = h @ self._value[0] + self._value[1]
        advantage = h @ self._advantage[0] + self._advantage[1]
        return value + advantage - advantage.mean(axis=1, keepdims=True), h, c


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow warnings for large |x|


def make_policy(weights: Mapping[str, np.ndarray], spaces: EnvSpaces, torch_threads: int = 1) -> Any:
    """The policy of these weights: numpy for an MLP torso, torch (`torch_threads` threads) for a convolutional one."""
    if not is_convolutional(weights):
        return NumpyRecurrentPolicy(weights, input_scale=spaces.input_scale)
    import torch

    from apexrl.algorithms.r2d2.torch_policy import TorchRecurrentPolicy

    torch.set_num_threads(torch_threads)
    return TorchRecurrentPolicy(weights, layout=spaces.layout, input_scale=spaces.input_scale)


class RecurrentActing:
    """How roles step a recurrent policy (algorithms/base.py, StatefulActing): the state per environment starts at
    zeros, each step moves it on, and an environment whose episode ended starts again from zeros. Exploration is
    epsilon-greedy with this actor's epsilon (0: greedy)."""

    def __init__(self, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon ({epsilon!r}) must be in [0, 1]")
        self.name, self.scale = "epsilon", float(epsilon)
        self._rng = rng if rng is not None else np.random.default_rng()
        self.last_q: np.ndarray | None = (
            None  # the Q-values of the latest step (a writer's initial priorities)
        )

    def describe(self) -> str:
        return f"epsilon {self.scale:.4f}"

    def initial_state(self, batch: int, core_size: int = 0) -> CoreState:
        zeros = np.zeros((batch, core_size), np.float32)
        return CoreState(zeros, zeros.copy(), np.zeros(batch, np.int64), np.zeros(batch, np.float32))

    def act(self, policy: Any, obs: np.ndarray, state: CoreState) -> tuple[np.ndarray, CoreState]:
        return self._step(policy, obs, state, self.scale)

    def greedy(self, policy: Any, obs: np.ndarray, state: CoreState) -> tuple[np.ndarray, CoreState]:
        return self._step(policy, obs, state, 0.0)

    def prepare(self, policy: Any, state: CoreState) -> CoreState:
        """A state made before the policy's size was known (zeros of no width) as zeros of its core's size."""
        if state.h.shape[1] != policy.core_size:
            return self.initial_state(len(state.prev_action), policy.core_size)
        return state

    def _step(
        self, policy: Any, obs: np.ndarray, state: CoreState, epsilon: float
    ) -> tuple[np.ndarray, CoreState]:
        state = self.prepare(policy, state)
        q, h, c = policy.step(obs, state)
        self.last_q = q
        actions = epsilon_greedy(q, epsilon, self._rng) if epsilon else q.argmax(axis=1).astype(np.int64)
        return actions, CoreState(h, c, actions, state.prev_reward)

    def observe(self, state: CoreState, rewards: np.ndarray) -> CoreState:
        """The state once the environments answered the last actions with `rewards` (the core's next input)."""
        return replace(state, prev_reward=np.asarray(rewards, np.float32))

    def reset(self, state: CoreState, done: np.ndarray) -> CoreState:
        keep = ~np.asarray(done, bool)
        return CoreState(
            state.h * keep[:, None],
            state.c * keep[:, None],
            state.prev_action * keep,
            state.prev_reward * keep,
        )


def make_explorer(settings: ActorSettings, spaces: EnvSpaces, rng: np.random.Generator) -> RecurrentActing:
    """Actor i of N explores with Ape-X's epsilon_i (R2D2 keeps them); the evaluator plays greedily. The explorer is
    the recurrent acting itself (it needs the state to act at all)."""
    epsilon = 0.0 if settings.evaluate else apex_epsilon(settings.actor_index, settings.num_actors)
    return RecurrentActing(epsilon, rng)


def make_stateful(explorer: RecurrentActing | None = None) -> RecurrentActing:
    """How roles step this policy: `explorer` (make_explorer's), or greedy only (`load_policy`, `apexrl
    evaluate`)."""
    return explorer if explorer is not None else RecurrentActing(0.0)


def make_greedy_module(weights: Mapping[str, np.ndarray], spaces: EnvSpaces) -> Any:
    """The recurrent module `apexrl export` writes (`torch_policy.GreedyRecurrent`), for a batch: (observations,
    state [B, 2, core], previous action, previous reward) -> (greedy actions int64 [B], next state). One-hot encoded
    Discrete observations are taken as int64 indices."""
    from apexrl.algorithms.r2d2.torch_policy import GreedyRecurrent, RecurrentQModule

    one_hot = spaces.obs_dim if spaces.obs_one_hot else 0
    return GreedyRecurrent(RecurrentQModule(weights, spaces.layout, spaces.input_scale), one_hot).eval()


def window_priority(
    q: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    discount: np.ndarray,
    *,
    n_step: int,
    eta: float = 0.9,
    terminal: bool = False,
) -> float:
    """A window's initial priority from the actor's own Q-values along it (`q` [L, A], the rescaled values it acted
    on): R2D2's eta * max|delta| + (1 - eta) * mean|delta| over the steps with a target, with the actor's network
    standing in for the online and the target one (so the double-Q argmax is its own max)."""
    length = len(action)
    deltas = []
    for t in range(length):
        k = min(n_step, length - 1 - t)
        if k == 0 and not (terminal and t == length - 1):
            continue
        ret, scale = 0.0, 1.0
        for j in range(k or 1):  # the terminal last step: its own reward
            ret += scale * float(reward[t + j])
            scale *= float(discount[t + j])
        target = ret if k == 0 else ret + scale * float(unscale(np.float64(q[t + k].max())))
        deltas.append(abs(float(rescale(np.float64(target))) - float(q[t, action[t]])))
    if not deltas:
        return 0.0
    magnitude = np.asarray(deltas)
    return float(eta * magnitude.max() + (1.0 - eta) * magnitude.mean())

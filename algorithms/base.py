"""The interfaces of the seam: what the actor loop, the evaluator, the learner loop, the launcher and the checkpoints
ask of an algorithm's writing, acting and learning halves. Protocols only (no torch import: `Tensor` is a name for
type checkers).

The writing side (the algorithm's `writing_module`: how actors turn steps into replay items) provides
    make_writer(settings: WriterSettings, spaces) -> ItemWriter   (one per environment)
    item_columns(items) -> dict[str, np.ndarray]                  (the columns of one insert)
    replay_signature(spaces, compression) -> Signature             (the table signature that follows)
the actor side (`acting.py` of an algorithm) provides
    make_policy(weights, spaces, torch_threads=1) -> ActingPolicy
    make_explorer(settings: ActorSettings, spaces, rng) -> Explorer
    make_stateful(explorer=None) -> StatefulActing   (how roles step it; feed-forward ones through `Stateless`;
                                                       no explorer: greedy only)
    make_greedy_module(weights, spaces) -> torch.nn.Module   (observations -> greedy actions; `apexrl export`;
                                                              a recurrent policy's: (obs, state, prev_action,
                                                              prev_reward) -> (actions, next state), one
                                                              environment's state of shape `state_shape`)
and the learner side (`learning.py`) provides
    make_learning(settings: LearnerSettings, spaces, device) -> Learning
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


class WriterSettings(Protocol):
    """The actor settings an item writer reads (ActorConfig has them)."""

    n_step: int
    gamma: float


class ItemWriter(Protocol):
    """Turns one environment's steps into replay items (DQN and DPG: n-step transitions, algorithms/nstep.py)."""

    def push(
        self,
        obs: np.ndarray,
        action: int | np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> list[Any]:
        """Record one step (`next_obs`: the real last observation at an episode's end); return the items it
        completed, oldest first."""
        ...

    def reset(self) -> None:
        """Drop the steps of an episode abandoned without a terminal step."""
        ...


class ActingPolicy(Protocol):
    """An actor's copy of the policy, rebuilt from the published weights alone."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The policy's own actions for a batch of observations as the environment gives them (no exploration):
        int64 [batch] for Discrete, float32 [batch, action_dim] inside the bounds for a Box."""
        ...

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|n-step TD error| (float64 [batch]) of a batch of transitions at their stored actions, with this one
        copy standing in for the online and the target networks (Ape-X: actors compute initial priorities)."""
        ...


class Explorer(Protocol):
    """How one actor departs from the greedy policy; `scale` (its epsilon or noise scale) is exported as the
    metric `name`."""

    name: str
    scale: float

    def describe(self) -> str:
        """Its settings in a few words for the actor's start-up log (e.g. "epsilon 0.0160")."""
        ...

    def actions(self, policy: ActingPolicy, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (one per environment of the actor)."""
        ...


# An acting state: what a policy carries from one step of an environment to the next (a recurrent core's memory,
# one entry per environment); None for a feed-forward policy.
State = Any


class StatefulActing(Protocol):
    """How the actor, the evaluator and `load_policy` step a policy: an initial state per environment,
    `act(policy, obs, state) -> (actions, state)` (exploring), `greedy(...)` the same without exploration, the
    rewards the environments answered with `observe`d, and the state of environments whose episode ended reset.
    The policy is passed in, so it can be rebuilt from newer weights between two steps while the state goes on."""

    def initial_state(self, batch: int) -> State:
        """The state of `batch` environments at the start of their episodes."""
        ...

    def act(self, policy: ActingPolicy, obs: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Exploring actions for a batch of observations (one per environment), and the state after them."""
        ...

    def greedy(self, policy: ActingPolicy, obs: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """The policy's own actions (no exploration), and the state after them."""
        ...

    def observe(self, state: State, rewards: np.ndarray) -> State:
        """The state once the environments answered the last actions with `rewards` (a recurrent core that takes
        the previous reward as an input keeps it; others leave the state as it is)."""
        ...

    def prepare(self, policy: ActingPolicy, state: State) -> State:
        """`state` ready for `policy`: one made before any policy was known (an actor's first state) gets the
        policy's size; otherwise unchanged."""
        ...

    def reset(self, state: State, done: np.ndarray) -> State:
        """`state` with the entries of environments whose episode ended (`done`, bool [batch]) back at their
        initial value: the next step starts a new episode."""
        ...


class Stateless:
    """The StatefulActing of a feed-forward policy (DQN, DPG): the state is None throughout, and acting is its
    explorer's (or its greedy) actions, exactly as without a state."""

    def __init__(self, explorer: Explorer | None = None) -> None:
        self.explorer = explorer  # None: greedy only

    def initial_state(self, batch: int) -> None:
        return None

    def act(self, policy: ActingPolicy, obs: np.ndarray, state: None) -> tuple[np.ndarray, None]:
        if self.explorer is None:
            raise TypeError("this acting has no explorer: it acts greedily only")
        return self.explorer.actions(policy, obs), None

    def greedy(self, policy: ActingPolicy, obs: np.ndarray, state: None) -> tuple[np.ndarray, None]:
        return policy.greedy(obs), None

    def observe(self, state: None, rewards: np.ndarray) -> None:
        return None

    def prepare(self, policy: ActingPolicy, state: None) -> None:
        return None

    def reset(self, state: None, done: np.ndarray) -> None:
        return None


class ActorSettings(Protocol):
    """The actor settings exploration reads (ActorConfig has them)."""

    actor_index: int
    num_actors: int
    evaluate: bool
    epsilon: float | None
    noise_scale: float | None
    noise_correlation: float | None
    random_steps: int | None


@dataclass
class UpdateResult:
    """What one update reports: `td_abs` |TD error| per row (new priorities before epsilon), `loss` the loss the
    priorities come from (a 0-d tensor: reading it synchronises the device), and optional `stats` (floats) for
    metrics and curves (see `Learning.update`)."""

    td_abs: torch.Tensor
    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


class Learning(Protocol):
    """An algorithm's learner half: its networks, optimisers and targets, updated one prioritized batch at a time.

    `architecture` (plain values: torso, layer sizes, ...) is saved in checkpoints and must match on resume.
    """

    architecture: dict[str, Any]

    def update(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor, step: int) -> UpdateResult:
        """One update on a batch of replay columns with importance weights; `step` counts updates from 1, so an
        algorithm can act every k updates (target copies, delayed policy updates)."""
        ...

    def acting_weights(self) -> dict[str, np.ndarray]:
        """The weights actors and the evaluator need, as `name -> array` (published; kept in checkpoints)."""
        ...

    def batch_stats(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Statistics of the current networks on a batch for metrics: `mean_q` (float), and for continuous actions
        `action_mean` / `action_std` (one float per action dimension)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything training needs to continue (networks, targets, optimisers), as tensors and plain values."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def describe(self) -> str:
        """One line for the start-up log: torsos, layer sizes, learning rates."""
        ...

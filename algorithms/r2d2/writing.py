"""R2D2's replay items: overlapping windows of `burn_in + train_length` steps, a new one every `period` steps, never
across an episode's end, written by each environment of an actor as its own trajectory of a sequence table
(replay.proto, "Sequence tables"; the SDK's SequenceWriter, which the actor makes, does the windowing, the
acknowledgement and failover: this module only says what a step and a window hold).

A step is stored as
    obs       the observation acted on (an image compressed as one frame, setting `compress`)
    action    the action taken
    reward    the reward it brought (clipped as the actor's settings say)
    discount  gamma, or 0 when the episode terminated with this step
and each window carries, as its item fields, what the learner's unroll starts from: the LSTM state before its first
step (`state` [2, core]: h, c), the core's other inputs there (`prev_action`, `prev_reward`), whether that step
starts an episode (`episode_start`: the stored state is then exact and needs no burn-in), and the weights version
the actor acted with when the window was complete (`weight_version`: the learner's parameter lag per item). Its
initial priority is R2D2's eta-mix of the n-step TD errors of the actor's own Q-values along it (acting.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl.algorithms.r2d2.acting import CoreState, window_priority
from apexrl.algorithms.r2d2.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CORE_SIZE,
    DEFAULT_GEOMETRY,
    DEFAULT_N_STEP,
)
from apexrl.algorithms.torso_specs import resolve_network
from apexrl.common.compression import compress, is_image
from apexrl.common.signature import ROW_VERSION_COLUMN, Signature
from apexrl.common.spaces import VECTOR, EnvSpaces

# The actor writes windows of a sequence table (the SDK's SequenceWriter per environment), not transitions.
SEQUENCES = True


@dataclass(frozen=True)
class Geometry:
    """The windows: `burn_in` steps that only warm the state up, `train_length` steps trained on, a new window
    every `period` steps; `n_step` and `eta` for the initial priorities."""

    burn_in: int
    train_length: int
    period: int
    gamma: float
    n_step: int = 5
    eta: float = 0.9

    def __post_init__(self) -> None:
        if self.burn_in < 0 or self.train_length < 1:
            raise ValueError(
                f"burn_in ({self.burn_in}) must be >= 0 and train_length ({self.train_length}) >= 1"
            )
        if not 1 <= self.period <= self.length:
            raise ValueError(
                f"sequence_period ({self.period}) must be in [1, burn_in + train_length ({self.length})]: a longer "
                f"period would leave steps in no sequence"
            )

    @property
    def length(self) -> int:
        """Steps per window: what the shards' max_sequence_length must be."""
        return self.burn_in + self.train_length

    @property
    def windows_per_request(self) -> int:
        """Windows an environment's writer sends per request (SequenceWriter): those that complete within one
        window's length (3 for the defaults, 2 for the paper's half overlap). A shard's and the SDK's CPU is mostly
        per request (~550 us of the shard's per request at one window each: bench/README.md, sequence_throughput),
        so this divides it per window; a window then waits at most length - period steps before it is sent, less
        than the steps it took to fill it (a sampled window is at least `length` steps old anyway)."""
        return max(1, self.length // self.period)


def geometry(settings: Any, spaces: EnvSpaces) -> Geometry:
    """The windows an actor with these settings writes (their defaults by kind of observation: defaults.py)."""
    burn_in, train_length, period = DEFAULT_GEOMETRY[spaces.layout != VECTOR]
    given = (getattr(settings, name, None) for name in ("burn_in", "train_length", "sequence_period"))
    burn_in, train_length, period = (
        default if value is None else value
        for value, default in zip(given, (burn_in, train_length, period), strict=True)
    )
    return Geometry(burn_in, train_length, period, settings.gamma, DEFAULT_N_STEP)


def table_settings(actor: Any, learner: Any, spaces: EnvSpaces) -> dict[str, Any]:
    """What the shards of an R2D2 fleet are started with besides the step signature: the longest window
    (max_sequence_length) and the fields of each (item_signature: the LSTM's size is the learner's)."""
    kind = resolve_network(getattr(learner, "network", "auto"), spaces)
    core = getattr(learner, "lstm_size", None) or DEFAULT_CORE_SIZE[kind]
    return {"max_sequence_length": geometry(actor, spaces).length, "item_signature": item_signature(core)}


def learner_settings(actor: dict[str, Any]) -> dict[str, Any]:
    """What `apexrl launch` gives an R2D2 learner that its fleet-file table does not set: the actors' burn-in (both
    cut the same windows) and its batch of sequences (defaults.DEFAULT_BATCH_SIZE)."""
    given = {"batch_size": DEFAULT_BATCH_SIZE}
    if actor.get("burn_in") is not None:
        given["sequence_burn_in"] = actor["burn_in"]
    return given


def replay_signature(spaces: EnvSpaces, compression: str | None) -> Signature:
    """The steps' fields (the table signature of an R2D2 fleet's shards)."""
    obs_dtype = np.dtype(spaces.obs_dtype)
    obs_dtype = np.dtype(np.float32) if obs_dtype.kind == "f" else obs_dtype
    shape = ",".join(map(str, spaces.obs_shape))
    packed = f"@{compression}" if compression and is_image(obs_dtype, spaces.obs_shape) else ""
    return Signature.parse(
        f"obs:{obs_dtype.name}[{shape}]{packed},action:int64[],reward:float32[],discount:float32[]"
    )


def item_signature(core_size: int) -> Signature:
    """The fields each window carries (the shards' item signature)."""
    return Signature.parse(
        f"state:float32[2,{core_size}],prev_action:int64[],prev_reward:float32[],episode_start:bool[],"
        f"{ROW_VERSION_COLUMN}:int64[]"
    )


class StepEncoder:
    """One environment's steps as a sequence writer (the SDK's SequenceWriter, made by the actor with this
    geometry, the environment's trajectory number and `priority`) takes them: `step(...)` gives the arguments of
    its `append`; `end_episode()` when the episode ended (after the writer's own)."""

    def __init__(self, geometry: Geometry, compression: str | None = None) -> None:
        self.geometry = geometry
        self.compression = compression
        self._step = 0  # of the episode

    def step(
        self,
        obs: np.ndarray,
        action: int,
        reward: float,
        terminated: bool,
        fields: dict[str, np.ndarray],
        q_values: np.ndarray,
        version: int,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(step, window fields, extras) of one step: the observation acted on, the action, its reward, whether the
        episode terminated with it, the item fields before it (acting.CoreState.item_fields of this environment),
        the Q-values acted on (extras: never sent), the weights version acting."""
        obs = np.asarray(obs)
        image = self.compression is not None and is_image(obs.dtype, obs.shape)
        step = {
            "obs": compress(obs[None], self.compression) if image else _float32(obs),
            "action": np.int64(action),
            "reward": np.float32(reward),
            "discount": np.float32(0.0 if terminated else self.geometry.gamma),
        }
        window_fields = {
            **fields,
            "episode_start": np.bool_(self._step == 0),
            ROW_VERSION_COLUMN: np.int64(version),
        }
        self._step += 1
        return step, window_fields, {"q": np.asarray(q_values, np.float32)}

    def end_episode(self) -> None:
        self._step = 0

    def priority(self, window: dict[str, np.ndarray]) -> float:
        """A window's initial priority from the Q-values acted on along it (acting.window_priority); never 0: a
        window with no target yet is still worth a draw."""
        g = self.geometry
        if window["q"].shape[-1] <= int(
            window["action"].max()
        ):  # acted without a network: nothing to score with
            return 1.0
        terminal = bool(window["discount"][-1] == 0.0)
        return (
            window_priority(
                window["q"],
                window["action"],
                window["reward"],
                window["discount"],
                n_step=g.n_step,
                eta=g.eta,
                terminal=terminal,
            )
            + 1e-6
        )


def _float32(obs: np.ndarray) -> np.ndarray:
    return obs.astype(np.float32) if obs.dtype.kind == "f" else obs


class ActorWindows:
    """An actor's environments written as R2D2 windows: one StepEncoder and one sequence writer (made by
    `make_writer(trajectory, geometry, priority)`, the SDK's SequenceWriter over the actor's ShardedWriter) per
    environment, environment i being trajectory i."""

    def __init__(
        self,
        geometry: Geometry,
        num_envs: int,
        make_writer: Callable[[int, Geometry, Callable[[dict[str, np.ndarray]], float]], Any],
        compression: str | None = None,
    ) -> None:
        self.geometry = geometry
        self.encoders = [StepEncoder(geometry, compression) for _ in range(num_envs)]
        self.writers = [make_writer(i, geometry, e.priority) for i, e in enumerate(self.encoders)]

    def record(
        self,
        before: CoreState,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        q_values: np.ndarray | None,
        version: int,
    ) -> None:
        """One step of every environment: `before` the acting state the actions were chosen in, `q_values` the
        Q-values they were chosen on (None: no network yet, the window's priority is then its default)."""
        fields = before.item_fields()
        for i, (writer, encoder) in enumerate(zip(self.writers, self.encoders, strict=True)):
            q = np.zeros(1, np.float32) if q_values is None else q_values[i]
            own = {name: value[i] for name, value in fields.items()}
            writer.append(*encoder.step(obs[i], actions[i], rewards[i], terminated[i], own, q, version))
            if terminated[i] or truncated[i]:
                writer.end_episode()
                encoder.end_episode()

    @property
    def items_sent(self) -> int:
        return sum(writer.items_sent for writer in self.writers)

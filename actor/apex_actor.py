"""The built-in Ape-X actor: Gymnasium environments, per-actor epsilon, n-step transitions with initial
priorities from the actor's own network, streamed to the replay shards round-robin with failover.

Written on the public SDK only (ReplayClient, ParameterClient), as a custom actor would be.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from apexrl.actor.episode_log import EpisodeLog, EpisodeRecord
from apexrl.actor.exploration import apex_epsilon, epsilon_greedy
from apexrl.actor.nstep import NStepAccumulator, Transition, stack_transitions
from apexrl.actor.policy import NumpyDuelingPolicy
from apexrl.common.errors import DeadlineExceededError, UnavailableError
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client import ReplayClient

log = logging.getLogger("apexrl.actor")

# Added to |TD error| so no fresh transition starts with priority 0 (which would never be sampled).
MIN_PRIORITY = 1e-3


@dataclass(frozen=True)
class ActorConfig:
    """Configuration of one actor process.

    Attributes:
        replay_addresses: shards to send to; batches go round-robin starting at actor_index mod S.
        params_address: the parameter service to pull weights from.
        actor_index, num_actors: this actor's place in the fleet (sets its Ape-X epsilon).
        epsilon: fixed exploration rate; None uses Ape-X's 0.4 ** (1 + 7 i / (N - 1)) (0 when evaluating).
        evaluate: play only (no replay inserts) with the newest weights, fetched before every episode.
        pull_every: environment steps between checks for newer weights (Ape-X: 400 frames).
        max_steps_per_second: pace of this actor; None runs as fast as the shards accept data. Evaluators use it
            so that playing greedy episodes does not take CPU from the learner.
        batch_size: transitions per replay insert.
    """

    replay_addresses: tuple[str, ...]
    params_address: str
    actor_index: int = 0
    num_actors: int = 1
    env_id: str = "CartPole-v1"
    num_envs: int = 1
    epsilon: float | None = None
    evaluate: bool = False
    # Transitions
    n_step: int = 3
    gamma: float = 0.99
    batch_size: int = 64
    # Weights
    pull_every: int = 100
    weights_wait_seconds: float = 120.0
    # Limits
    max_steps_per_second: float | None = None
    max_env_steps: int | None = None
    max_episodes: int | None = None
    seed: int | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if not self.evaluate and not self.replay_addresses:
            raise ValueError("an exploring actor needs at least one replay address")
        if not 0 <= self.actor_index < max(1, self.num_actors):
            raise ValueError(f"actor_index ({self.actor_index}) must be in [0, num_actors={self.num_actors})")
        for name in ("num_envs", "n_step", "batch_size", "pull_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a positive integer")
        if self.epsilon is not None and not 0 <= self.epsilon <= 1:
            raise ValueError(f"epsilon ({self.epsilon}) must be in [0, 1]")

    @property
    def effective_epsilon(self) -> float:
        if self.epsilon is not None:
            return self.epsilon
        return 0.0 if self.evaluate else apex_epsilon(self.actor_index, self.num_actors)


class ActorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.env_steps = Counter("apexrl_actor_env_steps", "Environment steps taken", registry=registry)
        self.episodes = Counter("apexrl_actor_episodes", "Episodes finished", registry=registry)
        self.transitions_sent = Counter("apexrl_actor_transitions_sent", "n-step transitions handed to the SDK "
                                        "for insertion", registry=registry)
        self.failovers = Counter("apexrl_actor_insert_failovers", "Batches sent to another shard because the "
                                 "round-robin shard's backlog was full", registry=registry)
        self.fetch_failures = Counter("apexrl_actor_weight_fetch_failures", "Weight pulls that failed (the actor "
                                      "kept its weights)", registry=registry)
        self.weight_version = Gauge("apexrl_actor_weight_version", "Version of the weights in use", registry=registry)
        self.epsilon = Gauge("apexrl_actor_epsilon", "Exploration rate", registry=registry)
        self.last_return = Gauge("apexrl_actor_last_episode_return", "Return of the last finished episode",
                                 registry=registry)
        self.mean_return = Gauge("apexrl_actor_mean_episode_return_100", "Mean return of the last 100 episodes",
                                 registry=registry)


class ApeXActor:
    def __init__(self, config: ActorConfig, registry: CollectorRegistry | None = None,
                 episode_log: EpisodeLog | None = None) -> None:
        self.config = config
        self.metrics = ActorMetrics(registry if registry is not None else CollectorRegistry())
        self.episode_log = episode_log
        self.epsilon = config.effective_epsilon
        self.metrics.epsilon.set(self.epsilon)
        seed = config.seed if config.seed is not None else int(time.time_ns() % 2**31)
        self._rng = np.random.default_rng([seed, config.actor_index])
        self.envs = [gym.make(config.env_id) for _ in range(config.num_envs)]
        _check_spaces(self.envs[0], config.env_id)
        self._env_seed = seed * 1000 + config.actor_index * config.num_envs
        self.accumulators = [NStepAccumulator(config.n_step, config.gamma) for _ in self.envs]
        self.params = ParameterClient(config.params_address, timeout=5.0, token=config.token)
        self.shards = [] if config.evaluate else [
            ReplayClient(address, timeout=30.0, token=config.token, max_in_flight=8)
            for address in config.replay_addresses
        ]
        self._next_shard = config.actor_index % max(1, len(self.shards))
        self.policy: NumpyDuelingPolicy | None = None
        self.weight_version = 0
        self.env_steps = 0
        self.episodes = 0
        self._recent_returns: deque[float] = deque(maxlen=100)
        self._last_fetch_warning = 0.0

    # ----------------------------------------------------------------------------------------------- weights
    def _pull_weights(self) -> bool:
        """Fetch newer weights if there are any; keep the current ones when the service is unreachable."""
        try:
            fetched = self.params.fetch(self.weight_version)
        except (UnavailableError, DeadlineExceededError) as err:
            self.metrics.fetch_failures.inc()
            if time.monotonic() - self._last_fetch_warning > 30:
                log.warning("weights unavailable, acting with version %d: %s", self.weight_version, err)
                self._last_fetch_warning = time.monotonic()
            return False
        if fetched is None:
            return False
        self.weight_version, weights = fetched
        self.policy = NumpyDuelingPolicy(weights)
        self.metrics.weight_version.set(self.weight_version)
        return True

    def _wait_for_first_weights(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + self.config.weights_wait_seconds
        while self.policy is None:
            if stop.is_set():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weights from {self.config.params_address} after "
                                   f"{self.config.weights_wait_seconds:.0f}s")
            if not self._pull_weights():
                stop.wait(0.5)
        log.info("actor %d got weights version %d; epsilon %.4f", self.config.actor_index, self.weight_version,
                 self.epsilon)

    # ------------------------------------------------------------------------------------------------- replay
    def _send(self, transitions: list[Transition], stop: threading.Event) -> None:
        """Insert one batch: round-robin over shards; a shard whose backlog is full (down or slow) is skipped;
        when every shard is full, wait on the round-robin one (back pressure from the shards' rate limiters)."""
        columns = stack_transitions(transitions)
        priorities = self.policy.td_error_abs(columns) + MIN_PRIORITY
        n = len(self.shards)
        start = self._next_shard
        self._next_shard = (self._next_shard + 1) % n
        while not stop.is_set():
            for attempt in range(n):
                client = self.shards[(start + attempt) % n]
                try:
                    client.insert(columns, priorities, timeout=0.0)
                except DeadlineExceededError:
                    continue
                if attempt:
                    self.metrics.failovers.inc()
                self.metrics.transitions_sent.inc(len(transitions))
                return
            try:
                self.shards[start].insert(columns, priorities, timeout=1.0)
                self.metrics.transitions_sent.inc(len(transitions))
                return
            except DeadlineExceededError:
                continue

    # --------------------------------------------------------------------------------------------------- loop
    def run(self, stop: threading.Event) -> None:
        """Act until `stop` is set or a configured limit is reached."""
        cfg = self.config
        self._wait_for_first_weights(stop)
        obs = np.stack([env.reset(seed=self._env_seed + i)[0] for i, env in enumerate(self.envs)]).astype(np.float32)
        returns = np.zeros(len(self.envs))
        lengths = np.zeros(len(self.envs), dtype=np.int64)
        outbox: list[Transition] = []
        steps_since_pull = 0
        started = time.monotonic()
        while not stop.is_set():
            if cfg.max_steps_per_second:
                ahead = self.env_steps / cfg.max_steps_per_second - (time.monotonic() - started)
                if ahead > 0.01:
                    stop.wait(ahead)
            actions = epsilon_greedy(self.policy.q_values(obs), self.epsilon, self._rng)
            for i, env in enumerate(self.envs):
                next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
                returns[i] += reward
                lengths[i] += 1
                if not cfg.evaluate:
                    outbox += self.accumulators[i].push(obs[i], actions[i], reward, next_obs, terminated, truncated)
                if terminated or truncated:
                    self._finish_episode(returns[i], lengths[i], env_steps=self.env_steps + i + 1)
                    returns[i], lengths[i] = 0.0, 0
                    next_obs, _ = env.reset()
                    if cfg.evaluate:
                        self._pull_weights()  # every evaluation episode plays the newest weights
                obs[i] = next_obs
            self.env_steps += len(self.envs)
            steps_since_pull += len(self.envs)
            self.metrics.env_steps.inc(len(self.envs))
            while len(outbox) >= cfg.batch_size:
                self._send(outbox[:cfg.batch_size], stop)
                del outbox[:cfg.batch_size]
            if steps_since_pull >= cfg.pull_every and not cfg.evaluate:
                steps_since_pull = 0
                self._pull_weights()
            if (cfg.max_env_steps is not None and self.env_steps >= cfg.max_env_steps) or \
                    (cfg.max_episodes is not None and self.episodes >= cfg.max_episodes):
                break

    def _finish_episode(self, episode_return: float, length: int, env_steps: int) -> None:
        self.episodes += 1
        self._recent_returns.append(float(episode_return))
        self.metrics.episodes.inc()
        self.metrics.last_return.set(episode_return)
        self.metrics.mean_return.set(float(np.mean(self._recent_returns)))
        if self.episode_log is not None:
            self.episode_log.write(EpisodeRecord(
                wall_time=time.time(), actor=self.config.actor_index,
                role="evaluate" if self.config.evaluate else "explore", env_steps=env_steps,
                episode_return=float(episode_return), length=int(length), weight_version=self.weight_version,
            ))

    def close(self, flush_timeout: float = 2.0) -> None:
        """Flush what was handed to the SDK within `flush_timeout` seconds in total (the learner may be gone and
        the shards' rate limiters holding inserts back), then close connections and environments."""
        deadline = time.monotonic() + flush_timeout
        for client in self.shards:
            client.close(flush_timeout=max(0.01, deadline - time.monotonic()))
        self.params.close()
        for env in self.envs:
            env.close()
        if self.episode_log is not None:
            self.episode_log.close()


def _check_spaces(env: gym.Env, env_id: str) -> None:
    obs_space, action_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"{env_id}: the built-in actor needs a flat Box observation space, got {obs_space}")
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{env_id}: the built-in actor needs a Discrete action space, got {action_space}")


def env_spaces(env_id: str) -> tuple[int, int]:
    """(obs_dim, num_actions) of an environment the built-in actor can play."""
    env = gym.make(env_id)
    try:
        _check_spaces(env, env_id)
        return int(env.observation_space.shape[0]), int(env.action_space.n)
    finally:
        env.close()


"""The built-in Ape-X actor: a Gymnasium vector environment (num_envs copies stepped together, each with its own
n-step accumulator), per-actor exploration, n-step transitions with initial priorities from the actor's own copy
of the networks, streamed to the replay shards round-robin with failover.

It never names an algorithm: the policy, its exploration and the initial priorities come from the acting half of
the algorithm that plays the environment's action space (`apexrl.algorithms`: Ape-X DQN's epsilon-greedy Q-network,
Ape-X DPG's deterministic policy with Gaussian noise). Written on the public SDK only (ReplayClient,
ParameterClient, ShardedWriter), as a custom actor would be.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from apexrl.actor.config import ActorConfig
from apexrl.actor.evaluation_pacing import EvaluationPacer, log_round
from apexrl.actor.kept_policy import KeptPolicy, KeptRecord
from apexrl.actor.metrics import ActorMetrics
from apexrl.actor.recording import SequenceRecorder, Step, TransitionRecorder
from apexrl.algorithms.base import ActingPolicy
from apexrl.algorithms.policy_file import PolicyFile, save_policy_file
from apexrl.algorithms.registry import for_spaces, with_defaults
from apexrl.common.compression import compress_image_columns
from apexrl.common.env_settings import EnvChoice
from apexrl.common.environments import check_spaces, clips_rewards, make_vector_env
from apexrl.common.episodes import EVALUATE, EXPLORE, EpisodeLog, EpisodeRecord
from apexrl.common.errors import ApexError, ResourceExhaustedError, is_transient
from apexrl.common.settings import SettingsError
from apexrl.common.signature import ROW_VERSION_COLUMN
from apexrl.common.tls import tls_of
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.limits import DEFAULT_MAX_WEIGHTS_BYTES
from apexrl.replay_server.client.replay_client import ReplayClient
from apexrl.replay_server.client.sequence_writer import SequenceWriter
from apexrl.replay_server.client.sharded_writer import ShardedWriter

log = logging.getLogger("apexrl.actor")

# Added to |TD error| so no fresh transition starts with priority 0 (which would never be sampled).
MIN_PRIORITY = 1e-3
# Actors start while the learner starts (apexrl launch), so the parameter service is unreachable for the first few
# seconds of every run: that is logged at INFO, and only weights still missing after this long at WARNING.
STARTUP_WINDOW_SECONDS = 30.0
FETCH_WARNING_PERIOD_SECONDS = 30.0  # at most one such line per period
FIRST_WEIGHTS_POLL_SECONDS = 0.2  # how often the first weights are tried for
# The priority of a transition played at random before the first weights (no network to score it with): about the
# |TD error| of a fresh network on rewards of size 1, so such rows are sampled like the first scored ones.
UNSCORED_PRIORITY = 1.0
# Later weights of this run may be this much larger than the first ones (the network does not change within a run).
WEIGHTS_GROWTH = 2
WEIGHTS_SLACK_BYTES = 1 << 20


def weights_bound(weights: Mapping[str, np.ndarray]) -> int:
    """The most bytes of weights this actor accepts once it has held `weights`: WEIGHTS_GROWTH times their size plus
    WEIGHTS_SLACK_BYTES, never above the default bound (a service sending far more is refused from its header,
    before anything is allocated: an actor's memory is its pod's)."""
    size = sum(np.asarray(array).nbytes for array in weights.values())
    return min(DEFAULT_MAX_WEIGHTS_BYTES, WEIGHTS_GROWTH * size + WEIGHTS_SLACK_BYTES)


class ApeXActor:
    def __init__(
        self,
        config: ActorConfig,
        registry: CollectorRegistry | None = None,
        episode_log: EpisodeLog | None = None,
    ) -> None:
        self.metrics = ActorMetrics(registry if registry is not None else CollectorRegistry())
        self.episode_log = episode_log
        seed = config.seed if config.seed is not None else int(time.time_ns() % 2**31)
        self._rng = np.random.default_rng([seed, config.actor_index])
        # Exploring: same-step autoreset (every step yields one transition per environment, see make_vector_env).
        try:
            self.envs = make_vector_env(
                EnvChoice.of(config), config.num_envs, same_step_autoreset=not config.evaluate
            )
        except ValueError as err:
            raise SettingsError(f"--env: {err}") from None
        try:
            self.spaces = check_spaces(self.envs, config.env)
            self.algorithm = for_spaces(config.algorithm, self.spaces, config.env)
            self.config = config = with_defaults(config, self.algorithm, "actor")
        except ValueError as err:
            self.envs.close()
            raise SettingsError(str(err)) from None
        self.acting = self.algorithm.acting()
        self.explorer = self.acting.make_explorer(config, self.spaces, self._rng)
        self.stepping = self.acting.make_stateful(self.explorer)  # the acting state, reset at episode ends
        (self.metrics.epsilon if self.explorer.name == "epsilon" else self.metrics.noise_scale).set(
            self.explorer.scale
        )
        # Atari: train on rewards clipped to [-1, 1] (DQN, Ape-X); episode returns are reported unclipped.
        self.clip_rewards = clips_rewards(config.env)
        # Environment i of this actor resets with seed + i; below 2**32, which MinAtar's RandomState requires.
        self._env_seed = (seed * 1000 + config.actor_index * config.num_envs) % 2**31
        self.writing = (
            self.algorithm.writing()
        )  # steps into replay items (transitions, or sequences' windows)
        self.tls = tls_of(config)
        self._weights_bound = DEFAULT_MAX_WEIGHTS_BYTES  # until the first weights tell this network's size
        self.params = self._params_client()
        # Round-robin from shard actor_index mod S with failover, back pressure and dns:/// membership (the SDK's).
        self.writer: ShardedWriter | None = None  # the evaluator inserts nothing
        if not config.evaluate:
            self.writer = ShardedWriter(
                config.replay,
                first_shard=config.actor_index,
                timeout=30.0,
                max_in_flight=8,
                token=config.token,
                tls=self.tls,
                resolve_every=config.replay_resolve_seconds,
            )
            self.metrics.insert_backlog.source = self.writer.backlog
        self.recorder = None if self.writer is None else self._recorder()
        self.policy: ActingPolicy | None = None
        self.weights: Mapping[str, np.ndarray] = {}  # what `policy` plays (the evaluator keeps its best)
        self.weight_version = 0
        self.env_steps = 0
        self.episodes = 0
        self._recent_returns: deque[float] = deque(maxlen=100)
        self.kept: KeptPolicy | None = None
        if config.evaluate and config.keep_policy:
            self.kept = KeptPolicy(
                Path(config.keep_policy),
                config.target_return,
                self._save_kept,
                confirm=config.confirm_solved,
            )
        self._last_fetch_warning = -float("inf")
        self._waiting_since = time.monotonic()  # for the first weights: reset when run() starts waiting
        # Before the first weights (act_before_weights): when to try for them next, and the random actions' generator.
        self._next_weights_try = 0.0
        self._random = np.random.default_rng([seed, config.actor_index, 1])

    def _recorder(self) -> TransitionRecorder | SequenceRecorder:
        """What turns this actor's steps into replay data, as its algorithm writes it (actor/recording.py)."""
        config, writing = self.config, self.writing
        if getattr(writing, "SEQUENCES", False):
            windows = writing.ActorWindows(
                writing.geometry(config, self.spaces), config.num_envs, self._sequence_writer, config.compress
            )
            return SequenceRecorder(windows, self.stepping)
        writers = [writing.make_writer(config, self.spaces) for _ in range(config.num_envs)]
        return TransitionRecorder(writers, config.batch_size, self._send_batches)

    def _sequence_writer(self, trajectory: int, geometry: Any, priority: Any) -> SequenceWriter:
        """Environment `trajectory`'s windows through this actor's ShardedWriter (one shard at a time, failover)."""
        return SequenceWriter(
            self.writer,
            length=geometry.length,
            period=geometry.period,
            windows_per_request=geometry.windows_per_request,
            trajectory=trajectory,
            priority=priority,
        )

    # ----------------------------------------------------------------------------------------------- weights
    def _params_client(self) -> ParameterClient:
        return ParameterClient(
            self.config.params,
            timeout=5.0,
            token=self.config.token,
            tls=self.tls,
            max_weights_bytes=self._weights_bound,
        )

    def _pull_weights(self) -> bool:
        """Fetch newer weights if there are any; keep the current ones when the service is unreachable."""
        try:
            fetched = self.params.fetch(self.weight_version)
        except ApexError as err:
            # Weights far larger than the network this actor plays (weights_bound): refused before allocating;
            # the actor goes on with the weights it holds, and says so.
            oversized = isinstance(err, ResourceExhaustedError) and self.policy is not None
            if not (is_transient(err) or oversized):
                raise
            self.metrics.fetch_failures.inc()
            self._report_fetch_failure(err)
            if self.policy is None:
                # Waiting for the first weights (the learner is starting): the next try dials anew. The channel's
                # reconnect backoff (up to 1 s by then) would otherwise hold every actor back after the service is up.
                self.params.close()
                self.params = self._params_client()
            return False
        if fetched is None:
            self.metrics.weight_lag.set(0)
            return False
        self.metrics.weight_lag.set(fetched[0] - self.weight_version if self.policy is not None else 0)
        self.weight_version, weights = fetched
        self.policy = self.acting.make_policy(weights, self.spaces)
        self.weights = weights
        # The network's size does not change within a run: later weights may be a little larger, never much
        # (a service that sends gigabytes is refused from its header, before anything is allocated).
        self._weights_bound = self.params.max_weights_bytes = weights_bound(weights)
        self.metrics.weight_version.set(self.weight_version)
        return True

    def _report_fetch_failure(self, err: ApexError) -> None:
        """One line per FETCH_WARNING_PERIOD_SECONDS: INFO while the first weights are awaited within the start-up
        window (the learner is starting), WARNING once that is over or when weights in use could not be refreshed."""
        now = time.monotonic()
        if now - self._last_fetch_warning < FETCH_WARNING_PERIOD_SECONDS:
            return
        self._last_fetch_warning = now
        waited = now - self._waiting_since
        if self.policy is None and waited < STARTUP_WINDOW_SECONDS:
            log.info(
                "waiting for the first weights from the parameter service at %s (the learner may still be "
                "starting)",
                self.config.params,
            )
        elif self.policy is None:
            log.warning(
                "no weights from %s after %.0fs of waiting (the learner is not serving): %s",
                self.config.params,
                waited,
                err,
            )
        else:
            log.warning("weights unavailable, acting with version %d: %s", self.weight_version, err)

    def _wait_for_first_weights(self, stop: threading.Event) -> None:
        self._waiting_since = time.monotonic()
        while not stop.is_set() and not self._try_first_weights():
            stop.wait(FIRST_WEIGHTS_POLL_SECONDS)

    def _try_first_weights(self) -> bool:
        """One try for the first weights (True once they came; logged); TimeoutError once `weights_wait_seconds` have
        passed since the waiting began without any."""
        if self._pull_weights():
            log.info(
                "actor %d got weights version %d; %s",
                self.config.actor_index,
                self.weight_version,
                self.explorer.describe(),
            )
            return True
        if time.monotonic() - self._waiting_since > self.config.weights_wait_seconds:
            raise TimeoutError(
                f"no weights from {self.config.params} after {self.config.weights_wait_seconds:.0f}s"
            )
        self._next_weights_try = time.monotonic() + FIRST_WEIGHTS_POLL_SECONDS
        return False

    def _act(self, obs: np.ndarray, state):
        """The policy's actions; before the first weights have come (the learner is starting), uniformly random
        ones, with the weights tried every FIRST_WEIGHTS_POLL_SECONDS meanwhile."""
        if self.policy is None and time.monotonic() >= self._next_weights_try:
            self._try_first_weights()
        if self.policy is None:
            return self._random_actions(len(obs)), state
        return self.stepping.act(self.policy, obs, state)

    def _random_actions(self, count: int) -> np.ndarray:
        """`count` actions drawn uniformly from the action space (their own generator: the explorer's draws stay
        those of a run that had its weights from the start)."""
        spaces = self.spaces
        if spaces.num_actions:
            return self._random.integers(spaces.num_actions, size=count, dtype=np.int64)
        low = np.asarray(spaces.action_low, dtype=np.float32)
        high = np.asarray(spaces.action_high, dtype=np.float32)
        return self._random.uniform(low, high, size=(count, len(low))).astype(np.float32)

    # ------------------------------------------------------------------------------------------------- replay
    @property
    def shards(self) -> list[ReplayClient]:
        """The clients of the shards this actor writes to now (none for the evaluator)."""
        return [] if self.writer is None else self.writer.shards

    def _send(self, items: list, versions: list[int], stop: threading.Event) -> None:
        """Insert one batch through the writer: round-robin over shards; a shard whose backlog is full (down or
        slow) is skipped; when every shard is full, wait on the round-robin one (back pressure from the shards' rate
        limiters) until `stop` is set. Each row carries the weights version that was acting when it was completed
        (`weight_version`), so the learner can measure policy staleness. Image observations are compressed (setting `compress`)."""
        columns = self.writing.item_columns(items)
        columns[ROW_VERSION_COLUMN] = np.asarray(versions, dtype=np.int64)
        priorities = (
            np.full(len(items), UNSCORED_PRIORITY)
            if self.policy is None  # acting at random before the first weights: nothing to score them with
            else self.policy.initial_priorities(columns) + MIN_PRIORITY
        )
        columns = compress_image_columns(
            columns, self.config.compress
        )  # after the priorities: they need pixels
        placed = self.writer.insert(columns, priorities, stop=stop)
        if placed is None:  # stopped while every shard was full
            return
        if placed.failed_over:
            self.metrics.failovers.inc()
        self.metrics.transitions_sent.inc(len(items))

    def _send_batches(self, outbox: list, versions: list[int], stop: threading.Event) -> None:
        """Send every full batch at the head of `outbox` (and `versions`, its rows' weight versions), removing them."""
        size = self.config.batch_size
        while len(outbox) >= size:
            self._send(outbox[:size], versions[:size], stop)
            del outbox[:size], versions[:size]

    def _log_first_step(self) -> None:
        """Once per process: the instant acting began (start-up timings: bench/startup_bench.py)."""
        playing = "at random" if self.policy is None else f"version {self.weight_version}"
        log.info("actor %d: first environment step (%s)", self.config.actor_index, playing)

    def _timed_pull(self) -> None:
        pulling_since = time.perf_counter()
        self._pull_weights()
        self.metrics.pull_seconds.inc(time.perf_counter() - pulling_since)

    def _start_exploring(self, stop: threading.Event) -> None:
        """An exploring actor acts from its first moment (act_before_weights): with the weights if the service has
        some, else at random until they come (`_act`); without act_before_weights, it waits for them first. The
        run's stop ends the recorder's waits for room on the shards from here on."""
        self.recorder.stop_on(stop)
        # Sequences (R2D2) store the policy's state with each window: no window before there is a policy.
        if not self.config.act_before_weights or isinstance(self.recorder, SequenceRecorder):
            self._wait_for_first_weights(stop)
            return
        self._waiting_since = time.monotonic()
        if not self._try_first_weights():
            log.info(
                "actor %d: no policy yet (the learner is starting): acting at random meanwhile",
                self.config.actor_index,
            )

    # --------------------------------------------------------------------------------------------------- loop
    def run(self, stop: threading.Event) -> None:
        """Act until `stop` is set or a configured limit is reached."""
        cfg = self.config
        if cfg.evaluate:
            self._wait_for_first_weights(stop)
            self._evaluate(stop)
            return
        self._start_exploring(stop)
        num_envs = self.envs.num_envs
        obs, _ = self.envs.reset(seed=self._env_seed)  # environment i: seed + i
        state = self.stepping.initial_state(num_envs)
        returns = np.zeros(num_envs)
        lengths = np.zeros(num_envs, dtype=np.int64)
        steps_since_pull = 0
        started = time.monotonic()
        pace = cfg.max_steps_per_second
        while not stop.is_set():
            if pace:
                ahead = self.env_steps / pace - (time.monotonic() - started)
                if ahead > 0.01:
                    stop.wait(ahead)
            acting_since = time.perf_counter()
            if self.policy is not None:
                state = self.stepping.prepare(self.policy, state)
            before = state
            actions, state = self._act(obs, state)
            next_obs, rewards, terminated, truncated, info = self.envs.step(actions)
            train_rewards = np.clip(rewards, -1.0, 1.0) if self.clip_rewards else rewards
            state = self.stepping.reset(self.stepping.observe(state, train_rewards), terminated | truncated)
            self.recorder.record(
                Step(
                    before,
                    obs,
                    actions,
                    train_rewards,
                    next_obs,
                    terminated,
                    truncated,
                    info,
                    self.weight_version,
                )
            )
            self._count_episodes(rewards, terminated | truncated, returns, lengths)
            obs = next_obs
            self.env_steps += num_envs
            if self.env_steps == num_envs:
                self._log_first_step()
            steps_since_pull += num_envs
            self.metrics.env_steps.inc(num_envs)
            sending_since = time.perf_counter()
            self.metrics.act_seconds.inc(sending_since - acting_since)
            if self.recorder.flush(stop):
                self.metrics.send_seconds.inc(time.perf_counter() - sending_since)
            if steps_since_pull >= cfg.pull_every:
                steps_since_pull = 0
                self._timed_pull()
            if (cfg.max_env_steps is not None and self.env_steps >= cfg.max_env_steps) or (
                cfg.max_episodes is not None and self.episodes >= cfg.max_episodes
            ):
                break

    def _count_episodes(
        self, rewards: np.ndarray, done: np.ndarray, returns: np.ndarray, lengths: np.ndarray
    ) -> None:
        """Add a step to each environment's running return and length; log the episodes that ended with it."""
        for i in range(len(rewards)):
            returns[i] += rewards[i]
            lengths[i] += 1
            if done[i]:
                self._finish_episode(returns[i], lengths[i], env_steps=self.env_steps + i + 1)
                returns[i], lengths[i] = 0.0, 0

    def _evaluate(self, stop: threading.Event) -> None:
        """Evaluator: rounds of num_envs greedy episodes played side by side, every one with the newest weights at
        the round's start (100 episodes of one policy, as "solved" is defined, in the time of the longest one).
        No round plays weights below `min_weight_version` (v1: the learner's untrained network). Rounds start at
        most every `evaluation_round_seconds`, and take at most `evaluation_cpu_share` of a core beyond a burst
        of `evaluation_burst_seconds` (actor/evaluation_pacing.py), so evaluation leaves the learner its CPU (a
        Pong evaluator without it played 7x the exploring actors' env steps on 2 cores) without hiding a run's
        first results. With `keep_policy`, each round is offered to the kept policy (actor/kept_policy.py)."""
        cfg = self.config
        num_envs = self.envs.num_envs
        pacer = EvaluationPacer(
            cfg.evaluation_round_seconds, cfg.evaluation_cpu_share, cfg.evaluation_burst_seconds
        )
        rounds = 0
        told_untrained = False
        while not stop.is_set():
            started = time.monotonic()
            if self.kept is None or self.kept.confirming is None:  # a confirmation replays the same weights
                self._pull_weights()
            if self.weight_version < cfg.min_weight_version:
                if not told_untrained:
                    log.info(
                        "evaluator: waiting for weights v%d or later (v%d is the learner's untrained network)",
                        cfg.min_weight_version,
                        self.weight_version,
                    )
                    told_untrained = True
                stop.wait(0.5)
                continue
            weights, version = self.weights, self.weight_version
            obs, _ = self.envs.reset(
                seed=self._env_seed + rounds * num_envs
            )  # fresh start states every round
            state = self.stepping.initial_state(num_envs)
            returns = np.zeros(num_envs)
            lengths = np.zeros(num_envs, dtype=np.int64)
            playing = np.ones(num_envs, dtype=bool)
            finished: list[float] = []
            limit = False
            while playing.any() and not stop.is_set():
                if cfg.max_steps_per_second:
                    ahead = self.env_steps / cfg.max_steps_per_second - (time.monotonic() - started)
                    if ahead > 0.01:
                        stop.wait(ahead)
                actions, state = self.stepping.act(self.policy, obs, state)
                obs, rewards, terminated, truncated, _ = self.envs.step(actions)
                seen = (
                    np.clip(rewards, -1.0, 1.0) if self.clip_rewards else rewards
                )  # the core's input, as trained
                state = self.stepping.reset(self.stepping.observe(state, seen), terminated | truncated)
                returns += np.where(playing, rewards, 0.0)
                lengths += playing
                self.env_steps += int(playing.sum())
                self.metrics.env_steps.inc(int(playing.sum()))
                for i in np.flatnonzero(playing & (terminated | truncated)):
                    playing[i] = False  # its environment restarts (autoreset); the round ignores what follows
                    self._finish_episode(returns[i], lengths[i], env_steps=self.env_steps)
                    finished.append(float(returns[i]))
                limit = (cfg.max_episodes is not None and self.episodes >= cfg.max_episodes) or (
                    cfg.max_env_steps is not None and self.env_steps >= cfg.max_env_steps
                )
                if limit:
                    break
            rounds += 1
            ended = time.monotonic()
            if not playing.any():  # a whole round (one cut short by a stop or a limit gets no line)
                log_round(rounds, version, finished, ended - started)
                if self.kept is not None:
                    self.kept.offer(rounds, version, weights, finished, self._recent_returns)
            if limit:
                return
            stop.wait(pacer.rest(started, ended))

    def _save_kept(self, weights: Mapping[str, np.ndarray], record: KeptRecord) -> None:
        """Write the kept policy file: the acting weights with what `apexrl evaluate` needs to play them (numpy
        only: algorithms/policy_file.py)."""
        cfg = self.config
        save_policy_file(
            Path(cfg.keep_policy),
            PolicyFile(
                algorithm=self.algorithm.name,
                env=EnvChoice.of(cfg),
                spaces=self.spaces,
                weights=weights,
                weight_version=record.weight_version,
                kept=record.as_dict(),
            ),
        )

    def _finish_episode(self, episode_return: float, length: int, env_steps: int) -> None:
        self.episodes += 1
        self._recent_returns.append(float(episode_return))
        self.metrics.episodes.inc()
        self.metrics.last_return.set(episode_return)
        self.metrics.mean_return.set(float(np.mean(self._recent_returns)))
        if self.episode_log is not None:
            self.episode_log.write(
                EpisodeRecord(
                    wall_time=time.time(),
                    actor=self.config.actor_index,
                    role=EVALUATE if self.config.evaluate else EXPLORE,
                    env_steps=env_steps,
                    episode_return=float(episode_return),
                    length=int(length),
                    weight_version=self.weight_version,
                )
            )

    def close(self, flush_timeout: float = 2.0) -> None:
        """Flush what was handed to the SDK within `flush_timeout` seconds in total (the learner may be gone and
        the shards' rate limiters holding inserts back), then close connections and environments."""
        if self.writer is not None:
            self.writer.close(flush_timeout=flush_timeout)
        self.params.close()
        self.envs.close()
        if self.episode_log is not None:
            self.episode_log.close()

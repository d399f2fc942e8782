"""The built-in Ape-X actor (actor/apex_actor.py) against real in-process shards and a real parameter service on
127.0.0.1: it waits for weights, inserts n-step transitions with its own |TD| priorities round-robin from
actor_index mod S, fails over when a shard is down, keeps acting while the parameter service is unreachable, and
writes one CSV line per episode."""

from __future__ import annotations

import logging

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from apexrl.actor.apex_actor import MIN_PRIORITY
from apexrl.algorithms.dqn.acting import NumpyDuelingPolicy
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.aio_grpc import AioServerThread
from apexrl.common.discovery import ShardAddresses
from apexrl.common.episodes import EVALUATE, EXPLORE, read_episodes
from apexrl.common.metrics import RpcMetrics
from apexrl.parameter_server.service import SERVICE_NAME, ParameterServicer
from apexrl.parameter_server.store import WeightStore
from apexrl.proto import parameters_pb2_grpc
from apexrl.replay_server.core.table import ReplayTable, TableConfig
from apexrl.replay_server.server.service import create_replay_server
from tests.conftest import wait_until
from tests.integration.actor.conftest import BATCH, GAMMA


def weights(seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return state_dict_to_numpy(DuelingQNetwork(4, 2, (16,)))


def shards_of(make_shard, count: int):
    return [make_shard(TableConfig(capacity=10_000, alpha=1.0, seed=s)) for s in range(count)]


def test_it_waits_for_weights_then_inserts_n_step_transitions_with_its_own_priorities(
    make_shard, params, run_actor
):
    shards = shards_of(make_shard, 3)
    service = params()
    # 66 steps: at least 64 transitions are complete (n - 1 = 2 may wait for their return), so 4 batches of 16.
    run = run_actor(
        params=service.address,
        replay=tuple(s.address for s in shards),
        actor_index=4,
        num_actors=5,
        max_env_steps=66,
        pull_every=1000,
        act_before_weights=False,
    )
    wait_until(lambda: service.fetches("not_newer") >= 2, "the actor asked twice for weights")
    assert run.actor.env_steps == 0 and all(s.table.info().size == 0 for s in shards)
    published = weights(0)
    service.store.publish(published)
    run.join()
    run.actor.close()
    assert run.actor.env_steps == 66 and run.actor.weight_version == 1
    # Round-robin from actor_index mod S = 4 mod 3 = shard 1: batches 0..3 go to shards 1, 2, 0, 1.
    assert [s.table.info().inserted_total for s in shards] == [16, 32, 16]
    policy = NumpyDuelingPolicy(published)
    full_return = 1 + GAMMA + GAMMA**2
    for shard in shards:
        batch = shard.table.sample(512)
        # Initial priority = |TD error| of the actor's own network + a floor (alpha 1: stored as sent).
        np.testing.assert_allclose(
            batch.priorities, policy.initial_priorities(batch.columns) + MIN_PRIORITY, rtol=1e-5
        )
        # CartPole pays 1 per step: an n = 3 return mid-episode, or a shorter one ending in a terminal state.
        pairs = {
            (round(float(r), 5), round(float(d), 5))
            for r, d in zip(batch.columns["reward"], batch.columns["discount"], strict=True)
        }
        assert pairs <= {
            (round(full_return, 5), round(GAMMA**3, 5)),
            (round(full_return, 5), 0.0),
            (round(1 + GAMMA, 5), 0.0),
            (1.0, 0.0),
        }, pairs
    assert run.metric("apexrl_actor_transitions_sent_total") == 64
    # One CSV line per finished episode, with its return (1 per step) and the weights it was played with.
    episodes = read_episodes(run.csv)
    assert len(episodes) == run.actor.episodes >= 1
    assert all((e.actor, e.role, e.weight_version) == (4, EXPLORE, 1) for e in episodes)
    assert all(e.episode_return == e.length for e in episodes) and sum(e.length for e in episodes) <= 66
    assert [e.env_steps for e in episodes] == sorted(e.env_steps for e in episodes)
    assert episodes[-1].env_steps == sum(e.length for e in episodes)


def test_by_default_it_acts_at_random_until_the_first_weights_then_plays_them(make_shard, params, run_actor):
    """An exploring actor does not wait for the learner (which takes seconds to start): it plays uniformly random
    actions, stored with priority 1 and weights version 0, and plays the weights from the first check after they
    come (the first weights are tried every FIRST_WEIGHTS_POLL_SECONDS while it plays)."""
    from apexrl.actor.apex_actor import UNSCORED_PRIORITY

    shard = make_shard(TableConfig(capacity=10_000, alpha=1.0, seed=0))
    service = params()
    run = run_actor(params=service.address, replay=(shard.address,), max_steps_per_second=2_000)
    wait_until(lambda: shard.table.info().size >= 2 * BATCH, "random play reached the shard")
    assert run.actor.weight_version == 0 and run.actor.policy is None
    sample = shard.table.sample(BATCH)
    assert set(sample.columns["weight_version"]) == {0}
    np.testing.assert_allclose(sample.priorities, UNSCORED_PRIORITY)
    assert set(sample.columns["action"]) <= {0, 1}
    service.store.publish(weights(0))
    wait_until(lambda: run.actor.weight_version == 1, "the actor took the first weights")
    wait_until(
        lambda: 1 in set(shard.table.sample(4 * BATCH).columns["weight_version"]), "rows played with them"
    )


def test_without_weights_it_gives_up_after_waiting(make_shard, params, run_actor):
    run = run_actor(params=params().address, replay=(make_shard().address,), weights_wait_seconds=0.3)
    with pytest.raises(TimeoutError, match="no weights from 127.0.0.1:\\d+ after 0s"):
        run.join()


def closed_port() -> int:
    """A port nothing listens on (bound, read, released): dialling it is refused at once, as a learner's
    parameter service is while the learner starts."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_weights_missing_while_the_learner_starts_are_info_and_warn_only_if_it_lasts(
    make_shard, run_actor, caplog, monkeypatch
):
    """`apexrl launch` starts actors while the learner starts, so every run's actors find the parameter service
    unreachable at first: that is no fault, and is logged at INFO; a WARNING comes only once the start-up window is
    over and the weights are still missing."""
    import apexrl.actor.apex_actor as apex_actor

    caplog.set_level(logging.INFO, logger="apexrl.actor")
    address = f"127.0.0.1:{closed_port()}"
    run = run_actor(params=address, replay=(make_shard().address,), weights_wait_seconds=1.0)
    with pytest.raises(TimeoutError):
        run.join()
    records = [r for r in caplog.records if r.name == "apexrl.actor"]
    assert [r.levelname for r in records if "weights" in r.getMessage()] == ["INFO"], caplog.text
    assert f"waiting for the first weights from the parameter service at {address}" in caplog.text
    caplog.clear()
    monkeypatch.setattr(apex_actor, "STARTUP_WINDOW_SECONDS", 0.2)
    monkeypatch.setattr(apex_actor, "FETCH_WARNING_PERIOD_SECONDS", 0.3)
    run = run_actor(params=address, replay=(make_shard().address,), weights_wait_seconds=1.5)
    with pytest.raises(TimeoutError):
        run.join()
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "apexrl.actor" and r.levelname == "WARNING"
    ]
    assert warnings and all(w.startswith(f"no weights from {address} after ") for w in warnings), caplog.text


def test_batches_for_a_shard_that_is_down_fail_over_to_the_next_one(make_shard, params, run_actor):
    shards = shards_of(make_shard, 3)
    shards[1].server.stop(
        0
    )  # down from the start: its client accepts 8 batches (max in flight), then is full
    service = params()
    service.store.publish(weights(1))
    run = run_actor(
        params=service.address,
        replay=tuple(s.address for s in shards),
        actor_index=0,
        num_actors=1,
        max_env_steps=40 * BATCH + 2,
        pull_every=1000,
    )
    run.join()
    for live in (0, 2):
        run.actor.shards[live].flush(timeout=10)
    # 40 batches from shard 0: turns of shard 0 (14), shard 1 (13) and shard 2 (13); shard 1 holds its first 8
    # turns unacknowledged, and its last 5 turns go to the next shard, shard 2. (A live shard whose acks lag
    # behind, on a loaded machine, may pass a batch on to the other live one too: at least 5 fail over, every
    # batch not held for shard 1 lands on a live shard, none is lost.)
    failovers = run.metric("apexrl_actor_insert_failovers_total")
    assert failovers >= 5
    stored = [shards[0].table.info().inserted_total, shards[2].table.info().inserted_total]
    assert sum(stored) == 32 * BATCH
    if failovers == 5:
        assert stored == [14 * BATCH, 18 * BATCH]
    assert run.actor.shards[1].pending == 8
    assert run.metric("apexrl_actor_transitions_sent_total") == 40 * BATCH


def test_it_keeps_acting_while_the_parameter_service_is_down_and_takes_newer_weights_when_back(
    make_shard, params, run_actor
):
    shard = make_shard(TableConfig(capacity=100_000, alpha=1.0))
    service = params()
    service.store.publish(weights(0))
    run = run_actor(params=service.address, replay=(shard.address,), pull_every=20, max_steps_per_second=2000)
    wait_until(lambda: run.actor.weight_version == 1, "the actor got version 1")
    service.server.stop(1).wait()  # a pull in flight is answered; later ones find nothing listening
    steps = run.actor.env_steps
    wait_until(
        lambda: (
            run.running()
            and run.metric("apexrl_actor_weight_fetch_failures_total") >= 3
            and run.actor.env_steps >= steps + 200
        ),
        "the actor acted on through failed pulls",
    )
    assert run.actor.weight_version == 1 and run.thread.is_alive()
    back = params(service.port)  # the service is back on the same address, with a newer version
    back.store.publish(weights(2), version=2)
    wait_until(
        lambda: run.running() and run.actor.weight_version == 2, "the actor took version 2", timeout=30
    )
    run.stop.set()
    run.join()
    np.testing.assert_array_equal(
        run.actor.policy.q_values(np.ones((1, 4))), NumpyDuelingPolicy(weights(2)).q_values(np.ones((1, 4)))
    )
    assert shard.table.info().inserted_total > 0


def test_weights_far_larger_than_its_network_are_refused_and_it_plays_on_with_its_own(
    make_shard, params, run_actor
):
    """Issue 31: an actor accepted weights as large as its pod. Once it holds its network's weights it accepts later
    ones of at most twice their size (plus 1 MiB): a service sending far more is refused from its header, nothing
    is allocated, and the actor goes on playing the weights it has."""
    shard = make_shard(TableConfig(capacity=100_000, alpha=1.0))
    service = params()
    service.store.publish(weights(0))
    run = run_actor(params=service.address, replay=(shard.address,), pull_every=20, max_steps_per_second=2000)
    wait_until(lambda: run.actor.weight_version == 1, "the actor got version 1")
    huge = {**weights(1), "padding": np.zeros(2 << 20, np.uint8)}  # 2 MiB more than its ~1.5 kB network
    service.store.publish(huge, version=2)
    wait_until(
        lambda: run.metric("apexrl_actor_weight_fetch_failures_total") >= 2,
        "the actor refused version 2 twice",
    )
    assert run.running() and run.actor.weight_version == 1
    service.store.publish(weights(3), version=3)  # the right size again: taken
    wait_until(
        lambda: run.running() and run.actor.weight_version == 3, "the actor took version 3", timeout=30
    )
    run.stop.set()
    run.join()


class CancellingServicer(ParameterServicer):
    """The real servicer, except that Fetch answers CANCELLED once `cancel` is set: what a Fetch gets when the
    service stops under it (a stopping server answers some calls in flight CANCELLED, others UNAVAILABLE)."""

    cancel = False

    async def Fetch(self, request, context):  # noqa: N802 (gRPC name)
        if self.cancel:
            await context.abort(grpc.StatusCode.CANCELLED, "the parameter service is stopping")
        async for response in super().Fetch(request, context):
            yield response


def test_a_pull_cut_off_by_the_parameter_service_stopping_does_not_end_the_actor(make_shard, run_actor):
    shard = make_shard(TableConfig(capacity=100_000, alpha=1.0))
    registry, store = CollectorRegistry(), WeightStore()
    servicer = CancellingServicer(store, RpcMetrics(registry, "params"), registry)
    server = AioServerThread(
        lambda s: parameters_pb2_grpc.add_ParameterServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
        max_message_bytes=4 * 1024 * 1024,
    )
    port = server.start("127.0.0.1:0")
    try:
        store.publish(weights(0))
        run = run_actor(
            params=f"127.0.0.1:{port}", replay=(shard.address,), pull_every=20, max_steps_per_second=2000
        )
        wait_until(lambda: run.actor.weight_version == 1, "the actor got version 1")
        servicer.cancel = True
        steps = run.actor.env_steps
        wait_until(
            lambda: (
                run.running()
                and run.metric("apexrl_actor_weight_fetch_failures_total") >= 3
                and run.actor.env_steps >= steps + 200
            ),
            "the actor acted on through cancelled pulls",
        )
        assert run.actor.weight_version == 1
    finally:
        server.stop(0)


def test_the_evaluator_plays_rounds_of_greedy_episodes_each_round_with_the_newest_weights(
    make_shard, params, run_actor, caplog
):
    caplog.set_level(logging.INFO, logger="apexrl.actor")
    shard = make_shard()
    service = params()
    service.store.publish(
        weights(0)
    )  # v1: the learner's untrained network, which the evaluator does not play
    run = run_actor(
        params=service.address, evaluate=True, num_envs=5, max_episodes=10, evaluation_round_seconds=2.0
    )
    assert run.actor.explorer.scale == 0.0 and run.actor.shards == []
    wait_until(
        lambda: "evaluator: waiting for weights v2 or later" in caplog.text, "the evaluator passed over v1"
    )
    service.store.publish(weights(1))
    wait_until(lambda: run.actor.episodes >= 5, "a first round of 5 evaluation episodes")
    service.store.publish(weights(3))  # while the evaluator rests (at least 2 s minus its round's length)
    run.join()
    episodes = read_episodes(run.csv)
    assert len(episodes) == 10 and all(e.role == EVALUATE for e in episodes)
    assert [e.weight_version for e in episodes] == [2] * 5 + [3] * 5  # one version per round, the newest
    assert shard.table.info().inserted_total == 0
    # Its log says how the greedy policy does: one line per round (docs/deploy-kubernetes.md, "Watch").
    rounds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluation round")]
    for k, line in enumerate(rounds):
        mean = sum(e.episode_return for e in episodes[5 * k : 5 * k + 5]) / 5
        assert line.startswith(
            f"evaluation round {k + 1} (weights v{k + 2}): 5 greedy episodes, mean return {mean:.1f} (min "
        ), line
    assert len(rounds) == 2, caplog.text


def test_the_evaluator_keeps_the_weights_it_scored_and_a_confirmed_solving_round_freezes_them(
    params, run_actor, tmp_path
):
    """CartPole pays 1 per step, so any policy's round averages at least 8: a target of 1 is reached by the first
    round of 100 episodes, confirmed by the second with the same weights, though newer ones are published."""
    import apexrl
    from apexrl.actor.kept_policy import KeptRecord

    service = params()
    service.store.publish(weights(0))  # v1, untrained: the evaluator waits for v2
    path = tmp_path / "checkpoints" / "best.npz"
    run = run_actor(
        params=service.address,
        evaluate=True,
        num_envs=100,
        max_episodes=300,
        evaluation_round_seconds=0,
        keep_policy=str(path),
        target_return=1.0,
    )
    offer = run.actor.kept.offer

    def offer_then_publish(*args):
        """v3 appears right after the first round (in the evaluator's thread: before the second starts)."""
        record = offer(*args)
        if service.store.version == 2:
            service.store.publish(weights(2))
        return record

    run.actor.kept.offer = offer_then_publish
    service.store.publish(weights(1))
    run.join(120)
    record = KeptRecord.read(path.with_suffix(".json"))
    assert record is not None and record.solved and record.weight_version == 2 and record.round == 2
    episodes = read_episodes(run.csv)
    assert [e.weight_version for e in episodes[:200]] == [
        2
    ] * 200  # the candidate's round and its confirmation
    assert record.mean_return_100 == pytest.approx(sum(e.episode_return for e in episodes[100:200]) / 100)
    assert {e.weight_version for e in episodes[200:]} == {3}  # later rounds play newer weights ...
    policy = apexrl.load_policy(path)  # ... and the file still holds the weights the solving round played
    for name, array in weights(1).items():
        np.testing.assert_array_equal(policy._weights[name], array)
    assert policy.weight_version == 2 and policy.kept["solved"] is True and policy.updates is None


class CounterEnv(gym.Env):
    """Observations [tag, t]: tag = the seed of the first reset (so each environment of a vector environment is
    told apart), t = steps since the episode began. Reward REWARD per step; the episode terminates at t = 5 +
    tag % 3 and is truncated at t = 6 (registered with max_episode_steps 6)."""

    REWARD = 5.0

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.tag = self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.tag = seed
        self.t = 0
        return np.array([self.tag, self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.tag, self.t], np.float32), self.REWARD, self.t == 5 + self.tag % 3, False, {}


gym.register("apexrl-test/Counter-v0", entry_point=CounterEnv, max_episode_steps=6)


@pytest.mark.parametrize("clip", [False, True])
def test_a_vector_environment_assembles_n_step_transitions_per_environment(
    make_shard, params, run_actor, clip
):
    shard = make_shard(TableConfig(capacity=10_000, alpha=0.0, seed=0))  # alpha 0: uniform sampling
    service = params()
    run = run_actor(
        params=service.address,
        replay=(shard.address,),
        env="apexrl-test/Counter-v0",
        num_envs=3,
        max_env_steps=3 * 40,
        pull_every=1000,
        batch_size=4,
        act_before_weights=False,  # it waits for the weights published below, so the flag set here comes first
    )
    run.actor.clip_rewards = clip  # as for Atari: train on rewards clipped to [-1, 1], report true returns
    torch.manual_seed(0)
    service.store.publish(state_dict_to_numpy(DuelingQNetwork(2, 2, (8,))))  # the actor starts on these
    run.join()
    run.actor.close()
    columns = shard.table.sample(4096).columns  # ~120 rows: each drawn with probability 1 - e^-34
    tags, t0 = columns["obs"][:, 0], columns["obs"][:, 1]
    # Seeds 0, 1, 2 (seed 0 * 1000 + actor 0 * 3 + i): episodes end terminated at t = 5 and 6, truncated at 6.
    assert set(tags.tolist()) == {0.0, 1.0, 2.0}
    reward = 1.0 if clip else CounterEnv.REWARD
    for row in range(len(tags)):
        tag, start = int(tags[row]), int(t0[row])
        end = min(5 + tag % 3, 6)
        terminated = 5 + tag % 3 <= 6
        k = min(3, end - start)  # n = 3, cut at the episode's end
        assert columns["next_obs"][row].tolist() == [tag, start + k]  # same environment, k steps later
        assert columns["reward"][row] == pytest.approx(reward * sum(GAMMA**j for j in range(k)), rel=1e-5)
        want_discount = 0.0 if terminated and start + k == end else GAMMA**k
        assert columns["discount"][row] == pytest.approx(want_discount, rel=1e-5)
    # Every step of an episode starts a transition.
    assert set(zip(tags.tolist(), t0.tolist(), strict=True)) == {
        (tag, start) for tag in (0.0, 1.0, 2.0) for start in range(min(5 + int(tag) % 3, 6))
    }
    episodes = read_episodes(run.csv)
    assert sorted({e.length for e in episodes}) == [5, 6]
    assert all(
        e.episode_return == CounterEnv.REWARD * e.length for e in episodes
    )  # true returns, even clipped
    # 40 steps of each environment: all sent but up to n - 1 = 2 per environment still waiting for their return
    # and fewer than a batch (4) not yet sent.
    assert 3 * 40 - 3 * 2 - 3 <= shard.table.info().inserted_total <= 3 * 40


def test_rows_carry_the_weights_version_that_made_them_and_the_lag_is_exported(make_shard, params, run_actor):
    shard = make_shard(TableConfig(capacity=100_000, alpha=1.0))
    service = params()
    service.store.publish(weights(0))
    run = run_actor(params=service.address, replay=(shard.address,), pull_every=50, max_steps_per_second=3000)
    wait_until(lambda: shard.table.info().size >= BATCH, "a first batch with version 1")
    # The gauge says how far behind the last pull found the actor: the next pull (not newer) sets it back to 0,
    # so record what each pull set rather than race it with a scrape.
    lags: list[float] = []
    gauge = run.actor.metrics.weight_lag
    original_set = gauge.set
    gauge.set = lambda value: (lags.append(value), original_set(value))[1]
    service.store.publish(weights(1), version=4)  # versions 2 and 3 went by unseen: the actor was 3 behind
    wait_until(lambda: run.actor.weight_version == 4, "the actor pulled version 4")
    assert 3 in lags and run.metric("apexrl_actor_weight_version_lag_versions") in (0, 3)
    wait_until(
        lambda: 4 in set(shard.table.sample(4096).columns["weight_version"].tolist()), "rows of version 4"
    )
    run.stop.set()
    run.join()
    versions = set(shard.table.sample(4096).columns["weight_version"].tolist())
    assert versions <= {1, 4} and {1, 4} <= versions  # never a version the actor did not act with


def test_an_actor_held_back_by_full_shards_finds_a_shard_that_joins_its_name_meanwhile(
    make_shard, params, run_actor
):
    """A headless Service lists only the pods Ready when an actor resolves it. The actor, held back by the one
    shard it knew (its rate limiter holds inserts until the learner samples, and the learner waits for more rows
    than that shard admits), must keep following the name, or the fleet deadlocks (seen in the pod emulation)."""
    # Shard A on 127.0.0.1:P admits 64 rows before anything samples; shard B is on 127.0.0.2:P, the same port.
    full = make_shard(
        TableConfig(
            capacity=10_000,
            seed=0,
            min_size_to_sample=32,
            samples_per_insert=1.0,
            samples_per_insert_tolerance=32.0,
        )
    )
    port = int(full.address.rsplit(":", 1)[1])
    joining = ReplayTable(TableConfig(capacity=10_000, seed=1))
    made = create_replay_server(joining, f"127.0.0.2:{port}")
    server = made.server
    try:
        resolved = ["127.0.0.1"]
        service = params()
        target = f"dns:///fleet.test:{port}"
        run = run_actor(params=service.address, replay=(target,), pull_every=1000)
        run.actor.writer._addresses = ShardAddresses(
            (target,), resolve_every=0.1, resolver=lambda name, p: list(resolved)
        )
        service.store.publish(weights(0))
        wait_until(
            lambda: full.table.info().inserted_total >= 64, "shard A filled up to its limiter", timeout=30
        )
        wait_until(
            lambda: run.actor.shards and run.actor.shards[0].pending >= 8, "the actor held back", timeout=30
        )
        assert joining.info().inserted_total == 0 and run.running()
        resolved.append("127.0.0.2")  # the second pod becomes Ready
        wait_until(
            lambda: joining.info().inserted_total > 0,
            "the actor inserts into the shard that joined",
            timeout=15,
        )
        assert run.running()
    finally:
        joining.close()
        server.stop(0)

"""R2D2's data path end to end on real parts, the role processes aside: CartPoleNoVel-v1 played by the recurrent
policy rebuilt from the learner's weights (its state per environment), each environment's windows written as a
trajectory of a real sequence shard on 127.0.0.1, sampled across shards by each of the learner's feeds (the sampler
process, the default, and the thread), trained on by R2D2's learning, and the new priorities written back to the
items."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.r2d2.acting import RecurrentActing, make_policy
from apexrl.algorithms.r2d2.learning import R2D2Learning
from apexrl.algorithms.r2d2.writing import Geometry, StepEncoder, item_signature, replay_signature
from apexrl.common.environments import make_env
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.config import LearnerConfig
from apexrl.learner.learner import make_sampler
from apexrl.replay_server import ShardedWriter
from apexrl.replay_server.client.sequence_writer import SequenceWriter
from apexrl.replay_server.core.table import TableConfig

GEOMETRY = Geometry(burn_in=4, train_length=8, period=6, gamma=0.99, n_step=3)
CORE = 16


class Settings:
    network, hidden_sizes, lstm_size, learning_rate = "mlp", (32,), CORE, 1e-3
    target_update_period, sequence_burn_in, sequence_n_step = 10, GEOMETRY.burn_in, GEOMETRY.n_step


def play(writer: ShardedWriter, learning: R2D2Learning, spaces: EnvSpaces, steps: int, envs: int = 3) -> int:
    """`envs` environments stepped in turn by one acting state; returns the windows written."""
    policy = make_policy(learning.acting_weights(), spaces)
    acting = RecurrentActing(epsilon=0.3, rng=np.random.default_rng(0))
    games = [make_env("CartPoleNoVel-v1") for _ in range(envs)]
    obs = np.stack([game.reset(seed=i)[0] for i, game in enumerate(games)])
    encoders = [StepEncoder(GEOMETRY) for _ in range(envs)]
    windows = [
        SequenceWriter(
            writer, length=GEOMETRY.length, period=GEOMETRY.period, trajectory=i, priority=e.priority
        )
        for i, e in enumerate(encoders)
    ]
    state = acting.initial_state(envs, CORE)
    for _ in range(steps):
        before = state.item_fields()
        actions, state = acting.act(policy, obs, state)
        q = acting.last_q
        rewards, done = np.zeros(envs, np.float32), np.zeros(envs, bool)
        for i, game in enumerate(games):
            next_obs, reward, terminated, truncated, _ = game.step(int(actions[i]))
            fields = {name: value[i] for name, value in before.items()}
            windows[i].append(
                *encoders[i].step(obs[i], actions[i], reward, terminated, fields, q[i], version=1)
            )
            rewards[i], done[i] = reward, terminated or truncated
            if done[i]:
                windows[i].end_episode()
                encoders[i].end_episode()
                next_obs, _ = game.reset()
            obs[i] = next_obs
        state = acting.reset(acting.observe(state, rewards), done)
    writer.flush()
    return sum(w.items_sent for w in windows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampler_process", [True, False], ids=["process_feed", "thread_feed"])
def test_windows_played_written_sampled_and_trained_on(make_shard, sampler_process: bool) -> None:
    torch.manual_seed(0)
    spaces = EnvSpaces.vector(4, 2)
    learning = R2D2Learning(Settings(), spaces, torch.device("cpu"))
    config = TableConfig(
        capacity=5000,
        max_sequence_length=GEOMETRY.length,
        signature=replay_signature(spaces, None),
        item_signature=item_signature(CORE),
        seed=0,
    )
    shards = [make_shard(config) for _ in range(2)]
    with ShardedWriter([s.address for s in shards], first_shard=0) as writer:
        written = play(writer, learning, spaces, steps=200)
    held = sum(s.table.info().size for s in shards)
    assert written == held > 50  # every window written is held (each trajectory stays on one shard)
    feed = make_sampler(
        LearnerConfig(
            replay=tuple(s.address for s in shards),
            batch_size=32,
            seed=3,
            min_replay_size=1,
            prefetch_depth=2,
            sampler_process=sampler_process,
        )
    ).start(lambda: 0.6)
    try:
        losses, lags = [], []
        for step in range(1, 31):
            batch = feed.get(timeout=30)
            assert batch is not None
            columns = {name: torch.as_tensor(np.asarray(value)) for name, value in batch.columns.items()}
            assert columns["obs"].shape == (32, GEOMETRY.length, 4)
            assert columns["state"].shape == (32, 2, CORE)  # each item's stored state (h, c)
            result = learning.update(columns, torch.as_tensor(batch.weights), step)
            feed.update_priorities(batch, result.td_abs.numpy().astype(np.float64) + 1e-6)
            losses.append(float(result.loss))
            lags.append(np.array(batch.columns["weight_version"]))  # a copy: the slot is reused
        feed.flush_updates(timeout=30)
    finally:
        feed.stop(wait=False)
        feed.close()
    assert all(np.isfinite(losses))
    assert sum(s.table.info().updated_total for s in shards) >= 30 * 32  # priorities went back to the items
    assert (
        np.concatenate(lags) == 1
    ).all()  # each item's acting version came through for the parameter-lag metric

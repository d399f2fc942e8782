"""The built-in actor on Box action spaces (Ape-X DPG's acting half): for Pendulum, a Box2D and two MuJoCo tasks it
plays the published policy with Gaussian noise, stores actions as float32 vectors inside each dimension's bounds,
and sends the n-step TD error of the stored action as each row's initial priority. The evaluator adds no noise."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from apexrl.actor.apex_actor import MIN_PRIORITY
from apexrl.algorithms.dpg.acting import NumpyDPGPolicy
from apexrl.algorithms.dpg.networks import build_networks
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.environments import env_spaces
from apexrl.replay_server.core.table import TableConfig
from tests.conftest import wait_until

# (environment, the extra that brings it; missing is a failure: scripts/setup.sh installs every extra)
ENVIRONMENTS = [
    ("Pendulum-v1", None),
    ("LunarLanderContinuous-v3", "Box2D"),
    ("HalfCheetah-v5", "mujoco"),
    ("InvertedPendulum-v5", "mujoco"),
]


def dpg_weights(env_id: str, seed: int = 0) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    _, _, policy, (critic,) = build_networks("auto", env_spaces(env_id), (32,), critics=1)
    return {**state_dict_to_numpy(policy, "policy."), **state_dict_to_numpy(critic, "critic.")}


@pytest.mark.parametrize(("env_id", "module"), ENVIRONMENTS)
def test_an_actor_on_a_box_space_stores_bounded_float_actions_with_their_td_error(
    env_id, module, make_shard, params, run_actor
):
    if module is not None:
        importlib.import_module(module)
    spaces = env_spaces(env_id)
    shard = make_shard(TableConfig(capacity=10_000, alpha=1.0, seed=0))
    service = params()
    published = dpg_weights(env_id)
    service.store.publish(published)
    run = run_actor(
        env=env_id,
        params=service.address,
        replay=(shard.address,),
        actor_index=1,
        num_actors=4,
        max_env_steps=200,
        random_steps=50,
        pull_every=1000,
    )
    run.join(120)
    run.actor.close()
    assert run.actor.algorithm.name == "dpg" and run.actor.explorer.random_steps == 50
    assert run.metric("apexrl_actor_noise_scale") == pytest.approx(0.5 * 0.1 ** (1 / 3))
    wait_until(lambda: shard.table.info().size >= 176, "the actor's batches arrived")
    batch = shard.table.sample(512)
    action = batch.columns["action"]
    assert action.dtype == np.float32 and action.shape[1:] == (spaces.action_dim,)
    low, high = np.array(spaces.action_low, np.float32), np.array(spaces.action_high, np.float32)
    assert (action >= low).all() and (action <= high).all()
    assert len(np.unique(action[:, 0])) > 100  # noisy, not one greedy action repeated
    policy = NumpyDPGPolicy(published)
    np.testing.assert_allclose(
        batch.priorities, policy.initial_priorities(batch.columns) + MIN_PRIORITY, rtol=1e-4, atol=1e-5
    )


def test_the_evaluator_plays_the_policy_without_noise(make_shard, params, run_actor):
    service = params()
    published = dpg_weights("Pendulum-v1")
    service.store.publish(published)
    run = run_actor(
        env="Pendulum-v1",
        params=service.address,
        evaluate=True,
        num_envs=2,
        max_episodes=2,
        evaluation_round_seconds=0,
        min_weight_version=1,  # the one version published here is played
    )
    policy = NumpyDPGPolicy(published)
    seen = []
    original = run.actor.explorer.actions

    def spy(acting, obs):
        actions = original(acting, obs)
        seen.append((np.array(obs), actions))
        return actions

    run.actor.explorer.actions = spy
    run.join(120)
    assert run.actor.explorer.scale == 0.0 and run.actor.episodes == 2 and seen
    for obs, actions in seen:
        np.testing.assert_allclose(actions, policy.greedy(obs), rtol=1e-6)

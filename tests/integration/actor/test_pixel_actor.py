"""`apexrl actor` as a real process on pixel environments (MinAtar, Atari through ale-py), against a real shard
and a real parameter service serving a convolutional network: image rows arrive in their own dtype (bool planes,
uint8 frame stacks), compressed one zstd frame per row (raw with --compress none), with the actor's torch
priorities, from a vector environment of two."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from apexrl.actor.apex_actor import MIN_PRIORITY
from apexrl.algorithms.dqn.acting import make_policy
from apexrl.algorithms.dqn.networks import build_network
from apexrl.algorithms.dqn.torch_policy import TorchDuelingPolicy
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.compression import decompress
from apexrl.common.environments import env_spaces
from apexrl.parameter_server.service import create_parameter_server
from apexrl.replay_server.core.table import TableConfig

GAMMA = 0.99
BATCH = 16


@pytest.fixture
def params():
    made = create_parameter_server("127.0.0.1:0")
    server, port, store = made.server, made.port, made.store
    yield f"127.0.0.1:{port}", store
    server.stop(0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("env_id", "package", "image", "compress"),
    [
        ("MinAtar/Breakout-v1", "minatar", "bool[10,10,4]@zstd", "zstd"),
        ("ALE/Pong-v5", "ale_py", "uint8[4,84,84]@zstd", "zstd"),
        ("ALE/Pong-v5", "ale_py", "uint8[4,84,84]", "none"),
    ],
)
def test_an_actor_process_on_a_pixel_environment_inserts_image_rows(
    make_shard, params, env_id, package, image, compress
):
    importlib.import_module(package)  # the [atari] extra (scripts/setup.sh installs it): missing is a failure
    shard = make_shard(TableConfig(capacity=1000, alpha=1.0, seed=0))  # alpha 1: priorities stored as sent
    address, store = params
    spaces = env_spaces(env_id)
    torch.manual_seed(0)
    weights = state_dict_to_numpy(build_network("auto", spaces))
    store.publish(weights)
    # 2 environments, 60 steps in all: 30 each, of which 28 have their 3-step return: 56 rows, 3 batches of 16.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "actor",
            "--env",
            env_id,
            "--params",
            address,
            "--replay",
            shard.address,
            "--num-envs",
            "2",
            "--batch-size",
            str(BATCH),
            "--max-env-steps",
            "60",
            "--pull-every",
            "1000",
            "--metrics-port",
            "-1",
            "--seed",
            "0",
            "--gamma",
            str(GAMMA),
            "--compress",
            compress,
        ],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(shard.table.signature) == (
        f"obs:{image},action:int64[],reward:float32[],discount:float32[],"
        f"next_obs:{image},weight_version:int64[]"
    )
    assert shard.table.info().inserted_total >= 2 * BATCH
    batch = shard.table.sample(256)
    if compress != "none":  # the shard holds frames; decompress as the learner's data path does
        assert batch.writers and batch.columns["obs"].compression == compress
        batch.columns.update({name: decompress(batch.columns[name])[0] for name in ("obs", "next_obs")})
        info = shard.table.info()
        assert info.stored_bytes / info.size < (2_000 if spaces.obs_shape == (4, 84, 84) else 200)
    obs, next_obs = batch.columns["obs"], batch.columns["next_obs"]
    assert obs.shape[1:] == spaces.obs_shape and obs.dtype == np.dtype(spaces.obs_dtype)
    assert obs.any(axis=tuple(range(1, obs.ndim))).all()  # real screens, not zeros
    # The initial priorities are the actor's torch network's |TD error| on exactly these rows.
    policy = make_policy(weights, spaces)
    assert isinstance(policy, TorchDuelingPolicy)
    np.testing.assert_allclose(
        batch.priorities, policy.initial_priorities(batch.columns) + MIN_PRIORITY, rtol=1e-4, atol=1e-5
    )
    if spaces.obs_shape == (4, 84, 84):
        # Mid-episode rows (Pong's random episodes outlast 30 steps) bootstrap 3 steps later in the same game:
        # the newest frame of obs is the oldest of next_obs' stack of 4.
        mid = np.isclose(batch.columns["discount"], GAMMA**3)
        assert mid.all()
        np.testing.assert_array_equal(next_obs[:, 0], obs[:, 3])

"""A learner whose publish the parameter service refuses for its version re-synchronises instead of dying (issue
16, item 4): it reads the service's version and publishes above it. Before, one Publish of version 2**64 - 1 by
anyone made the learner's next publish fail with INVALID_ARGUMENT, the learner exited, and on restart it asked for
version 2**64 from its checkpoint and crash-looped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from apexrl.algorithms.checkpoint import load_checkpoint, save_checkpoint
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.feed import ThreadFeed
from apexrl.learner.learner import Learner
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.service import create_parameter_server
from apexrl.parameter_server.weights import MAX_VERSION_STEP
from tests.integration.learner.test_main import filled_shard, learner_process
from tests.support.checkpoints import dqn_checkpoint
from tests.unit.learner.fakes import FakeSampler, config, make_batch


@pytest.fixture
def service():
    registry = CollectorRegistry()
    made = create_parameter_server("127.0.0.1:0", registry=registry)
    server, port, store = made.server, made.port, made.store
    with ParameterClient(f"127.0.0.1:{port}", timeout=10) as client:
        yield store, client
    server.stop(0).wait(10)


def test_a_learner_whose_version_is_refused_publishes_above_the_services_version(service):
    store, client = service
    registry = CollectorRegistry()
    cfg = config(publish_every=1)
    learner = Learner(
        cfg,
        EnvSpaces.vector(4, 2),
        ThreadFeed(FakeSampler(), cfg),
        client.publish,
        registry,
        service_version=client.version,
    )
    resyncs = lambda: registry.get_sample_value("apexrl_learner_weight_version_resyncs_total")  # noqa: E731
    learner.train_step(make_batch(range(8)))
    assert learner.weight_version == store.version == 1

    # Another publisher went as far ahead as the service allows: the learner's next version is not above it.
    store.publish({"other": np.zeros(2, np.float32)}, version=1 + MAX_VERSION_STEP)
    learner.train_step(make_batch(range(8, 16)))
    assert learner.weight_version == store.version == 2 + MAX_VERSION_STEP and resyncs() == 1
    assert "other" not in store.latest().arrays()  # the learner's weights, not the other publisher's

    # Restarted from a checkpoint far ahead of the service (what the old service let anyone cause).
    for far in (2**64 - 1, store.version + MAX_VERSION_STEP + 1):
        learner.weight_version = far
        learner.train_step(make_batch(range(16, 24)))
        assert learner.weight_version == store.version < 3 + 3 * MAX_VERSION_STEP
    assert resyncs() == 3
    assert registry.get_sample_value("apexrl_learner_publish_failures_total") == 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosted", [False, True], ids=["standalone service", "hosted service"])
def test_a_learner_restarted_from_a_checkpoint_far_ahead_of_the_service_trains_and_publishes(
    tmp_path, make_shard, hosted
):
    """The checkpoint says 2**64 - 1 (the old service accepted that from anyone); the service holds 3 (standalone)
    or nothing (hosted, a new empty store). The learner must not exit: it publishes above the service's version."""
    torch.manual_seed(0)
    save_checkpoint(
        tmp_path / "run" / "checkpoints" / "checkpoint.pt",
        dqn_checkpoint(DuelingQNetwork(4, 2, (16,)), (16,), updates=5, weight_version=2**64 - 1),
    )
    shard = filled_shard(make_shard, rows=300, seed=1)
    server = store = None
    args = [
        "--replay",
        shard.address,
        "--run-dir",
        str(tmp_path / "run"),
        "--min-replay-size",
        "100",
        "--batch-size",
        "32",
        "--hidden-sizes",
        "16",
        "--publish-every",
        "5",
        "--sample-batches-per-call",
        "1",
        "--max-updates",
        "25",
    ]
    if not hosted:
        made = create_parameter_server("127.0.0.1:0")
        server, port, store = made.server, made.port, made.store
        store.publish({"w": np.zeros(3, np.float32)}, version=3)
        args += ["--params", f"127.0.0.1:{port}"]
    try:
        process = learner_process(tmp_path, *args)
        assert process.wait(120) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        if server is not None:
            server.stop(0).wait(10)
    log = (tmp_path / "learner.log").read_text()
    assert "Traceback" not in log
    assert f"the parameter service refused weights version {2**64}" in log
    resumed = load_checkpoint(tmp_path / "run")
    assert resumed.updates == 25
    # Published at start and after updates 10, 15, 20 and 25, counting from the service's version.
    assert resumed.weight_version == (3 if not hosted else 0) + 5
    if store is not None:
        assert store.version == resumed.weight_version

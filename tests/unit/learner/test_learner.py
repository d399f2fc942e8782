"""The learner (learner/learner.py) with an injected in-process sampler and publish callable: the priorities it
sends back, the target network's period, the weights it publishes, beta's annealing, and its training loop."""

from __future__ import annotations

import copy
import dataclasses
import threading

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from apexrl.algorithms.dqn.losses import double_dqn_loss
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.environments import EnvSpaces
from apexrl.learner import ShardedReplayClient
from apexrl.learner.feed import ThreadFeed
from apexrl.learner.learner import Learner, make_sampler
from apexrl.learner.sampler_process import SamplerProcess
from tests.conftest import wait_until
from tests.unit.learner.fakes import FakeSampler, Publisher, config, learner, make_batch, params, same


def test_train_step_sends_back_td_error_plus_epsilon_for_exactly_the_batchs_rows():
    lrn, sampler, _ = learner(config(priority_epsilon=0.05))
    batch = make_batch([5, 17, 2, 40, 33, 8, 11, 26])
    online, target = copy.deepcopy(lrn.learning.online), copy.deepcopy(lrn.learning.target)
    cols = {k: torch.as_tensor(v) for k, v in batch.columns.items()}
    want_loss, want_td = double_dqn_loss(
        online,
        target,
        cols["obs"],
        cols["action"],
        cols["reward"],
        cols["discount"],
        cols["next_obs"],
        torch.as_tensor(batch.weights),
    )
    before = params(lrn.learning.online)
    loss = lrn.train_step(batch)
    assert loss == pytest.approx(want_loss.item(), rel=1e-6)
    ((sent_batch, priorities),) = sampler.updates
    assert sent_batch is batch  # the sampler routes each row to its shard by the batch's keys and shard ids
    assert priorities.dtype == np.float64 and priorities.shape == (8,)
    np.testing.assert_allclose(priorities, want_td.numpy() + 0.05, rtol=1e-5)  # row j's |TD| for row j
    assert len(set(np.round(priorities, 6))) == 8  # distinct rows, so a permutation would be caught
    assert not same(before, params(lrn.learning.online))  # the optimiser stepped
    assert lrn.updates == 1


def test_importance_weights_scale_the_loss():
    (plain, _, _), (heavy, _, _) = learner(config()), learner(config())  # same seed: the same networks
    assert same(params(plain.learning.online), params(heavy.learning.online))
    batch = make_batch(range(8))
    tripled = dataclasses.replace(batch, weights=batch.weights * 3)
    assert heavy.train_step(tripled) == pytest.approx(3 * plain.train_step(batch), rel=1e-5)


def test_the_target_network_is_copied_every_target_update_period():
    lrn, _, _ = learner(config(target_update_period=3, publish_every=100))
    initial = params(lrn.learning.target)
    assert same(initial, params(lrn.learning.online))
    for update in range(1, 10):
        lrn.train_step(make_batch(range(8 * update, 8 * update + 8)))
        online = params(lrn.learning.online)
        if update % 3 == 0:
            assert same(params(lrn.learning.target), online), update
            copied = online
        else:
            assert not same(params(lrn.learning.target), online), update
            assert same(params(lrn.learning.target), initial if update < 3 else copied), update


def test_weights_are_published_every_publish_every_with_increasing_versions():
    lrn, _, publisher = learner(config(publish_every=2))
    snapshots = {}
    for update in range(1, 8):
        lrn.train_step(make_batch(range(8 * update, 8 * update + 8)))
        snapshots[update] = state_dict_to_numpy(lrn.learning.online)
    assert [version for version, _ in publisher.published] == [1, 2, 3]  # after updates 2, 4 and 6
    assert lrn.weight_version == 3
    for (_, weights), update in zip(publisher.published, (2, 4, 6), strict=True):
        assert weights.keys() == snapshots[update].keys()
        for name in weights:
            np.testing.assert_array_equal(weights[name], snapshots[update][name])
    # The published arrays are copies: training on does not change what the actors got.
    np.testing.assert_array_equal(publisher.published[0][1]["value.bias"], snapshots[2]["value.bias"])


def test_the_version_is_whatever_the_parameter_service_answers():
    lrn, _, _ = learner(config(publish_every=1))
    lrn._publish = lambda weights, version: 10 * version  # a service that numbers versions its own way
    lrn.train_step(make_batch(range(8)))
    lrn.train_step(make_batch(range(8, 16)))
    assert lrn.weight_version == 110  # 10 * (10 + 1): the next version asked is the last answer + 1


def test_a_busy_or_refusing_service_costs_a_publish_and_a_bad_request_stops_the_learner():
    """A busy service (RESOURCE_EXHAUSTED: max_concurrent_publishes) or a refused version with no way to read the
    service's own is counted as a failed publish and retried at the next one; a request that is wrong in itself is
    the learner's bug and raises."""
    from apexrl.common.errors import InvalidArgumentError, ResourceExhaustedError
    from apexrl.parameter_server.weights import VersionRefusedError

    registry = CollectorRegistry()
    cfg = config(publish_every=1)
    lrn = Learner(cfg, EnvSpaces.vector(4, 2), ThreadFeed(FakeSampler(), cfg), Publisher(), registry)
    for refusal in (
        ResourceExhaustedError("4 Publish calls are in progress"),
        VersionRefusedError("not greater"),
    ):

        def refuse(weights, version, refusal=refusal):
            raise refusal

        lrn._publish = refuse
        lrn.train_step(make_batch(range(8)))
        assert lrn.weight_version == 0
    assert registry.get_sample_value("apexrl_learner_publish_failures_total") == 2

    def malformed(weights, version):
        raise InvalidArgumentError("weights have no tensors")

    lrn._publish = malformed
    with pytest.raises(InvalidArgumentError, match="no tensors"):
        lrn.train_step(make_batch(range(8)))


def test_beta_anneals_linearly_from_start_to_end():
    lrn, _, _ = learner(config(beta_start=0.4, beta_end=1.0, beta_anneal_updates=10))
    seen = [lrn.beta()]
    for update in range(1, 15):
        lrn.train_step(make_batch(range(8 * update, 8 * update + 8)))
        seen.append(lrn.beta())
    np.testing.assert_allclose(seen[:11], np.linspace(0.4, 1.0, 11))
    assert seen[11:] == [1.0] * 4


def test_run_trains_to_max_updates_publishing_checkpointing_and_flushing(tmp_path):
    cfg = config(tmp_path, max_updates=12, publish_every=5, checkpoint_every=100)
    lrn, sampler, publisher = learner(cfg)
    stop = threading.Event()
    runner = threading.Thread(target=lrn.run, args=(stop,), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive()
    assert lrn.updates == 12 and len(sampler.updates) == 12
    assert [v for v, _ in publisher.published] == [
        1,
        2,
        3,
    ]  # at start (before any update), then after 5 and 10
    assert sampler.flushed == 1
    betas = [beta for _, _, beta in sampler.sample_calls]
    assert betas[0] == 0.4 and betas == sorted(betas) and betas[-1] > 0.4  # drawn with the current beta
    trained = {int(k) for batch, _ in sampler.updates for k in batch.keys}
    assert trained == set(range(96))  # every batch drawn in order was trained on once
    assert (tmp_path / "checkpoints" / "checkpoint.pt").is_file()  # the final checkpoint


def test_the_staleness_of_sampled_rows_is_a_histogram_of_versions_behind():
    cfg = config(max_updates=12, publish_every=5)
    registry = CollectorRegistry()
    lrn = Learner(
        cfg, EnvSpaces.vector(4, 2), ThreadFeed(FakeSampler(row_version=1), cfg), Publisher(), registry
    )
    lrn.run(threading.Event())
    value = registry.get_sample_value
    # Batches 1-5 meet version 1 (0 behind), 6-10 version 2 (1 behind), 11-12 version 3 (2 behind); 8 rows each.
    name = "apexrl_learner_sampled_row_staleness_versions"
    assert value(f"{name}_count") == 96 and value(f"{name}_sum") == 5 * 8 * 1 + 2 * 8 * 2
    assert [value(f"{name}_bucket", {"le": le}) for le in ("0.0", "1.0", "2.0", "+Inf")] == [40, 80, 96, 96]


def test_run_stops_when_asked():
    lrn, sampler, _ = learner(config())
    stop = threading.Event()
    runner = threading.Thread(target=lrn.run, args=(stop,), daemon=True)
    runner.start()
    wait_until(lambda: lrn.updates >= 3 or not runner.is_alive(), "3 updates")
    assert runner.is_alive()
    stop.set()
    runner.join(30)
    assert not runner.is_alive() and sampler.flushed == 1
    lrn.close()
    assert sampler.closed


def test_make_sampler_builds_a_sampler_process_by_default():
    cfg = config(replay=("127.0.0.1:1",), prefetch_depth=3, sample_batches_per_call=2)
    sampler = make_sampler(cfg)  # not started: no process yet
    assert isinstance(sampler, SamplerProcess) and sampler._slots == 4 and sampler._batches_per_call == 2


def test_make_sampler_builds_the_sharded_client_the_settings_describe():
    cfg = config(
        replay=("127.0.0.1:1", "127.0.0.1:2"),
        batch_size=128,
        priority_coalesce_batches=4,
        sample_timeout=3.0,
        sampler_process=False,
    )
    feed = make_sampler(cfg)  # a thread of the learner samples it (sampler_process false)
    sampler = feed.sampler
    try:
        assert isinstance(feed, ThreadFeed) and isinstance(sampler, ShardedReplayClient)
        assert [s.address for s in sampler.shards] == list(cfg.replay) and sampler.timeout == 3.0
        assert sampler.coalesce_rows == (2 * 4 - 1) * 128 // (2 * 2)  # about 4 batches' rows per shard
    finally:
        sampler.close()


@pytest.mark.parametrize(
    ("network", "given", "expected"),
    [
        ("mlp", None, 2e-3),  # vectors: the MLP's default (algorithms/dqn/networks.py DEFAULT_LEARNING_RATE)
        ("mlp", 5e-4, 5e-4),  # a given rate always wins
    ],
)
def test_adam_uses_the_networks_default_learning_rate_unless_one_is_given(network, given, expected):
    trainer, _, _ = learner(config(network=network, learning_rate=given))
    assert trainer.learning.learning_rate == expected
    assert [group["lr"] for group in trainer.learning.optimizer.param_groups] == [expected]


def test_a_convolutional_learner_keeps_the_lower_default_learning_rate():
    spaces = EnvSpaces((10, 10, 4), "bool", 3)  # MinAtar's planes
    cfg = config(network="auto", learning_rate=None, hidden_sizes=None)
    trainer = Learner(cfg, spaces, ThreadFeed(FakeSampler(), cfg), Publisher())
    assert trainer.learning.network == "minatar" and trainer.learning.learning_rate == 1e-3


# A fresh interpreter (this one may have loaded torch._dynamo already): building the learner, which builds its
# optimizer, does not import torch._dynamo (1-1.4 s of a learner's start-up, before it serves); training still does
# what torch's own wrappers did, and imports it on the first update (optimizer.step()).
DYNAMO_PROBE = """
import sys
from tests.unit.learner.fakes import config, learner, make_batch
lrn, sampler, _ = learner(config())
print("after the learner:", "torch._dynamo" in sys.modules)
lrn.train_step(make_batch(list(range(8))))
lrn.learning.state_dict()
print("after an update:", "torch._dynamo" in sys.modules)
"""


def test_building_the_learner_does_not_import_torch_dynamo():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", DYNAMO_PROBE], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["after the learner: False", "after an update: True"], done.stdout

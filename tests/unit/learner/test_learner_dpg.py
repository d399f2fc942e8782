"""The learner loop with Ape-X DPG behind the seam (a Box action space picks it): it trains, sends back priorities,
publishes the policy and the critic, exports the DPG metrics, and resumes exactly from its checkpoint."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from apexrl.algorithms.checkpoint import load_checkpoint
from apexrl.common.settings import SettingsError
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.feed import ThreadFeed
from apexrl.learner.learner import Learner
from tests.unit.learner.fakes import FakeSampler, Publisher, config, make_batch

SPACES = EnvSpaces.box((4,), (-1.0, -1.0), (1.0, 1.0))


def dpg(cfg, registry=None) -> tuple[Learner, FakeSampler, Publisher]:
    sampler, publisher = FakeSampler(action_dim=2), Publisher()
    return Learner(cfg, SPACES, ThreadFeed(sampler, cfg), publisher, registry), sampler, publisher


def params(learner: Learner) -> dict[str, torch.Tensor]:
    return {
        f"{i}.{k}": v.detach().clone()
        for i, net in enumerate((learner.learning.policy, *learner.learning.critics))
        for k, v in net.state_dict().items()
    }


def test_a_box_space_trains_dpg_and_publishes_the_policy_and_the_critic():
    registry = CollectorRegistry()
    lrn, sampler, publisher = dpg(
        config(max_updates=40, publish_every=10, target_update_period=None), registry
    )
    assert lrn.algorithm.name == "dpg" and lrn.config.target_tau == 0.005 and lrn.config.twin_critics
    lrn.run(threading.Event())
    assert lrn.updates == 40 and len(sampler.updates) == 40
    assert all(p.shape == (8,) and (p > 0).all() for _, p in sampler.updates)
    version, weights = publisher.published[-1]
    assert version == 5 and {"policy.out.weight", "policy.action_low", "critic.out.weight"} <= set(weights)
    assert not any(name.startswith("critic2") for name in weights)  # actors need one critic for priorities
    value = registry.get_sample_value
    assert value("apexrl_learner_policy_loss") is not None and value("apexrl_learner_mean_q") is not None
    for dimension in ("0", "1"):
        assert -1 <= value("apexrl_learner_policy_action_mean", {"dimension": dimension}) <= 1
        assert value("apexrl_learner_policy_action_std", {"dimension": dimension}) >= 0


def test_dpg_resumes_exactly_from_its_checkpoint(tmp_path):
    first, _, _ = dpg(config(tmp_path, publish_every=3))
    for update in range(5):
        first.train_step(make_batch(range(8 * update, 8 * update + 8), action_dim=2))
    first.save()
    saved = load_checkpoint(tmp_path)
    assert saved.algorithm == "dpg" and saved.spaces == SPACES and saved.architecture["critics"] == 2
    second, _, _ = dpg(config(tmp_path, publish_every=3, seed=1))
    assert second.updates == 5 and second.weight_version == first.weight_version
    assert all(
        torch.equal(a, b) for a, b in zip(params(first).values(), params(second).values(), strict=True)
    )
    batch = make_batch(range(100, 108), action_dim=2)
    torch.manual_seed(7)  # the same target-smoothing noise for both
    want = first.train_step(batch)
    torch.manual_seed(7)
    assert second.train_step(batch) == pytest.approx(want, rel=1e-6)
    with pytest.raises(SettingsError, match="has another network: critics 2 there, 1 in the configuration"):
        dpg(config(tmp_path, twin_critics=False))


def test_a_dqn_checkpoint_is_refused_by_a_dpg_learner(tmp_path):
    from tests.unit.learner.fakes import learner

    dqn, _, _ = learner(config(tmp_path))
    dqn.train_step(make_batch(range(8)))
    dqn.save()
    with pytest.raises(SettingsError, match="was trained by algorithm dqn; this learner runs dpg"):
        dpg(config(tmp_path))
    assert np.isfinite(load_checkpoint(tmp_path).updates)

"""Learner checkpoints (learner/checkpoint.py) and resuming from them (Learner with the same run directory): the
same updates, weight version, networks and optimiser state; a checkpoint of another network shape is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.learner.checkpoint import (
    CHECKPOINT_NAME,
    Checkpoint,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from apexrl.learner.networks import DuelingQNetwork
from tests.unit.learner.fakes import config, learner, make_batch, params, same


def checkpoint(**changes) -> Checkpoint:
    torch.manual_seed(0)
    online, target = DuelingQNetwork(4, 2, (8,)).state_dict(), DuelingQNetwork(4, 2, (8,)).state_dict()
    values = {"env_id": "CartPole-v1", "obs_dim": 4, "num_actions": 2, "hidden_sizes": (8,), "online": online,
              "target": target, "optimizer": None, "updates": 42, "weight_version": 5, **changes}
    return Checkpoint(**values)


def test_a_checkpoint_round_trips_and_is_found_from_its_run_directory(tmp_path):
    saved = checkpoint()
    path = save_checkpoint(tmp_path / "checkpoints" / CHECKPOINT_NAME, saved)
    assert not [p for p in path.parent.iterdir() if p != path]  # written atomically: no temporary file left
    for where in (path, tmp_path / "checkpoints", tmp_path):
        assert resolve_checkpoint(where) == path
        loaded = load_checkpoint(where)
        assert (loaded.env_id, loaded.obs_dim, loaded.num_actions, loaded.hidden_sizes, loaded.updates,
                loaded.weight_version, loaded.optimizer) == ("CartPole-v1", 4, 2, (8,), 42, 5, None)
        assert same(loaded.online, saved.online) and same(loaded.target, saved.target)
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*looked for checkpoint.pt"):
        resolve_checkpoint(tmp_path / "elsewhere")


def test_a_torch_file_of_another_kind_is_refused(tmp_path):
    torch.save({"format": "someone-else", "weights": torch.zeros(2)}, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match="is not an apexrl checkpoint \\(format 'someone-else'"):
        load_checkpoint(tmp_path)


def test_loading_never_runs_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickled code ran')",))

    with open(tmp_path / CHECKPOINT_NAME, "wb") as f:
        torch.save({"format": "apexrl-dqn-v1", "evil": Evil()}, f)
    # refused by torch.load(weights_only=True), not executed; reported as a file that is not a checkpoint
    with pytest.raises(ValueError, match="not an apexrl checkpoint: UnpicklingError"):
        load_checkpoint(tmp_path)


def test_a_file_that_is_not_a_checkpoint_is_refused_with_value_error(tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"these are not the weights you are looking for")
    with pytest.raises(ValueError, match="not an apexrl checkpoint"):
        load_checkpoint(tmp_path)


def test_a_new_learner_on_the_same_run_directory_resumes_exactly(tmp_path):
    first, _, publisher = learner(config(tmp_path, publish_every=2, target_update_period=3))
    for update in range(7):
        first.train_step(make_batch(range(8 * update, 8 * update + 8)))
    assert (first.updates, first.weight_version) == (7, 3)
    path = first.save()
    assert path == tmp_path / "checkpoints" / CHECKPOINT_NAME

    second, sampler, publisher2 = learner(config(tmp_path, publish_every=2, target_update_period=3, seed=1))
    assert (second.updates, second.weight_version) == (7, 3)
    assert same(params(second.online), params(first.online)) and same(params(second.target), params(first.target))
    assert not same(params(second.online), params(second.target))  # both networks came back, not one twice
    first_state, second_state = first.optimizer.state_dict(), second.optimizer.state_dict()
    assert first_state["param_groups"] == second_state["param_groups"]
    for key, value in first_state["state"].items():
        assert same(value, second_state["state"][key])
    # Both continue identically: the same next update, and versions that never go backwards for the actors.
    batch = make_batch(range(100, 108))
    assert second.train_step(batch) == pytest.approx(first.train_step(batch), rel=1e-6)
    assert same(params(second.online), params(first.online))
    np.testing.assert_allclose(sampler.updates[0][1], first.sampler.updates[-1][1], rtol=1e-6)
    assert [v for v, _ in publisher2.published] == [4] == [v for v, _ in publisher.published[3:]]  # update 8
    assert second.publish_weights() == 5


def test_a_checkpoint_of_another_network_shape_is_refused(tmp_path):
    first, _, _ = learner(config(tmp_path, hidden_sizes=(16,)))
    first.train_step(make_batch(range(8)))
    first.save()
    with pytest.raises(ValueError, match=r"has network 4->\(16,\)->2, the configuration wants 4->\(32,\)->2"):
        learner(config(tmp_path, hidden_sizes=(32,)))
    assert load_checkpoint(tmp_path).updates == 1  # left as it was


def test_without_a_run_directory_nothing_is_resumed_or_saved(tmp_path):
    lrn, _, _ = learner(config())
    assert lrn.config.checkpoint_dir is None and lrn.updates == 0

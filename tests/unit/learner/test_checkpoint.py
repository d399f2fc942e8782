"""Checkpoints (algorithms/checkpoint.py) and resuming from them (Learner with the same run directory): the
same updates, weight version, networks and optimiser state; a checkpoint of another network shape or algorithm is
refused; checkpoints of the DQN-only format (apexrl-dqn-v1) still load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from apexrl.algorithms.checkpoint import (
    CHECKPOINT_NAME,
    KEPT_POLICY_NAME,
    Checkpoint,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from apexrl.algorithms.dqn.networks import DuelingQNetwork
from apexrl.algorithms.policy_file import PolicyFile, save_policy_file
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.env_settings import EnvChoice
from apexrl.common.spaces import EnvSpaces
from tests.unit.learner.fakes import config, learner, make_batch, params, same


def checkpoint(**changes) -> Checkpoint:
    torch.manual_seed(0)
    online_net = DuelingQNetwork(4, 2, (8,))
    online, target = online_net.state_dict(), DuelingQNetwork(4, 2, (8,)).state_dict()
    values = {
        "env_id": "CartPole-v1",
        "algorithm": "dqn",
        "spaces": EnvSpaces.vector(4, 2),
        "architecture": {"network": "mlp", "hidden_sizes": [8]},
        "state": {"online": online, "target": target, "optimizer": None},
        "acting_weights": state_dict_to_numpy(online_net),
        "updates": 42,
        "weight_version": 5,
        **changes,
    }
    return Checkpoint(**values)


def test_a_checkpoint_round_trips_and_is_found_from_its_run_directory(tmp_path):
    saved = checkpoint()
    path = save_checkpoint(tmp_path / "checkpoints" / CHECKPOINT_NAME, saved)
    assert not [p for p in path.parent.iterdir() if p != path]  # written atomically: no temporary file left
    for where in (path, tmp_path / "checkpoints", tmp_path):
        assert resolve_checkpoint(where) == path
        loaded = load_checkpoint(where)
        assert (
            loaded.env_id,
            loaded.algorithm,
            loaded.spaces,
            loaded.architecture,
            loaded.updates,
            loaded.weight_version,
        ) == ("CartPole-v1", "dqn", EnvSpaces.vector(4, 2), {"network": "mlp", "hidden_sizes": [8]}, 42, 5)
        assert same(loaded.state["online"], saved.state["online"]) and same(
            loaded.state["target"], saved.state["target"]
        )
        assert loaded.state["optimizer"] is None
        assert loaded.acting_weights.keys() == saved.acting_weights.keys()
        for name, array in saved.acting_weights.items():
            np.testing.assert_array_equal(loaded.acting_weights[name], array)
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*looked for best.npz or checkpoint.pt"):
        resolve_checkpoint(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*looked for checkpoint.pt, also"):
        resolve_checkpoint(tmp_path / "elsewhere", "last")


def save_kept_policy(path, version: int = 9):
    """What the evaluator writes (actor/apex_actor.py _save_kept): acting weights and their record, numpy only."""
    full = checkpoint(weight_version=version)
    record = {"weight_version": version, "round": 4, "mean_return": 481.5, "episodes": 100, "solved": True}
    return save_policy_file(
        path,
        PolicyFile(
            algorithm=full.algorithm,
            env=EnvChoice(full.env_id),
            spaces=full.spaces,
            weights=full.acting_weights,
            weight_version=version,
            kept=record,
        ),
    )


def test_a_run_directory_gives_the_kept_policy_by_default_and_the_last_checkpoint_on_request(tmp_path):
    last = save_checkpoint(tmp_path / "checkpoints" / CHECKPOINT_NAME, checkpoint(weight_version=12))
    assert resolve_checkpoint(tmp_path) == last  # no kept policy (no evaluator): the last checkpoint
    best = save_kept_policy(tmp_path / "checkpoints" / KEPT_POLICY_NAME, 9)
    for where in (tmp_path, tmp_path / "checkpoints"):
        assert resolve_checkpoint(where) == best == resolve_checkpoint(where, "best")
        assert resolve_checkpoint(where, "last") == last
    assert resolve_checkpoint(last, "best") == last  # a file named directly is taken as it is
    loaded = load_checkpoint(tmp_path)
    assert (loaded.weight_version, loaded.updates, loaded.state, loaded.architecture) == (9, None, {}, {})
    assert loaded.kept["solved"] is True and loaded.kept["mean_return"] == 481.5
    assert load_checkpoint(tmp_path, weights="last").weight_version == 12
    with pytest.raises(ValueError, match=r"weights \('newest'\) must be one of best, last"):
        resolve_checkpoint(tmp_path, "newest")


def test_load_policy_plays_the_kept_weights_and_says_which_they_are(tmp_path):
    import apexrl

    save_checkpoint(tmp_path / "checkpoints" / CHECKPOINT_NAME, checkpoint(weight_version=12))
    save_kept_policy(tmp_path / "checkpoints" / KEPT_POLICY_NAME, 9)
    policy = apexrl.load_policy(tmp_path)
    assert policy.weight_version == 9 and policy.kept["round"] == 4
    assert "kept by the evaluator: round 4, mean return 481.5 over 100 episodes, solved the run" in repr(
        policy
    )
    last = apexrl.load_policy(tmp_path, "last")
    assert last.weight_version == 12 and last.kept is None
    assert "the learner's weights v12 after 42 updates" in repr(last)
    assert policy.act(np.zeros(4, np.float32)) in (0, 1)


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
    assert same(params(second.learning.online), params(first.learning.online)) and same(
        params(second.learning.target), params(first.learning.target)
    )
    assert not same(
        params(second.learning.online), params(second.learning.target)
    )  # both networks came back, not one twice
    first_state, second_state = first.learning.optimizer.state_dict(), second.learning.optimizer.state_dict()
    assert first_state["param_groups"] == second_state["param_groups"]
    for key, value in first_state["state"].items():
        assert same(value, second_state["state"][key])
    # Both continue identically: the same next update, and versions that never go backwards for the actors.
    batch = make_batch(range(100, 108))
    assert second.train_step(batch) == pytest.approx(first.train_step(batch), rel=1e-6)
    assert same(params(second.learning.online), params(first.learning.online))
    np.testing.assert_allclose(sampler.updates[0][1], first.sampler.sampler.updates[-1][1], rtol=1e-6)
    assert [v for v, _ in publisher2.published] == [4] == [v for v, _ in publisher.published[3:]]  # update 8
    assert second.publish_weights() == 5


def test_a_checkpoint_of_another_network_shape_is_refused(tmp_path):
    first, _, _ = learner(config(tmp_path, hidden_sizes=(16,)))
    first.train_step(make_batch(range(8)))
    first.save()
    with pytest.raises(
        ValueError, match=r"has another network: hidden_sizes \[16\] there, \[32\] in the configuration"
    ):
        learner(config(tmp_path, hidden_sizes=(32,)))
    assert load_checkpoint(tmp_path).updates == 1  # left as it was


def test_a_checkpoint_of_the_dqn_only_format_still_loads_and_resumes(tmp_path):
    """The format before the algorithm seam (apexrl-dqn-v1): the online network is the acting weights, the
    learner resumes from it."""
    first, _, _ = learner(config(tmp_path))
    first.train_step(make_batch(range(8)))
    state = first.learning.state_dict()
    torch.save(
        {
            "format": "apexrl-dqn-v1",
            "env_id": "CartPole-v1",
            "obs_dim": 4,
            "num_actions": 2,
            "hidden_sizes": [16],
            "online": state["online"],
            "target": state["target"],
            "optimizer": state["optimizer"],
            "updates": 1,
            "weight_version": 0,
            "network": "mlp",
        },
        tmp_path / "checkpoints" / CHECKPOINT_NAME if (tmp_path / "checkpoints").mkdir() is None else None,
    )
    loaded = load_checkpoint(tmp_path)
    assert (loaded.algorithm, loaded.spaces, loaded.updates) == ("dqn", EnvSpaces.vector(4, 2), 1)
    np.testing.assert_array_equal(loaded.acting_weights["value.bias"], state["online"]["value.bias"].numpy())
    second, _, _ = learner(config(tmp_path))
    assert second.updates == 1 and same(params(second.learning.online), params(first.learning.online))


def test_without_a_run_directory_nothing_is_resumed_or_saved(tmp_path):
    lrn, _, _ = learner(config())
    assert lrn.config.checkpoint_dir is None and lrn.updates == 0


def test_a_policy_file_holds_its_weights_in_numpy_format_and_refuses_pickles(tmp_path):
    path = save_kept_policy(tmp_path / KEPT_POLICY_NAME, 3)
    with np.load(path, allow_pickle=False) as npz:  # any .npz reader reads the weights
        assert {n for n in npz.files if n.startswith("weights/")} == {
            "weights/" + n for n in checkpoint().acting_weights
        }
    for name, array in checkpoint().acting_weights.items():
        np.testing.assert_array_equal(load_checkpoint(path).acting_weights[name], array)
    evil = tmp_path / "evil.npz"
    np.savez(evil, meta=np.array([{"format": "apexrl-policy-v1"}], dtype=object))
    with pytest.raises(ValueError, match="is not an apexrl policy file"):
        load_checkpoint(evil)
    np.savez(tmp_path / "other.npz", meta=np.array(json.dumps({"format": "someone-else-v1"})))
    with pytest.raises(ValueError, match="format 'someone-else-v1'"):
        load_checkpoint(tmp_path / "other.npz")
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[:-40])  # a truncated file
    with pytest.raises(ValueError, match="is not an apexrl policy file"):
        load_checkpoint(tmp_path / "cut.npz")

"""The evaluator's kept policy (actor/kept_policy.py): the weights of the round that solved the run (confirmed by a
second round of the same weights), else of its best round; written before the record that names them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from apexrl.actor.kept_policy import KeptPolicy, KeptRecord


class Saved:
    """The `save` callback: which weights were written, in order (checks the record is written after them)."""

    def __init__(self, record_path) -> None:
        self.versions: list[int] = []
        self.record_path = record_path

    def __call__(self, weights, record: KeptRecord) -> None:
        assert int(weights["w"][0]) == record.weight_version  # the weights of the round, not newer ones
        before = KeptRecord.read(self.record_path)
        assert (
            before is None or before.weight_version != record.weight_version or before.round != record.round
        )
        self.versions.append(record.weight_version)


def kept(tmp_path, target=475.0, confirm=True) -> tuple[KeptPolicy, Saved]:
    path = tmp_path / "checkpoints" / "best.npz"
    saved = Saved(path.with_suffix(".json"))
    return KeptPolicy(path, target, saved, confirm=confirm), saved


class Rounds:
    """Plays rounds of 100 episodes into a KeptPolicy, as the evaluator does."""

    def __init__(self, policy: KeptPolicy) -> None:
        self.policy = policy
        self.recent: list[float] = []
        self.number = 0

    def play(self, version: int, mean: float, episodes: int = 100):
        self.number += 1
        returns = [mean] * episodes
        self.recent += returns
        return self.policy.offer(self.number, version, {"w": np.array([version])}, returns, self.recent)


def test_the_best_round_is_kept_until_the_target_is_reached(tmp_path):
    policy, saved = kept(tmp_path)
    rounds = Rounds(policy)
    rounds.play(2, 20.0)
    rounds.play(3, 150.0)
    rounds.play(4, 90.0)  # worse: not kept
    assert saved.versions == [2, 3]
    record = json.loads(policy.record_path.read_text())
    assert (record["weight_version"], record["round"], record["mean_return"], record["solved"]) == (
        3,
        2,
        150.0,
        False,
    )


def test_a_round_that_reaches_the_target_is_confirmed_by_a_second_round_of_the_same_weights(tmp_path):
    policy, saved = kept(tmp_path)
    rounds = Rounds(policy)
    rounds.play(5, 480.0)
    assert policy.confirming == 5 and not policy.solved  # the evaluator replays v5 next
    record = rounds.play(5, 490.0)
    assert record is not None and record.solved and record.weight_version == 5 and record.round == 2
    assert record.mean_return_100 == pytest.approx(490.0)
    assert policy.solved and policy.confirming is None
    rounds.play(6, 500.0)  # nothing after the solving round replaces it
    assert saved.versions == [5, 5]
    assert KeptRecord.read(policy.record_path).weight_version == 5


def test_a_candidate_that_fails_its_confirmation_does_not_solve(tmp_path):
    policy, saved = kept(tmp_path)
    rounds = Rounds(policy)
    rounds.play(5, 480.0)
    rounds.play(5, 300.0)  # luck: the same weights from other start states fall short
    assert not policy.solved and policy.confirming is None
    assert KeptRecord.read(policy.record_path).weight_version == 5  # still the best round so far
    rounds.play(7, 478.0)
    record = rounds.play(7, 481.0)
    assert record.solved and record.weight_version == 7


def test_without_confirmation_the_first_round_that_reaches_the_target_solves(tmp_path):
    policy, _ = kept(tmp_path, confirm=False)
    record = Rounds(policy).play(9, 476.0)
    assert record.solved and policy.solved and policy.confirming is None


def test_the_target_is_checked_on_the_last_100_episodes_across_small_rounds(tmp_path):
    policy, _ = kept(tmp_path, target=10.0)
    rounds = Rounds(policy)
    for version in range(2, 11):  # nine rounds of 10 episodes: 90 < 100, never solved
        rounds.play(version, 20.0, episodes=10)
    assert policy.confirming is None and not policy.solved
    rounds.play(11, 20.0, episodes=10)
    assert policy.confirming == 11
    assert rounds.play(11, 20.0, episodes=10).solved


def test_without_a_target_the_best_round_is_kept_and_nothing_solves(tmp_path):
    policy, saved = kept(tmp_path, target=None)
    rounds = Rounds(policy)
    for version, mean in ((2, 5.0), (3, 50.0), (4, 40.0), (5, 60.0)):
        rounds.play(version, mean)
    assert saved.versions == [2, 3, 5] and not policy.solved


def test_a_record_of_an_earlier_launch_sets_the_bar(tmp_path):
    first, _ = kept(tmp_path)
    Rounds(first).play(40, 300.0)
    resumed, saved = kept(tmp_path)  # a resume: a new evaluator, the same run directory
    rounds = Rounds(resumed)
    rounds.play(41, 250.0)
    assert saved.versions == []
    rounds.play(42, 310.0)
    assert saved.versions == [42]


def test_an_unreadable_record_is_no_record(tmp_path):
    path = tmp_path / "best.json"
    path.write_text("{not json")
    assert KeptRecord.read(path) is None
    assert KeptRecord.read(tmp_path / "missing.json") is None

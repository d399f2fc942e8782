"""The acting state of the seam (algorithms/base.py): DQN and DPG step through the Stateless adapter, which acts
exactly as their explorers and greedy policies do, with the state None throughout."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.algorithms.base import Stateless
from apexrl.algorithms.registry import get


class Doubling:
    """A policy whose greedy action is twice the observation's first entry."""

    def greedy(self, obs):
        return (2 * obs[:, 0]).astype(np.int64)


class PlusOne:
    name, scale = "epsilon", 0.0

    def actions(self, policy, obs):
        return policy.greedy(obs) + 1


def test_the_stateless_adapter_acts_as_the_explorer_and_the_greedy_policy_with_no_state():
    obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    stepping = Stateless(PlusOne())
    state = stepping.initial_state(3)
    assert state is None
    actions, state = stepping.act(Doubling(), obs, state)
    np.testing.assert_array_equal(actions, [1, 5, 9])
    greedy, state = stepping.greedy(Doubling(), obs, state)
    np.testing.assert_array_equal(greedy, [0, 4, 8])
    assert state is None and stepping.reset(state, np.array([True, False, True])) is None
    with pytest.raises(TypeError, match="greedily only"):
        Stateless().act(Doubling(), obs, None)


@pytest.mark.parametrize("name", ["dqn", "dpg"])
def test_each_feed_forward_algorithm_steps_through_the_stateless_adapter(name):
    acting = get(name).acting()
    assert isinstance(acting.make_stateful(PlusOne()), Stateless)
    assert acting.make_stateful().explorer is None

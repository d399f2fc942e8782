"""Ape-X DPG learns (algorithms/dpg/learning.py with its losses and networks, the update the learner runs): on a
two-state task small enough to solve in a few hundred updates on the CPU, the greedy policy finds the best action
and the critic the discounted return. The hand-computed checks of test_dpg_losses.py do not show this: a policy loss
of the wrong sign, or a target bootstrapping with the wrong sign, passes them and the continuous fleet test.

The task, fed as replay batches of uniformly random actions (off-policy, as the actors' exploration gives them):
    state A --any action, reward 0, discount 0.5--> state B --action a, reward 1 - (a - 0.5)^2, episode ends--
with actions in [-1, 1], so pi(B) = 0.5, Q(B, a) = 1 - (a - 0.5)^2 and Q(A, a) = 0.5 * max Q(B, .) = 0.5 for
every a. One torch thread, as the learner runs by default (torch_threads): a few seconds on a busy CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.algorithms.dpg.learning import DPGLearning
from apexrl.algorithms.registry import get, with_defaults
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.config import LearnerConfig

SPACES = EnvSpaces.box((2,), (-1.0,), (1.0,))
STATE_A, STATE_B = [1.0, 0.0], [0.0, 1.0]
BEST = 0.5  # the best action in B; a fresh policy acts near 0
DISCOUNT = 0.5
ROWS, UPDATES = 64, 1000


def reward_b(action: np.ndarray) -> np.ndarray:
    return 1.0 - (action - BEST) ** 2


def replay_batch(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """ROWS transitions, half from A and half from B, with actions uniform over the bounds."""
    half = ROWS // 2
    action = rng.uniform(-1.0, 1.0, (ROWS, 1))
    in_b = np.arange(ROWS) >= half
    columns = {
        "obs": np.array([STATE_A] * half + [STATE_B] * half),
        "action": action,
        "reward": np.where(in_b, reward_b(action[:, 0]), 0.0),
        "discount": np.where(in_b, 0.0, DISCOUNT),
        "next_obs": np.array([STATE_B] * ROWS),  # B's successor never counts: its discount is 0
    }
    return {name: torch.as_tensor(value, dtype=torch.float32) for name, value in columns.items()}


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (more, on two busy cores, made these small updates 30 times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_dpg_finds_the_best_action_and_the_critic_the_discounted_return(one_thread):
    torch.manual_seed(0)
    config = LearnerConfig(
        replay=("fake:1",),
        env="Fake-v0",
        algorithm="dpg",
        hidden_sizes=(64,),
        device="cpu",
        learning_rate=3e-3,
        policy_learning_rate=1e-3,
        target_tau=0.05,  # TD3's other options (twin critics, policy delay 2) stay on
        target_noise=0.0,  # smoothing would lower the bootstrapped value below 0.5 and blur the check
    )
    learning = DPGLearning(with_defaults(config, get("dpg"), "learner"), SPACES, torch.device("cpu"))
    rng = np.random.default_rng(0)
    obs = torch.tensor([STATE_A, STATE_B])
    start = learning.policy(obs)[1, 0].item()
    assert abs(start - BEST) > 0.3, f"the fresh policy already acts {start:.2f} in B: nothing to learn"
    for step in range(1, UPDATES + 1):
        learning.update(replay_batch(rng), torch.ones(ROWS), step)

    with torch.no_grad():
        action = learning.policy(obs)
        q_policy = learning.critics[0](obs, action)
        probes = torch.tensor([[-1.0], [0.0], [BEST], [1.0]])
        q_b = learning.critics[0](torch.tensor([STATE_B] * 4), probes)
    assert abs(action[1, 0].item() - BEST) < 0.15, (
        f"the policy acts {action[1, 0].item():.3f} in B (it started at {start:.3f}); the best action is {BEST}"
    )
    np.testing.assert_allclose(
        q_b.numpy(),
        reward_b(probes[:, 0].numpy()),
        atol=0.15,
        err_msg="the critic does not give B's rewards",
    )
    assert abs(q_policy[1].item() - 1.0) < 0.05, (
        f"Q(B, pi(B)) is {q_policy[1].item():.3f}, not the best reward 1"
    )
    assert abs(q_policy[0].item() - DISCOUNT) < 0.05, (
        f"Q(A, pi(A)) is {q_policy[0].item():.3f}, not the discounted best return of B {DISCOUNT}"
    )

"""The evaluator's rest between rounds (actor/apex_actor.py `evaluation_rest`): rounds start at most every
evaluation_round_seconds, and slow rounds are followed by a rest that keeps them within evaluation_cpu_share."""

from __future__ import annotations

import pytest

from apexrl.actor.apex_actor import evaluation_rest
from apexrl.actor.config import ActorConfig


@pytest.mark.parametrize(
    ("took", "round_seconds", "share", "rest"),
    [
        (0.2, 2.0, 0.25, 1.8),  # a fast round (vectorised CartPole): wait until the next round is due
        (4.0, 2.0, 0.25, 12.0),  # a slow round (Atari): rest 3x as long, so rounds take a quarter of a core
        (4.0, 2.0, 0.5, 4.0),
        (4.0, 2.0, 1.0, 0.0),  # share 1: no rest beyond the period, which a 4 s round has used up
        (4.0, 0.0, 0.25, 0.0),  # round_seconds 0: back to back
    ],
)
def test_the_rest_keeps_rounds_within_their_period_and_their_cpu_share(took, round_seconds, share, rest):
    assert evaluation_rest(took, round_seconds, share) == pytest.approx(rest)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_cpu_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="evaluation_cpu_share"):
        ActorConfig(params="127.0.0.1:1", evaluate=True, evaluation_cpu_share=share)

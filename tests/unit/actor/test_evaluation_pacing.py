"""The evaluator's rest between rounds (actor/evaluation_pacing.py): rounds start at most every
evaluation_round_seconds; slow rounds are followed by a rest that keeps them within evaluation_cpu_share, once the
burst allowance (evaluation_burst_seconds) is spent, so a run's first slow rounds are not followed by long rests."""

from __future__ import annotations

import pytest

from apexrl.actor.config import ActorConfig
from apexrl.actor.evaluation_pacing import EvaluationPacer


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
def test_without_a_burst_the_rest_keeps_each_round_within_its_period_and_cpu_share(
    took, round_seconds, share, rest
):
    assert EvaluationPacer(round_seconds, share, burst_seconds=0).rest(100.0, 100.0 + took) == pytest.approx(
        rest
    )


def test_the_first_slow_rounds_of_a_run_rest_no_longer_than_the_period_until_the_burst_is_spent():
    """Acrobot's first rounds (barely trained: 500-step episodes) took ~16 s each on 2 cores; at a quarter of a core
    each was followed by 48 s of rest, hiding the run's progress. With a 60 s burst (each 16 s round spends 12 s of
    it: 4 s accrue while it plays), five such rounds follow each other at once; the sixth has spent the burst and
    rests until the share is kept again."""
    pacer = EvaluationPacer(2.0, 0.25, burst_seconds=60.0)
    now, rests = 0.0, []
    for _ in range(6):
        rest = pacer.rest(now, now + 16.0)
        rests.append(rest)
        now += 16.0 + rest
    assert rests[:5] == [0.0] * 5
    assert rests[5] == pytest.approx(48.0)
    assert 60.0 + 0.25 * now + 1e-9 >= 6 * 16.0  # beyond the burst, a quarter of the time


def test_over_a_long_run_the_evaluator_keeps_its_cpu_share_whatever_its_burst():
    pacer = EvaluationPacer(2.0, 0.25, burst_seconds=60.0)
    now = played = 0.0
    for _ in range(200):  # Atari-like rounds of 30 s
        rest = pacer.rest(now, now + 30.0)
        played += 30.0
        now += 30.0 + rest
    assert played / now == pytest.approx(0.25, abs=0.02)


def test_credit_accrues_while_resting_but_never_beyond_the_burst():
    pacer = EvaluationPacer(2.0, 0.25, burst_seconds=10.0)
    pacer.rest(0.0, 8.0)  # spends 6 of the 10 s (8 s of play, 2 s of it accrued back)
    assert pacer.credit == pytest.approx(4.0)
    pacer.rest(1000.0, 1000.5)  # a long idle time refills it to the burst, no further
    assert pacer.credit == pytest.approx(10.0 - 0.75 * 0.5)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_cpu_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="evaluation_cpu_share"):
        ActorConfig(params="127.0.0.1:1", evaluate=True, evaluation_cpu_share=share)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("evaluation_burst_seconds", -1.0),
        ("evaluation_burst_seconds", float("nan")),
        ("min_weight_version", 0),
    ],
)
def test_bad_pacing_settings_are_refused(setting, value):
    with pytest.raises(ValueError, match=setting):
        ActorConfig(params="127.0.0.1:1", evaluate=True, **{setting: value})

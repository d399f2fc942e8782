"""Tests allowed more than the default time budget (tests/support/time_budget.py: 120 s for setup, call and
teardown together), each with its budget and why it needs it. Keep this list short: a test that needs more time is
usually one that repeats what another already pays for."""

from tests.support.time_budget import LongerBudget

LONGER_BUDGETS: tuple[LongerBudget, ...] = (
    LongerBudget(
        "tests/integration/containers/",
        900,
        "the first container test pays the session's image build (scripts/build_images.sh): about 4 minutes on a "
        "machine that has none of its layers, twice that under load; seconds when only the source changed",
    ),
    LongerBudget(
        "tests/integration/deploy/test_image_recipe.py",
        400,
        "each target is installed into a fresh prefix once per module (the train one unpacks torch: about a "
        "minute idle), paid by the module's first test of it",
    ),
    LongerBudget(
        "tests/e2e/test_local_fleet.py",
        300,
        "trains CartPole-v1 to its own target, 475 (27-44 s idle on 2 cores over seeds 0-6, up to ~3x under load), "
        "then plays the kept policy for 100 fresh episodes of up to 500 steps: the issue-28 check that the policy "
        "kept is the one that solved",
    ),
    LongerBudget(
        "tests/integration/launcher/test_r2d2_launch.py",
        240,
        "R2D2's whole user path in one run directory: a 40 s launch, 3 evaluated episodes recorded as videos, "
        "load_policy, then a 12 s resume through the Python API (~90 s under a helper's load; two launches' "
        "start-ups are the reason)",
    ),
)

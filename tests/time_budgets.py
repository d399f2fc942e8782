"""Tests allowed more than the default time budget (tests/support/time_budget.py: 120 s for setup, call and
teardown together), each with its budget and why it needs it. Keep this list short: a test that needs more time is
usually one that repeats what another already pays for."""

from tests.support.time_budget import LongerBudget

LONGER_BUDGETS: tuple[LongerBudget, ...] = ()

"""Time budgets (a pytest plugin, enabled in tests/conftest.py): every test's time (setup, call and teardown) is
measured; a test over its budget fails at its teardown, naming the budget; the end of the run prints the total time
and the slowest tests.

Why: the suite is the team's main instrument and it grows with every feature. A test that creeps past two minutes
(a fleet launched again, a generous poll, a sleep) is found when it happens, not when CI passes 45 minutes.
The default budget is `DEFAULT_BUDGET_SECONDS`; a test that needs more is listed in tests/time_budgets.py with its
own budget and the reason. Budgets are several times a test's idle time: a loaded machine makes tests slower, and
a budget must not turn that into a failure.
"""

from __future__ import annotations

import os
import re
import runpy
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

DEFAULT_BUDGET_SECONDS = 120.0
LIST = "tests/time_budgets.py"
LOG_VARIABLE = (
    "APEXRL_TEST_TIMES"  # a file that each test's time is appended to as it ends (a run's live record)
)
SLOWEST_SHOWN = 15
_TIMES = pytest.StashKey[dict]()  # node id -> seconds so far (setup + call + teardown), where the test runs
_REPORTED = pytest.StashKey[
    dict
]()  # the same from the reports, where the summary is written (xdist's controller)
_BUDGETS = pytest.StashKey[tuple]()
_STARTED = pytest.StashKey[float]()


@dataclass(frozen=True)
class LongerBudget:
    """A test (`path::test`, any parametrization of it, a whole module `path` or a folder `path/`) allowed more
    than the default budget: its own budget in seconds and why it needs it."""

    test: str
    seconds: float
    why: str

    def covers(self, nodeid: str) -> bool:
        if self.test.endswith("/"):
            return nodeid.startswith(self.test)
        return nodeid == self.test or nodeid.startswith((self.test + "[", self.test + "::"))


def budget_of(nodeid: str, budgets: tuple[LongerBudget, ...]) -> float:
    """The budget of a test: its entry's (the longest matching one), else the default."""
    listed = [entry.seconds for entry in budgets if entry.covers(nodeid)]
    return max(listed) if listed else DEFAULT_BUDGET_SECONDS


def pytest_configure(config: pytest.Config) -> None:
    path = Path(config.rootpath, LIST)
    config.stash[_BUDGETS] = tuple(runpy.run_path(str(path))["LONGER_BUDGETS"]) if path.exists() else ()
    config.stash[_TIMES] = {}
    config.stash[_REPORTED] = {}
    config.pluginmanager.register(_Reports(config.stash[_REPORTED]), "apexrl-time-reports")
    config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    times = item.config.stash[_TIMES]
    times[item.nodeid] = times.get(item.nodeid, 0.0) + call.duration
    if call.when != "teardown":
        return
    if log := os.environ.get(LOG_VARIABLE):
        with open(log, "a") as out:
            out.write(f"{times[item.nodeid]:.2f} {item.nodeid}\n")
    budget = budget_of(item.nodeid, item.config.stash[_BUDGETS])
    if times[item.nodeid] > budget and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {times[item.nodeid]:.1f} s (setup, call and teardown), over its budget of "
            f"{budget:.0f} s: make it faster, or list it in {LIST} with the budget it needs and why"
        )


class _Reports:
    """Adds up each test's phases from its reports, in the process that writes the summary (under xdist, the
    controller, which sees the workers' reports)."""

    def __init__(self, times: dict[str, float]) -> None:
        self._times = times

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._times[report.nodeid] = self._times.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    times: dict[str, float] = config.stash[_REPORTED]
    if not times:
        return
    total = time.monotonic() - config.stash[_STARTED]
    write = terminalreporter.write_line
    terminalreporter.section("time")
    write(f"{len(times)} tests in {total:.0f} s ({total / 60:.1f} min) of wall time; the slowest:")
    budgets = config.stash[_BUDGETS]
    for nodeid, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
        write(f"  {seconds:7.1f} s  (budget {budget_of(nodeid, budgets):4.0f} s)  {nodeid}")
    stated = readme_figures(Path(config.rootpath, "README.md"))
    if stated is not None and len(times) >= stated[0] * 0.9:  # a whole run: the README's figures should hold
        tests, minutes = stated
        if abs(len(times) - tests) > tests * 0.05 or total / 60 > minutes * 1.25:
            write(
                f"README.md says {tests:,} tests in {minutes} minutes; this run: {len(times):,} in "
                f"{total / 60:.1f}: measure again and update it",
                yellow=True,
            )


def readme_figures(readme: Path) -> tuple[int, float] | None:
    """(tests, minutes) as README.md states them ("The test suite (1,562 tests ... in **13.9 minutes**")."""
    try:
        text = readme.read_text()
    except OSError:
        return None
    match = re.search(r"The test suite \(([\d,]+) tests.*?\*\*([\d.]+) minutes\*\*", text, re.S)
    return (int(match.group(1).replace(",", "")), float(match.group(2))) if match else None

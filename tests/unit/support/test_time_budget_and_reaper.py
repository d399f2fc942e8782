"""tests/support/time_budget.py and tests/support/reaper.py, run by pytest's own pytester on small suites: a test
over its budget fails at teardown naming the budget and the list, a listed budget holds, the end of the run names
the total and the slowest tests; a process a test started in a session of its own and left running is stopped
when the test ends, and named."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from tests.support.reaper import MARKER, marked_processes
from tests.support.time_budget import DEFAULT_BUDGET_SECONDS, LongerBudget, budget_of, readme_figures

pytest_plugins = ("pytester",)
REPO = Path(__file__).resolve().parents[3]

BUDGETS = """
from tests.support.reaper import MARKER, marked_processes
from tests.support.time_budget import LongerBudget

LONGER_BUDGETS = (
    LongerBudget("test_suite.py::test_over", 0.05, "a budget the test cannot meet"),
    LongerBudget("test_suite.py::test_within", 1000.0, "room to spare"),
)
"""

SUITE = """
import time

def test_over():
    time.sleep(0.3)

def test_within():
    time.sleep(0.3)
"""


def test_budget_of_takes_the_listed_budget_else_the_default():
    budgets = (
        LongerBudget("tests/a.py::test_x", 300, "why"),
        LongerBudget("tests/b.py", 200, "why"),
        LongerBudget("tests/c/", 500, "why"),
    )
    assert budget_of("tests/a.py::test_x", budgets) == 300
    assert budget_of("tests/a.py::test_x[1-2]", budgets) == 300
    assert budget_of("tests/b.py::test_y", budgets) == 200
    assert budget_of("tests/c/test_z.py::test_z", budgets) == 500
    assert budget_of("tests/a.py::test_xy", budgets) == DEFAULT_BUDGET_SECONDS
    assert budget_of("tests/cd/test_z.py::test_z", budgets) == DEFAULT_BUDGET_SECONDS


def test_a_test_over_its_budget_fails_and_the_slowest_are_named(pytester, monkeypatch):
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "time_budgets.py").write_text(BUDGETS)
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "tests.support.time_budget", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    out = result.stdout.str()
    assert re.search(r"test_over took 0\.\d s .*over its budget of 0 s.*tests/time_budgets\.py", out), out
    assert re.search(r"2 tests in \d+ s .* the slowest:", out), out
    assert re.search(r"0\.\d s +\(budget +1000 s\) +test_suite\.py::test_within", out), out


LEAKS = """
import os, subprocess

def test_leaks():
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(os.environ["LEAKED_PID_FILE"], "w") as f:
        f.write(str(process.pid))

def test_after():
    pass
"""


def test_a_process_a_test_left_running_in_its_own_session_is_stopped_and_named(pytester, monkeypatch):
    pytester.makepyfile(test_leaks=LEAKS)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("LEAKED_PID_FILE", str(pytester.path / "leaked.pid"))
    result = pytester.runpytest_subprocess("-p", "tests.support.reaper", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    pid = int((pytester.path / "leaked.pid").read_text())
    out = result.stdout.str()
    assert re.search(rf"test_leaks\.py::test_leaks: {pid}: sleep 600", out), out
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    os.kill(pid, signal.SIGKILL)  # do not leave it running if the reaper failed
    assert state == "Z", f"the leaked process {pid} still runs ({state})"


def test_the_readme_states_the_suites_figures_where_the_run_checks_them(tmp_path):
    """The end of a whole run compares its count and time with the README's (time_budget.readme_figures): the
    README must state them in the form it reads."""
    tests, minutes = readme_figures(REPO / "README.md")
    assert tests > 1000 and 0 < minutes <= 15
    (tmp_path / "README.md").write_text(
        "The test suite (1,234 tests: all of them) ran in **9.5 minutes** of pytest"
    )
    assert readme_figures(tmp_path / "README.md") == (1234, 9.5)
    assert readme_figures(tmp_path / "missing.md") is None


def test_a_child_is_found_as_soon_as_popen_returns():
    """A child that is still exec'ing shows an empty environment for a moment after Popen returns (8 in 2,000 here,
    idle); the scan waits that moment out instead of missing it, which once named a leak by the wrong test."""
    marker = f"{MARKER}=found-{os.getpid()}".encode()
    environment = {**os.environ, MARKER: marker.decode().split("=", 1)[1]}
    missed = []
    for _ in range(1000):
        child = subprocess.Popen(["sleep", "60"], env=environment, start_new_session=True)
        try:
            if child.pid not in marked_processes(marker):
                missed.append(child.pid)
        finally:
            child.kill()
            child.wait()
    assert not missed, f"{len(missed)} of 1000 children not found right after Popen"

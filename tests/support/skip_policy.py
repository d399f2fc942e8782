"""The skip policy (a pytest plugin, enabled in tests/conftest.py): on CI (environment CI=true), a test that skips
fails the run, unless tests/allowed_skips.py lists it with the reason it skips for and why that is acceptable.

Why: tests skip where a tool is missing (kubectl, promtool, root, ...), and a skip reads as a pass. A CI machine
that lost a tool would go on "passing" the tests that need it. scripts/setup.sh installs what the tests need, so
on CI a skip is either on the list, with its reason, or a failure that names the test and how to list it. Outside
CI (a developer's machine) skips stay skips.

A listed test must skip for the listed reason (the entry's `reason` is found in the skip's message): the same test
skipping for another reason still fails. An entry names a test id (`path::test`, any parametrization of it), or a
module or class (`path`, `path::Class`) for skips at collection. A module skipped as a whole on CI and not listed
is named at the end of the run, which then exits 1.
"""

from __future__ import annotations

import os
import re
import runpy
from dataclasses import dataclass
from pathlib import Path

import pytest

LIST = "tests/allowed_skips.py"  # the default `allowed_skips` ini value, relative to the rootdir
_ON_CI = pytest.StashKey[bool]()
_ALLOWED = pytest.StashKey[tuple]()
_UNLISTED = pytest.StashKey[list]()  # (node id, reason) of skips this run fails for
_SEEN = pytest.StashKey[list]()  # (node id, entry) of the skips the list allowed


@dataclass(frozen=True)
class AllowedSkip:
    """A test allowed to skip on CI: its id (or its module's or class's), text its skip reason contains, and why
    the skip is acceptable there (what CI cannot provide, and where the test does run)."""

    test: str
    reason: str
    why: str

    def __post_init__(self) -> None:
        for name in ("test", "reason", "why"):
            if not getattr(self, name).strip():
                raise ValueError(f"AllowedSkip({self.test!r}): {name} must not be empty")

    def allows(self, nodeid: str, reason: str) -> bool:
        return (
            self.test in (nodeid, _unparametrized(nodeid)) or nodeid.startswith(self.test + "::")
        ) and self.reason in reason


def _unparametrized(nodeid: str) -> str:
    """The id every parametrization of a test shares: `path::test[a-1]` -> `path::test`."""
    return re.sub(r"\[.*\]$", "", nodeid)


def on_ci(environ: os._Environ | dict = os.environ) -> bool:
    return environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def load(path: Path) -> tuple[AllowedSkip, ...]:
    """ALLOWED_SKIPS of the list file at `path`."""
    entries = tuple(runpy.run_path(str(path))["ALLOWED_SKIPS"])
    for entry in entries:
        if not isinstance(entry, AllowedSkip):
            raise pytest.UsageError(f"{path}: {entry!r} is not an AllowedSkip")
    return entries


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _advice(nodeid: str, reason: str, list_path: str) -> str:
    return (
        f"{nodeid} skipped on CI (CI=true): {reason}\n"
        f"On CI a skip fails the run: a CI machine has every tool the tests need (scripts/setup.sh installs "
        f"them). Install what is missing in scripts/setup.sh, or, if this test cannot run on a CI machine, "
        f"list it in {list_path}:\n"
        f'    AllowedSkip(test={_unparametrized(nodeid)!r}, reason={reason[:60]!r}, why="...")'
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "allowed_skips",
        "Python file (relative to the rootdir) whose ALLOWED_SKIPS lists the tests that may skip on CI",
        default=LIST,
    )


def pytest_configure(config: pytest.Config) -> None:
    path = Path(config.rootpath) / config.getini("allowed_skips")
    config.stash[_ALLOWED] = load(path) if path.exists() else ()
    config.stash[_ON_CI] = on_ci()
    config.stash[_UNLISTED], config.stash[_SEEN] = [], []
    config.pluginmanager.register(_Collections(config), "apexrl-skip-collections")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_ControllerReports(config), "apexrl-skip-reports")


def _judge(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """None when `report` is no skip, or an allowed one; else the failure message."""
    if not (report.skipped and config.stash[_ON_CI]) or hasattr(report, "wasxfail"):
        return None
    reason = skip_reason(report)
    entry = next((e for e in config.stash[_ALLOWED] if e.allows(report.nodeid, reason)), None)
    if entry is not None:
        config.stash[_SEEN].append((report.nodeid, entry))
        return None
    config.stash[_UNLISTED].append((report.nodeid, reason))
    return _advice(report.nodeid, reason, config.getini("allowed_skips"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    message = _judge(item.config, report)
    if message is not None:
        report.outcome, report.longrepr = "failed", message


class _Collections:
    """A whole module skipped: failed at the session's end. Judged where skipped collections are reported: in
    this process, or under xdist in the controller too."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        _judge(self._config, report)


class _ControllerReports:
    """Under xdist: the tests' skips were judged where they ran; the controller lists the allowed ones."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        _judge(self._config, report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash[_UNLISTED] and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seen, unlisted = config.stash[_SEEN], config.stash[_UNLISTED]
    if seen:
        terminalreporter.section("skips allowed on CI")
        for nodeid, entry in seen:
            terminalreporter.line(f"{nodeid}: {entry.reason} ({entry.why})")
    if unlisted:
        terminalreporter.section("skips that fail this CI run", red=True)
        for nodeid, reason in unlisted:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line(
            f"Install what they need in scripts/setup.sh, or list them in "
            f"{config.getini('allowed_skips')} with their reason and why (AllowedSkip)."
        )

"""tests/support/skip_policy.py, run by pytest's own pytester on small suites: with CI=true a skip that the list
does not allow (another test, or the listed test for another reason) fails the run naming the test and how to
list it, a listed one stays a skip, xfail is no skip; without CI every skip stays a skip."""

from __future__ import annotations

import pytest

from tests.support.skip_policy import AllowedSkip

pytest_plugins = ("pytester",)

SUITE = """
import pytest

def test_passes():
    pass

def test_listed():
    pytest.skip("root reads any file")

def test_unlisted():
    pytest.skip("kubectl is not installed")

@pytest.mark.parametrize("n", [1, 2])
def test_listed_for_another_reason(n):
    pytest.skip("promtool is not installed")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""

MODULE_SKIPPED = """
import pytest

pytest.skip("threadpoolctl is not installed", allow_module_level=True)

def test_never_runs():
    pass
"""

LIST = """
from tests.support.skip_policy import AllowedSkip

ALLOWED_SKIPS = (
    AllowedSkip(test="test_suite.py::test_listed", reason="root reads any file", why="CI runs as root"),
    AllowedSkip(test="test_suite.py::test_listed_for_another_reason", reason="root", why="CI runs as root"),
{extra})
"""


@pytest.fixture
def suite(pytester: pytest.Pytester):
    def make(*, module_listed: bool = False) -> None:
        extra = (
            '    AllowedSkip(test="test_module.py", reason="threadpoolctl", why="not on CI machines"),\n'
            if module_listed
            else ""
        )
        pytester.makepyfile(test_suite=SUITE, test_module=MODULE_SKIPPED, allowed=LIST.format(extra=extra))
        pytester.makeini("[pytest]\nallowed_skips = allowed.py\n")

    return make


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "tests.support.skip_policy", "-p", "no:cacheprovider", *args)


def test_on_ci_a_skip_not_on_the_list_fails_naming_the_test_and_how_to_list_it(suite, pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    suite()
    result = run(pytester)
    result.assert_outcomes(passed=1, skipped=2, failed=3, xfailed=1)  # skipped: the listed test, the module
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*test_suite.py::test_unlisted skipped on CI (CI=true): kubectl is not installed",
            "*list it in allowed.py:",
            "*AllowedSkip(test='test_suite.py::test_unlisted', reason='kubectl is not installed', why=\"...\")",
            "*test_suite.py::test_listed_for_another_reason[[]1[]] skipped on CI (CI=true): promtool is not installed",
            "*skips allowed on CI*",
            "test_suite.py::test_listed: root reads any file (CI runs as root)",
            "*skips that fail this CI run*",
            "test_module.py: threadpoolctl is not installed",
            "test_suite.py::test_unlisted: kubectl is not installed",
            "test_suite.py::test_listed_for_another_reason[[]1[]]: promtool is not installed",
            "test_suite.py::test_listed_for_another_reason[[]2[]]: promtool is not installed",
            "Install what they need in scripts/setup.sh, or list them in allowed.py with their reason and why*",
        ]
    )


def test_on_ci_a_run_whose_only_skips_are_listed_passes(suite, pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    suite(module_listed=True)
    result = run(
        pytester,
        "--deselect",
        "test_suite.py::test_unlisted",
        "--deselect",
        "test_suite.py::test_listed_for_another_reason",
    )
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_off_ci_every_skip_stays_a_skip(suite, pytester, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    suite()
    result = run(pytester)
    result.assert_outcomes(passed=1, skipped=5, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_an_entry_needs_a_test_a_reason_and_why():
    with pytest.raises(ValueError, match="why must not be empty"):
        AllowedSkip(test="tests/x.py::test_y", reason="root", why=" ")
    entry = AllowedSkip(test="tests/x.py::test_y", reason="root reads", why="CI runs as root")
    assert entry.allows("tests/x.py::test_y[a-1]", "Skipped: root reads any file")
    assert not entry.allows("tests/x.py::test_y_other", "root reads any file")
    assert not entry.allows("tests/x.py::test_y", "kubectl is not installed")
    assert AllowedSkip(test="tests/x.py", reason="r", why="w").allows("tests/x.py::C::test_z", "r")


def test_the_projects_own_list_loads_and_names_existing_tests(pytestconfig):
    """Every entry of tests/allowed_skips.py names a test file that exists (a renamed test must not leave a stale
    entry behind that would allow a skip nobody looks at)."""
    from tests.support.skip_policy import LIST, load

    entries = load(pytestconfig.rootpath / LIST)
    assert entries
    for entry in entries:
        path = pytestconfig.rootpath / entry.test.split("::")[0]
        assert path.is_file(), entry
        function = entry.test.split("::")[-1]
        assert function == path.name or f"def {function}(" in path.read_text(), entry

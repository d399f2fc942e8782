"""Worker groups (a pytest plugin, enabled in tests/conftest.py) for runs on pytest-xdist workers (scripts/test.sh
runs the suite on two): each test module runs on one worker, so its module fixtures (a fleet, an install, a rendered
overlay) are paid once, and the container tests share one worker, where their session's images are built once and
no two of their pods run at once. Without xdist it does nothing.

It is xdist's own scope scheduler with our scopes (a module, or a group of modules in SHARED): xdist's
`--dist loadgroup` marks no longer group anything under pytest 9.2, whose node ids xdist cannot rename.

Why modules may run side by side: every test binds port 0 or runs in network namespaces of its own (named after
its process), writes under its own tmp_path, and finds its own processes by their exact command lines.
"""

from __future__ import annotations

import pytest

SHARED = {
    "tests/integration/containers/": "containers",  # one podman image build per run (a session fixture)
}


def group_of(nodeid: str) -> str:
    """The scope a test runs in: its module's path, or the shared group its folder belongs to."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED.items():
        if path.startswith(prefix):
            return group
    return path


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") not in ("load", "loadgroup", "loadscope", "loadfile"):
        return None  # another distribution asked for by name (each, worksteal): xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)

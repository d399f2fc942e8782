"""Worker groups (a pytest plugin, enabled in tests/conftest.py) for runs with pytest-xdist's `--dist loadgroup`
(scripts/test.sh runs the suite on two workers): each test module runs on one worker, so its module fixtures
(a fleet, an install, a rendered overlay) are paid once, and the container tests share one worker, where their
session's images are built once. Without xdist it does nothing.

Why modules may run side by side: every test binds port 0 or runs in network namespaces of its own (named after
its process), writes under its own tmp_path, and finds its own processes by their exact command lines.
"""

from __future__ import annotations

import pytest

SHARED = {
    "tests/integration/containers/": "containers",  # one podman image build per run (a session fixture)
}


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED.items():
        if path.startswith(prefix):
            return group
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item.nodeid)))

"""pytest fixtures over tests/support; a test module enables them with

pytest_plugins = ("tests.support.fixtures",)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.support.netns import NamespaceNetwork, NetnsError, netns_unavailable


@pytest.fixture
def netns_network() -> Iterator[Callable[..., NamespaceNetwork]]:
    """A factory of NamespaceNetworks, `make(["m1", "m2"], reach_from_host=False)`, each created at once and torn
    down after the test, however it ended (processes left inside are killed). Skips the test, saying why, where
    namespaces cannot be made (not root, no iproute2, no permission)."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    made: list[NamespaceNetwork] = []

    def make(names: Sequence[str], **options) -> NamespaceNetwork:
        network = NamespaceNetwork(names, **options)
        network.create()
        made.append(network)
        return network

    yield make
    problems = []
    for network in reversed(made):
        try:
            network.close()
        except NetnsError as err:
            problems.append(str(err))
    if problems:
        pytest.fail("namespace teardown: " + "; ".join(problems))

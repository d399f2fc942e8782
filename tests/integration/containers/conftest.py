"""Fixtures of the container tests: podman usable (or the tests skip, saying why; under CI=true they fail), the
images built once per session by scripts/build_images.sh, and every container, pod and volume a test made removed
after it (images stay cached: the next run reuses their layers)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.containers import engine

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


@pytest.fixture(scope="session")
def podman_ready() -> Iterator[None]:
    reason = engine.unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"container tests cannot run in CI: {reason}")
        pytest.skip(reason)
    stale = engine.remove_stale()
    if stale:
        print(f"\nremoved what earlier container test runs left: {', '.join(stale)}")
    yield
    engine.cleanup()


@pytest.fixture(scope="session")
def version() -> str:
    return tomllib.loads((engine.REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="session")
def images(podman_ready, version) -> engine.Images:
    built = engine.build_images(version)
    print(
        f"\nscripts/build_images.sh: {built.seconds:.0f} s\n"
        + "\n".join(
            line for line in built.log.splitlines() if line.startswith(("build_images:", "  apexrl-"))
        )
    )
    return built


@pytest.fixture(autouse=True)
def _remove_containers(request) -> Iterator[None]:
    """After each test: its containers, pods and volumes go (a failed test's too)."""
    yield
    if engine.unavailable() is None:
        engine.cleanup()

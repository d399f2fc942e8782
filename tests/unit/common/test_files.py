"""File permissions (common/files.py): atomic writes with a given mode, files opened for their owner alone."""

from __future__ import annotations

import os
import stat

import pytest

from apexrl.common.files import PRIVATE, atomic_write, open_private


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    def set_umask(value: int) -> None:
        os.umask(value)

    previous = os.umask(0o022)
    yield set_umask
    os.umask(previous)


def test_atomic_write_keeps_the_default_mode_unless_told(tmp_path, umask):
    umask(0o022)
    assert mode(atomic_write(tmp_path / "plain", "x")) == 0o644
    umask(0o000)  # a permissive umask does not widen a private file
    assert mode(atomic_write(tmp_path / "private", b"x", mode=PRIVATE)) == 0o600
    path = tmp_path / "was-public"
    path.write_text("old")
    path.chmod(0o666)
    atomic_write(path, "new", mode=PRIVATE)
    assert mode(path) == 0o600 and path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


@pytest.mark.parametrize("how", ["ab", "wb"])
def test_open_private_makes_new_and_existing_files_owner_only(tmp_path, umask, how):
    umask(0o000)
    with open_private(tmp_path / "new.log", how) as f:
        f.write(b"one\n")
    assert mode(tmp_path / "new.log") == 0o600
    existing = tmp_path / "existing.log"
    existing.write_bytes(b"before\n")
    existing.chmod(0o644)
    with open_private(existing, how) as f:
        f.write(b"after\n")
    assert mode(existing) == 0o600
    assert existing.read_bytes() == (b"before\nafter\n" if how == "ab" else b"after\n")

"""launcher/log_rotation.py: a role log past its cap is copied aside and emptied in place, older copies shifted,
and the role's next write (its descriptor opened with O_APPEND, as the launcher opens it) lands at the start."""

from __future__ import annotations

import os

from apexrl.launcher.log_rotation import rotate_if_large


def test_a_log_past_its_cap_is_rotated_in_place_and_the_writer_goes_on_at_its_start(tmp_path):
    path = tmp_path / "shard-0.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the role's stdout
    try:
        os.write(fd, b"a" * 100)
        assert not rotate_if_large(path, 100) and not (tmp_path / "shard-0.log.1").exists()
        for generation in (b"b", b"c", b"d"):
            os.write(fd, generation * 150)
            assert rotate_if_large(path, 100)
            assert path.stat().st_size == 0
        os.write(fd, b"live\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"live\n"  # O_APPEND: no hole where the old content was
    assert (tmp_path / "shard-0.log.1").read_bytes() == b"d" * 150
    assert (tmp_path / "shard-0.log.2").read_bytes() == b"c" * 150
    assert not (tmp_path / "shard-0.log.3").exists()  # two copies kept, the oldest dropped
    assert not rotate_if_large(tmp_path / "missing.log", 1)

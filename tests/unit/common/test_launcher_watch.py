"""A role started by `apexrl launch` stops when its launcher is gone (common/process.py stop_with_launcher): the
launcher's pid comes in APEXRL_LAUNCHER_PID, and a parent pid other than it means the launcher exited. The whole
path, a launcher killed with SIGKILL and its real roles shutting down, is in tests/integration/launcher/test_main.py.
"""

from __future__ import annotations

import logging
import os
import threading

from apexrl.common.process import LAUNCHER_PID_VARIABLE, stop_with_launcher
from tests.conftest import wait_until


def watched_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "apexrl-launcher-watch"]


def test_a_parent_other_than_the_launcher_stops_the_role_and_the_variable_is_not_passed_on(
    monkeypatch, caplog
):
    monkeypatch.setenv(LAUNCHER_PID_VARIABLE, str(os.getpid()))  # never this process's parent: "re-parented"
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="apexrl"):
        stop_with_launcher(stop, poll_seconds=0.01)
        wait_until(stop.is_set, "the watch sets the stop event", timeout=30)
    assert LAUNCHER_PID_VARIABLE not in os.environ  # children of the role do not watch a launcher
    assert f"the launcher (pid {os.getpid()}) is gone; shutting down" in caplog.text


def test_the_watch_ends_with_the_role_while_the_launcher_lives(monkeypatch):
    monkeypatch.setenv(LAUNCHER_PID_VARIABLE, str(os.getppid()))  # the real parent: the launcher is alive
    stop = threading.Event()
    stop_with_launcher(stop, poll_seconds=0.01)
    assert watched_threads()
    stop.set()  # the role stops for another reason: the watch thread ends with it
    wait_until(lambda: not watched_threads(), "the watch thread ends", timeout=30)


def test_no_variable_no_watch_and_a_bad_value_is_ignored_with_a_warning(monkeypatch, caplog):
    monkeypatch.delenv(LAUNCHER_PID_VARIABLE, raising=False)
    stop = threading.Event()
    stop_with_launcher(stop)
    assert not watched_threads()
    monkeypatch.setenv(LAUNCHER_PID_VARIABLE, "not-a-pid")
    with caplog.at_level(logging.WARNING, logger="apexrl"):
        stop_with_launcher(stop)
    assert not watched_threads() and not stop.is_set()
    assert "ignoring APEXRL_LAUNCHER_PID='not-a-pid': not a pid" in caplog.text

"""The reaper (a pytest plugin, enabled in tests/conftest.py): whatever a test started and left running is
stopped when the test ends, and whatever a module's fixtures started when the module ends, so an aborted or failed
test leaves nothing running (a launch's roles included: they run in sessions of their own and outlive a killed
launcher).

Every process the suite starts inherits `MARKER` in its environment; a process is found by it in
/proc/PID/environ, whichever session or parent it has now. After a test's teardown, marked processes that were not
running when its call began are stopped; after a module's last test, those not running when the module began; at
the end of the run, all. Each is sent SIGTERM with its process group (when the group is its own), then SIGKILL if
it is still there after a bound. What was stopped is named at the end of the run: a test that leaks is a bug.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

MARKER = "APEXRL_TEST_RUN"
_RUN = pytest.StashKey[bytes]()
_MODULE = pytest.StashKey[object]()  # the module whose tests run now
_AT_MODULE_START = pytest.StashKey[set]()
_AT_CALL_START = pytest.StashKey[set]()
_REAPED = pytest.StashKey[list]()
_STOP_BOUND_SECONDS = 5.0
_EXEC_WINDOW_SECONDS = 1.0
_PF_KTHREAD = 0x00200000  # include/linux/sched.h


def marked_processes(run: bytes) -> dict[int, str]:
    """pid -> command line of every live process (but this one) whose environment holds `run`'s marker."""
    found: dict[int, str] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if run not in _environment(int(name)):
                continue
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or a zombie
            continue
        if cmdline and not _own_helper(int(name), cmdline):
            found[int(name)] = cmdline.strip()
    return found


def _environment(pid: int) -> bytes:
    """/proc/PID/environ, read again for a moment while it is empty but the process lives in user space: a child
    that is exec'ing shows an empty environment (and command line) between the kernel releasing its parent from
    vfork/close-on-exec and setting up its new stack, so a test's Popen can return before its child is readable (8
    in 2,000 Popen calls here) and a scan at that moment would not see it."""
    path = Path(f"/proc/{pid}/environ")
    deadline = time.monotonic() + _EXEC_WINDOW_SECONDS
    while (
        not (environment := path.read_bytes()) and time.monotonic() < deadline and _exec_may_be_under_way(pid)
    ):
        time.sleep(0.005)
    return environment


def _exec_may_be_under_way(pid: int) -> bool:
    """False for a zombie and a kernel thread (their environment stays empty for good)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    state, parent, flags = fields[0], int(fields[1]), int(fields[6])
    return state not in "ZX" and not flags & _PF_KTHREAD and parent != 2


def _own_helper(pid: int, cmdline: str) -> bool:
    """multiprocessing's resource tracker or fork server of this process: started on first use, kept for the run,
    deaf to SIGTERM by design; stopping it would only make the next test start another."""
    if "from multiprocessing." not in cmdline:
        return False
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return False
    return parent == os.getpid()


def stop_processes(pids: dict[int, str], run: bytes) -> list[str]:
    """SIGTERM each process (its whole group when it leads one), SIGKILL what is left after a bound; return what
    was stopped."""
    own_group = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                group = os.getpgid(pid)
                if group == pid and group != own_group:
                    os.killpg(group, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + _STOP_BOUND_SECONDS
        while (left := set(pids) & set(marked_processes(run))) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not left:
            break
    return [f"{pid}: {cmdline[:160]}" for pid, cmdline in pids.items()]


def pytest_configure(config: pytest.Config) -> None:
    if not Path("/proc/self/environ").exists():
        return  # not Linux: nothing to look in
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # xdist's controller runs no test; each worker reaps its own (and the workers carry its marker)
    # A fresh marker even under another run (a nested pytest): its children are its own to stop, not the outer ones.
    run = os.environ[MARKER] = f"{os.getpid()}-{uuid.uuid4().hex}"
    config.stash[_RUN] = f"{MARKER}={run}".encode()
    config.stash[_MODULE] = None
    config.stash[_AT_MODULE_START] = set()
    config.stash[_AT_CALL_START] = set()
    config.stash[_REAPED] = []


def _reap(config: pytest.Config, spared: set[int], what: str) -> None:
    run = config.stash[_RUN]
    left = {pid: cmd for pid, cmd in marked_processes(run).items() if pid not in spared}
    if left:
        config.stash[_REAPED].extend(f"{what}: {line}" for line in stop_processes(left, run))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _RUN not in item.config.stash:
        return
    if item.config.stash[_MODULE] is not item.module:  # the module's first test
        item.config.stash[_MODULE] = item.module
        item.config.stash[_AT_MODULE_START] = set(marked_processes(item.config.stash[_RUN]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if _RUN in item.config.stash:
        item.config.stash[_AT_CALL_START] = set(marked_processes(item.config.stash[_RUN]))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Runs after the fixtures' own teardown (finalizers run in the default implementation, before this)."""
    if _RUN not in item.config.stash:
        return
    config = item.config
    if nextitem is None or nextitem.module is not item.module:
        _reap(config, config.stash[_AT_MODULE_START], f"module {item.module.__name__}")
    else:
        _reap(config, config.stash[_AT_CALL_START] | config.stash[_AT_MODULE_START], item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _RUN in session.config.stash:
        _reap(session.config, set(), "end of the run")


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    reaped = config.stash.get(_REAPED, [])
    if reaped:
        terminalreporter.section("processes left running by tests (stopped)")
        for line in reaped:
            terminalreporter.write_line(line)

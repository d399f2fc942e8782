"""One watched `apexrl launch`: when each role's process started and when each of its start-up milestones was seen,
in seconds from the launch; optionally, how long a role killed afterwards takes to be back.

Everything is observed from outside, the same way for any commit of apexrl (so two commits compare in one run):
- process started: the role's start time in /proc (clock ticks, 10 ms), against the launcher's own;
- milestones: the first line of the role's log that marks it (`MILESTONES`), stamped when it reaches the log file
  (the logs are polled every `POLL_SECONDS`; roles write them unbuffered), or the launcher's stderr line;
- first episode: the first row of the actors' episodes CSVs (the actor's own clock, to the millisecond).
Roles are told apart by their stdout: each writes RUN_DIR/logs/NAME.log. Only the standard library is imported,
so the watcher takes little of the CPU the launch is timed on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

POLL_SECONDS = 0.02
TICKS = os.sysconf("SC_CLK_TCK")
# role kind -> (milestone, text of the log line that marks it), in the order they happen. An actor's "acting"
# line is "first environment step" where the commit logs it, else "got weights" (after which it steps at once).
MILESTONES = {
    "replay": [("serving", "replay shard serving on")],
    "learner": [("serving", "INFO apexrl.learner: learner for ")],
    "actor": [("weights", " got weights version "), ("first step", ": first environment step")],
    "evaluator": [("weights", " got weights version ")],
}
# The milestone that makes a role ready, and the one a restarted role is timed to.
READY = {"replay": "serving", "learner": "serving", "actor": "first step", "evaluator": "weights"}
LAUNCHER_LINES = {  # the launcher's view (its stderr)
    "roles started": " INFO apexrl.launch: started ",
    "learner serving": " INFO apexrl.launch: learner serving ",
}


def kind_of(role: str) -> str:
    return "replay" if role.startswith("shard-") else role.split("-")[0]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (index 0: state, 1: ppid, 11/12: utime/stime, 19: start
    time in ticks since boot); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def role_processes(launcher: int) -> dict[str, int]:
    """Role name -> pid of the launcher's children, named by the log file their stdout goes to."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = proc_stat(int(entry))
        if stat is None or stat[1] != str(launcher):
            continue
        try:
            out = os.readlink(f"/proc/{entry}/fd/1")
        except OSError:
            continue
        if out.endswith(".log"):
            found[Path(out).stem] = int(entry)
    return found


@dataclass
class Watch:
    """The observations of one launch, in seconds from `t0` (time.time() when the launcher was started)."""

    t0: float
    started: dict[str, float] = field(default_factory=dict)  # role -> process start
    seen: dict[str, dict[str, list[float]]] = field(
        default_factory=dict
    )  # role -> milestone -> every sighting
    launcher: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds used when the launch was ready
    pids: dict[str, int] = field(default_factory=dict)

    def first(self, role: str, milestone: str) -> float | None:
        times = self.seen.get(role, {}).get(milestone)
        return times[0] if times else None

    def milestones(self) -> dict[str, dict[str, float | None]]:
        """role -> {"process": ..., each milestone of its kind: first sighting} (None: not seen)."""
        out: dict[str, dict[str, float | None]] = {}
        for role in sorted(self.started.keys() | self.seen.keys(), key=_role_order):
            kind = kind_of(role)
            row = {"process": self.started.get(role)}
            for name, _ in MILESTONES.get(kind, []):
                row[name] = self.first(role, name)
            if kind == "actor" and row.get("first step") is None:
                row["first step"] = row.get("weights")  # a commit that does not log it: it steps right after
            out[role] = row
        return out


def _role_order(role: str) -> tuple[int, int]:
    order = ["replay", "learner", "actor", "evaluator"]
    kind = kind_of(role)
    index = role.rsplit("-", 1)[1] if "-" in role else "0"
    return (order.index(kind) if kind in order else len(order), int(index) if index.isdigit() else 0)


class LogTail:
    """New complete lines of one file, each stamped with the time it was read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


class LaunchWatcher:
    """Starts `argv` (an `apexrl launch`), watches its run directory and stderr, stops it."""

    def __init__(self, argv: list[str], run_dir: Path, env: dict[str, str], cwd: str) -> None:
        self.run_dir = run_dir
        self.tails: dict[str, LogTail] = {}
        self.stderr_lines: list[tuple[float, str]] = []
        self.stdout_lines: list[str] = []
        self.watch = Watch(time.time())
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            text=True,
            start_new_session=True,
        )
        stat = proc_stat(self.proc.pid)
        self.launcher_ticks = int(stat[19]) if stat else None
        self._readers = [
            threading.Thread(target=self._drain, args=(self.proc.stderr, True), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stdout, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _drain(self, stream, stamped: bool) -> None:
        for line in stream:
            if stamped:
                self.stderr_lines.append((time.time() - self.watch.t0, line.rstrip("\n")))
            else:
                self.stdout_lines.append(line.rstrip("\n"))

    def poll(self) -> None:
        """One round: new log lines, new role processes, the launcher's lines."""
        now = time.time() - self.watch.t0
        logs = self.run_dir / "logs"
        if logs.is_dir():
            for path in logs.glob("*.log"):
                tail = self.tails.setdefault(path.stem, LogTail(path))
                for line in tail.read():
                    self._sighted(path.stem, line, now)
        if self.launcher_ticks is not None:
            for role, pid in role_processes(self.proc.pid).items():
                if self.watch.pids.get(role) != pid and (stat := proc_stat(pid)) is not None:
                    self.watch.pids[role] = pid
                    self.watch.started.setdefault(role, (int(stat[19]) - self.launcher_ticks) / TICKS)
        for at, line in list(self.stderr_lines):
            for name, text in LAUNCHER_LINES.items():
                if text in line:
                    self.watch.launcher.setdefault(name, at)

    def _sighted(self, role: str, line: str, now: float) -> None:
        for name, text in MILESTONES.get(kind_of(role), []):
            if text in line:
                self.watch.seen.setdefault(role, {}).setdefault(name, []).append(now)

    def ready(self) -> bool:
        """Every role the launcher started has reached its READY milestone."""
        if "roles started" not in self.watch.launcher:
            return False
        marks = self.watch.milestones()
        return bool(marks) and all(marks[role].get(READY[kind_of(role)]) is not None for role in marks)

    def complete(self) -> bool:
        """Every role has reached every milestone of its kind (an actor that acts before its first weights: both)."""
        marks = self.watch.milestones()
        return self.ready() and all(None not in marks[role].values() for role in marks)

    def wait(self, until, bound: float) -> bool:
        """Poll until `until()` holds (True) or `bound` seconds from the launch passed or the launcher ended."""
        while time.time() - self.watch.t0 < bound:
            self.poll()
            if until():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(POLL_SECONDS)
        return False

    def record_cpu(self) -> None:
        for role, pid in self.watch.pids.items():
            stat = proc_stat(pid)
            if stat is not None:
                self.watch.cpu[role] = (int(stat[11]) + int(stat[12])) / TICKS

    def restart_seconds(self, role: str, bound: float) -> float | None:
        """SIGKILL `role`, then the seconds until its READY milestone is seen again (None: not within `bound`)."""
        self.poll()
        milestone = READY[kind_of(role)]
        if milestone not in self.watch.seen.get(
            role, {}
        ):  # an actor of a commit without the "first step" line
            milestone = MILESTONES[kind_of(role)][0][0]
        before = len(self.watch.seen.get(role, {}).get(milestone, []))
        pid = self.watch.pids.get(role)
        if pid is None:
            raise RuntimeError(f"no process of {role} to kill (roles: {sorted(self.watch.pids)})")
        killed = time.time() - self.watch.t0
        os.kill(pid, signal.SIGKILL)
        back = self.wait(
            lambda: len(self.watch.seen.get(role, {}).get(milestone, [])) > before, killed + bound
        )
        return self.watch.seen[role][milestone][before] - killed if back else None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the launcher (it stops its roles in order), SIGKILL it after `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(5)

    def first_episode(self) -> float | None:
        """Seconds from the launch to the end of the first episode any exploring actor logged (its own clock)."""
        times = []
        for path in (self.run_dir / "episodes").glob("actor-*.csv"):
            try:
                with open(path) as f:
                    f.readline()
                    row = f.readline()
                times.append(float(row.split(",", 1)[0]) - self.watch.t0)
            except (OSError, ValueError):
                continue
        return min(times) if times else None

    def stderr_tail(self, lines: int = 30) -> str:
        return "\n".join(line for _, line in self.stderr_lines[-lines:])

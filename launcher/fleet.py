"""Starts the roles of one machine as child processes, watches them, and stops them.

Every local role starts at once (shards on ports the launcher picks, like the learner's, so every address is known
before anything serves); then the launcher waits for each local service to report SERVING: the replay shards (port
file, then gRPC health), the learner (gRPC health on its parameter-service port). Services on other machines are
waited for the same way before the roles that need them start. Health is checked over TLS with the
machine's files when TLS is on, or on a server's plaintext `health_port` when its table sets one. Every child runs
`python -m apexrl.launcher ROLE ...` in its own session (so Ctrl-C reaches the launcher only and the launcher
stops the roles in order) with stdout and stderr in RUN_DIR/logs/NAME.log, and the bearer token, if any, in its
environment (APEXRL_TOKEN), never on its command line. logs/ and checkpoints/ are 0700, the logs 0600.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from apexrl.common.files import open_private
from apexrl.common.free_ports import pick_free_port
from apexrl.common.port_check import check_ports_free
from apexrl.common.process import EXIT_BAD_CONFIG, LAUNCHER_PID_VARIABLE
from apexrl.common.settings import SettingsError
from apexrl.common.tls import TlsFiles
from apexrl.launcher.commands import command, environment, extra_args_for
from apexrl.launcher.fleet_config import ConfigError, FleetConfig
from apexrl.launcher.log_rotation import rotate_if_large
from apexrl.launcher.topology import Role, Wiring, address, roles_on, wiring, with_ports

log = logging.getLogger("apexrl.launch")

STOP_ORDER = (("actor", "evaluator", "learner"), ("replay",))  # users of a service stop before the service
LOG_CHECK_SECONDS = 5.0  # how often the role logs' sizes are looked at (rotated past role_log_max_mb)
PRIVATE_DIRECTORIES = ("logs", "checkpoints")  # 0700: role logs and checkpoints are the owner's alone


class Interrupted(Exception):
    """A stop was requested (signal) while the fleet was starting."""


class StartupError(Exception):
    """A role did not come up; the message names it and quotes the end of its log."""


def check_fixed_ports(config: FleetConfig, host: str) -> None:
    """ConfigError naming the role, the fleet-file key and the port when a port the fleet fixes for a role of
    `host` is taken already (ports left to the launcher are picked free at start)."""
    for role in roles_on(config, host):
        spec = (
            config.shards[role.index]
            if role.kind == "replay"
            else config.learner
            if role.kind == "learner"
            else None
        )
        health = spec.settings.get("health_port") if spec is not None else None
        ports = {
            f"{role.name} {key}": port
            for key, port in (
                ("port", role.port),
                ("metrics_port", role.metrics_port),
                ("health_port", health),
            )
            if port
        }
        try:
            check_ports_free(config.bind, ports)
        except SettingsError as err:
            raise ConfigError(str(err)) from None


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in tail) if tail else "    (log is empty)"


@dataclass
class Child:
    role: Role
    argv: list[str]
    log_path: Path
    process: subprocess.Popen
    log_file: IO[bytes] = field(repr=False)

    def exit_reason(self) -> str:
        """How it ended, in a few words: "learner was killed by SIGKILL", "shard-0 exited with status 2"."""
        code = self.process.returncode
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exited with status {code}"
        )
        return f"{self.role.name} {how}"

    def describe_exit(self) -> str:
        return f"{self.exit_reason()}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"


class Fleet:
    """The roles of `host`: started in dependency order, polled for unexpected exits, stopped in reverse order."""

    def __init__(
        self,
        config: FleetConfig,
        host: str,
        run_dir: Path,
        *,
        extra_args: Mapping[str, Sequence[str]],
        stop: threading.Event,
        inherit_fds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.host = host
        self.run_dir = run_dir
        self.extra_args = extra_args
        self.stop_requested = stop
        self.inherit_fds = tuple(inherit_fds)  # open in every child too (the run directory's lock)
        self.children: list[Child] = []
        self.restarts: dict[str, list[float]] = {}  # role -> monotonic times of its restarts
        self._due: dict[str, float] = {}  # role -> when its pending restart is due
        self._next_log_check = 0.0  # when the role logs' sizes are looked at next
        # Ports left open in the config (metrics ports, the local fleet's parameter-service port) are picked just
        # before the role that binds them starts, to keep the window in which another program could take them short.
        self.roles = roles_on(config, host)
        self.tls = config.tls_files()

    # --- start ----------------------------------------------------------------------------------------------------

    def commands(self) -> dict[str, list[str] | None]:
        """Every local role's command line, or None while it has not been started."""
        started = {child.role.name: child.argv for child in self.children}
        return {r.name: started.get(r.name) for r in self.roles}

    def start(self) -> None:
        """Start every local role; raises StartupError or Interrupted (children already started keep running
        until `stop`).

        Every local role starts at once, the shards on ports picked here (like the learner's) so that the learner
        and the actors are given their addresses without waiting for them: a role's start-up is mostly imports,
        and none of it needs another role's service. Services on other machines are still waited for before the
        roles that use them start. Then each local service is waited for until it reports SERVING."""
        for d in ("logs", "ports", "episodes", "checkpoints"):
            (self.run_dir / d).mkdir(parents=True, exist_ok=True)
        for d in PRIVATE_DIRECTORIES:
            (self.run_dir / d).chmod(0o700)
        timeout = self.config.startup_timeout
        shards = self._spawn_shards()
        for i, shard in enumerate(self.config.shards):
            if shard.host != self.host:
                self._wait_healthy(
                    self._probe(shard.host, shard.port, self._health_port(i)),
                    timeout,
                    None,
                    f"shard-{i} on {shard.host}",
                )
        local_learner: tuple[Role, Child] | None = None
        for role in (r for r in self.roles if r.kind == "learner"):
            if not role.port:
                self.config = with_ports(self.config, params_port=pick_free_port())
                role = replace(role, port=self.config.learner.port)
            local_learner = (role, self._spawn(role))
        learner = self.config.learner
        if learner.host != self.host and any(r.kind in ("actor", "evaluator") for r in self.roles):
            self._wait_healthy(
                self._probe(learner.host, learner.port, self._health_port(None)),
                timeout,
                None,
                f"learner on {learner.host}",
            )
        # Actors start while a local learner starts (its port is known): they act at random until its first weights
        # come (act_before_weights; the evaluator waits for them), within weights_wait_seconds.
        for role in (r for r in self.roles if r.kind in ("actor", "evaluator")):
            self._spawn(role)
        self._wait_shards(shards, timeout)
        if local_learner is not None:
            role, child = local_learner
            self._wait_healthy(self._probe(self.host, role.port, self._health_port(None)), timeout, child)
            log.info("learner serving the parameter service at %s", wiring(self.config, self.host).params)
        log.info(
            "started %d roles on %s: %s",
            len(self.children),
            self.host,
            ", ".join(c.role.name for c in self.children),
        )

    def _spawn_shards(self) -> list[Child]:
        """Start the local shards, each on its fixed port or one picked now; the fleet's wiring holds their ports
        from here on (a restarted shard comes back on the port it had)."""
        shards = []
        for role in [r for r in self.roles if r.kind == "replay"]:
            shards.append(self._spawn(role if role.port else replace(role, port=pick_free_port())))
        ports = {child.role.index: child.role.port for child in shards}
        self.config = with_ports(self.config, shard_ports=ports)
        return shards

    def _wait_shards(self, shards: list[Child], timeout: float) -> None:
        """Wait for each local shard's port file and its SERVING health."""
        for child in shards:
            port = self._wait_port_file(child, self._port_file(child.role), timeout)
            if port != child.role.port:  # the learner and the actors were given child.role.port
                raise StartupError(
                    f"{child.role.name} serves on port {port}, not on the port {child.role.port} the fleet gave the "
                    f"roles that use it: set [[shard]] port rather than --port in a --replay-arg"
                )
            self._wait_healthy(
                self._probe(self.host, port, self._health_port(child.role.index)), timeout, child
            )
            log.info("%s serving on port %d", child.role.name, port)

    def _health_port(self, shard: int | None) -> int | None:
        """The plaintext health port a shard's table (or, for None, the learner's) sets, if any."""
        spec = self.config.learner if shard is None else self.config.shards[shard]
        return spec.settings.get("health_port")

    def _probe(self, role_host: str, port: int, health_port: int | None) -> tuple[str, TlsFiles | None]:
        """Where and how to check a service's health: its plaintext health port, or its gRPC port (over TLS
        with this machine's files when TLS is on)."""
        if health_port is not None:
            return address(self.config, role_host, health_port, self.host), None
        return address(self.config, role_host, port, self.host), self.tls

    def _port_file(self, role: Role) -> Path:
        return self.run_dir / "ports" / f"{role.name}.port"

    def _spawn(self, role: Role) -> Child:
        if self.stop_requested.is_set():
            raise Interrupted()
        if role.metrics_port is None:
            role = replace(role, metrics_port=pick_free_port())
        self.roles = [role if r.name == role.name else r for r in self.roles]
        if role.kind == "replay":
            self._port_file(role).unlink(missing_ok=True)
        links = wiring(self.config, self.host) if role.kind != "replay" else Wiring((), "")
        extra = extra_args_for(role.kind, self.extra_args)
        argv = [
            sys.executable,
            "-m",
            "apexrl.launcher",
            *command(self.config, role, links, self.run_dir, extra),
        ]
        log_path = self.run_dir / "logs" / f"{role.name}.log"
        log_file = open_private(log_path, "ab")  # 0600; the child writes to it for its lifetime
        log_file.write(f"# {' '.join(argv)}\n".encode())
        log_file.flush()
        env = environment(
            self.config,
            role,
            links,
            self.run_dir,
            {**os.environ, "PYTHONUNBUFFERED": "1", LAUNCHER_PID_VARIABLE: str(os.getpid())},
        )
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            pass_fds=self.inherit_fds,
        )
        child = Child(role, argv, log_path, process, log_file)
        self.children.append(child)
        log.debug("started %s (pid %d): %s", role.name, process.pid, " ".join(argv))
        return child

    def _wait_port_file(self, child: Child, path: Path, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            child = self._check_starting(child)
            try:
                return int(path.read_text())
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise StartupError(
                    f"{child.role.name} wrote no port file {path} within {timeout:.0f}s; last "
                    f"lines of {child.log_path}:\n{log_tail(child.log_path)}"
                )
            time.sleep(0.05)

    def _wait_healthy(
        self, probe: tuple[str, TlsFiles | None], timeout: float, child: Child | None, what: str | None = None
    ) -> None:
        """Poll gRPC health in short rounds, so a dead child or a stop request ends the wait at once."""
        # Imported here: grpc loads while the roles start, not before the launcher starts the first of them.
        from apexrl.common.grpc_util import wait_for_health

        target, tls = probe
        name = what or (child.role.name if child else target)
        deadline = time.monotonic() + timeout
        if child is None:
            log.info("waiting for %s at %s", name, target)
        while True:
            if child is not None:
                child = self._check_starting(child)
            elif self.stop_requested.is_set():
                raise Interrupted()
            try:
                wait_for_health(target, timeout=min(1.0, max(0.1, deadline - time.monotonic())), tls=tls)
                return
            except TimeoutError as err:
                if time.monotonic() >= deadline:
                    tail = f"; last lines of {child.log_path}:\n{log_tail(child.log_path)}" if child else ""
                    raise StartupError(
                        f"{name} at {target} did not report SERVING within {timeout:.0f}s ({err}){tail}"
                    ) from None

    def _check_starting(self, child: Child) -> Child:
        """The child of `child`'s role to wait for now: itself while it runs; its restart when it died during
        start-up for a reason a restart may fix (a signal, a failure: exit 1), within the restart budget as after
        start-up. StartupError at once for a role that refused its configuration (exit 2: a bad flag, a port in
        use, a missing file: a restart would not fix it) or whose budget is spent."""
        if self.stop_requested.is_set():
            raise Interrupted()
        child = next(
            (c for c in self.children if c.role.name == child.role.name), child
        )  # restarted meanwhile
        if child.process.poll() is None:
            return child
        now, name = time.monotonic(), child.role.name
        delay = None
        if child.process.returncode not in (0, EXIT_BAD_CONFIG):
            delay = self._plan_restart(child, now, f"{child.exit_reason()} during start-up")
        if delay is None:
            raise StartupError(f"{child.describe_exit()}")
        if self.stop_requested.wait(delay):
            raise Interrupted()
        self._restart(name, time.monotonic())
        return next(c for c in self.children if c.role.name == name)

    def _plan_restart(self, child: Child, now: float, how: str) -> float | None:
        """The backoff before `child`'s role is started again (at once the first time in the window, then 1 s,
        2 s, 4 s, ... at most 30 s), logged with `how` it ended; None once its budget (max_restarts within
        restart_window) is spent. The one rule for roles that die during start-up and after it. The first restart
        waits for nothing: a role killed once is back in its start-up time (bench/startup_bench.py --restart)."""
        window = [t for t in self.restarts.get(child.role.name, []) if now - t < self.config.restart_window]
        if len(window) >= self.config.max_restarts:
            return None
        delay = 0.0 if not window else min(30.0, 2.0 ** (len(window) - 1))
        log.warning(
            "%s; restarting it %s (restart %d of at most %d in %.0fs)",
            how,
            "now" if not delay else f"in {delay:.0f}s",
            len(window) + 1,
            self.config.max_restarts,
            self.config.restart_window,
        )
        return delay

    # --- run and stop ---------------------------------------------------------------------------------------------

    def supervise(self, now: float | None = None) -> Child | None:
        """Restart roles that died, within their budget; return a child that ends the run, if any: one that exited
        with status 0 (it finished its work) or one whose restart budget is spent.

        A role that dies (non-zero status or a signal) is started again with the same command line, ports included,
        at once the first time, then after a backoff that doubles with each restart in the window (1 s, 2 s, 4 s,
        ... at most 30 s); at most
        `max_restarts` restarts per role within any `restart_window` seconds. The rest of the fleet keeps running:
        actors fail over to the other shards, the learner samples the live ones, a learner resumes from its
        checkpoint."""
        now = time.monotonic() if now is None else now
        self._rotate_logs(now)
        for child in list(self.children):
            if child.process.poll() is None or child.role.name in self._due:
                continue
            if child.process.returncode == 0:
                return child
            delay = self._plan_restart(child, now, child.describe_exit())
            if delay is None:
                return child
            self._due[child.role.name] = now + delay
        for name, due in list(self._due.items()):
            if due <= now and not self.stop_requested.is_set():
                del self._due[name]
                self._restart(name, now)
        return None

    def _rotate_logs(self, now: float) -> None:
        """Every few seconds, rotate the role logs past their cap (launcher/log_rotation.py)."""
        if now < self._next_log_check:
            return
        self._next_log_check = now + LOG_CHECK_SECONDS
        cap = int(self.config.role_log_max_mb * 1e6)
        for child in self.children:
            if rotate_if_large(child.log_path, cap):
                log.info("rotated %s (over %g MB)", child.log_path, self.config.role_log_max_mb)

    def _restart(self, name: str, now: float) -> None:
        dead = next(c for c in self.children if c.role.name == name)
        self.children.remove(dead)
        dead.log_file.close()
        role = next(
            r for r in self.roles if r.name == name
        )  # its ports as first started: addresses stay right
        self.restarts.setdefault(name, []).append(now)
        child = self._spawn(role)
        log.info("restarted %s (pid %d)", name, child.process.pid)

    @property
    def restart_counts(self) -> dict[str, int]:
        return {name: len(times) for name, times in self.restarts.items()}

    def stop(self, grace: float, force: threading.Event | None = None) -> None:
        """SIGTERM the users of services first (actors, evaluator, learner), then the shards; SIGKILL whatever
        is still running `grace` seconds after its SIGTERM, or at once when `force` is set (a second Ctrl-C)."""
        for kinds in STOP_ORDER:
            group = [c for c in self.children if c.role.kind in kinds and c.process.poll() is None]
            for child in group:
                _signal(child, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while any(c.process.poll() is None for c in group):
                forced = force is not None and force.is_set()
                if forced or time.monotonic() > deadline:
                    for child in group:
                        if child.process.poll() is None:
                            log.warning(
                                "killing %s (%s)",
                                child.role.name,
                                "second signal"
                                if forced
                                else f"still running {grace:g}s after SIGTERM; --stop-grace gives roles longer",
                            )
                            _signal(child, signal.SIGKILL)
                    for child in group:
                        child.process.wait()
                    break
                time.sleep(0.05)
        for child in self.children:
            child.log_file.close()


def _signal(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.process.send_signal(sig)

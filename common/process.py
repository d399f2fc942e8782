"""The skeleton every role process shares: logging, exit codes, a stop event set by SIGTERM/SIGINT, and the
settings shared by every process that listens or dials (host, metrics port, token, TLS files and server name,
health port, port file), and where the bearer token comes from (`resolve_token`: --token, else --token-file, else
the APEXRL_TOKEN environment variable).

Exit codes: 0 clean stop, 1 failure, 2 bad configuration (refused before anything starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from apexrl.common.settings import SettingsError, setting

C = TypeVar("C")

log = logging.getLogger("apexrl")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_CONFIG = 2

TOKEN_VARIABLE = "APEXRL_TOKEN"  # the bearer token when neither --token nor --token-file is given
# Set by `apexrl launch` in each role's environment: the launcher's pid, which the role watches (`stop_with_launcher`).
LAUNCHER_PID_VARIABLE = "APEXRL_LAUNCHER_PID"

# Local time to the millisecond ("17:56:09.123 INFO apexrl.actor: ..."): enough to order the roles' lines of one
# machine and to time their start-up (bench/startup_bench.py).
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)


# Once a role's work is over, an interpreter exit held longer than this is a stuck thread, not cleanup.
EXIT_WATCHDOG_SECONDS = 15.0


def exit_within(status: int, seconds: float = EXIT_WATCHDOG_SECONDS) -> None:
    """Make sure the process ends with `status` once its work is over. A thread that would hold the interpreter's
    exit past `seconds` (seen once on a loaded CI machine: the launcher printed its result, then did not exit for a
    minute) is named in the log, and the process exits anyway. For process entry points only: it ends the process.
    """
    import sys
    import time

    def watch() -> None:
        time.sleep(seconds)
        held = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
        log.warning("exit held for %.0fs by threads %s; exiting anyway", seconds, held)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)

    threading.Thread(target=watch, name="apexrl-exit-watchdog", daemon=True).start()


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event | None = None, *, hangup: bool = False, on_repeat: Callable[[], None] | None = None
) -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT (and SIGHUP with `hangup`) while the block runs; the previous handlers
    come back after it.

    Roles run until the event is set, then shut down in order. A second signal calls `on_repeat` (the launcher
    then kills its children without waiting); roles need none, as the launcher escalates to SIGKILL itself."""
    stop = stop if stop is not None else threading.Event()
    received: list[int] = []

    def handler(signum, frame) -> None:
        if not received:
            logging.getLogger("apexrl").info("received %s; shutting down", signal.Signals(signum).name)
        elif on_repeat is not None:
            on_repeat()
        received.append(signum)
        stop.set()

    signals = [signal.SIGTERM, signal.SIGINT] + (
        [signal.SIGHUP] if hangup and hasattr(signal, "SIGHUP") else []
    )
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)


def stop_with_launcher(stop: threading.Event, poll_seconds: float = 1.0) -> None:
    """When `apexrl launch` started this process (LAUNCHER_PID_VARIABLE holds its pid), set `stop` once the
    launcher is gone, so the role shuts down as on SIGTERM (checkpoints written, batches acknowledged) instead of
    running on unsupervised. Roles run in their own sessions, so a launcher killed with SIGKILL (or the OOM killer)
    otherwise leaves its whole fleet training, holding the run directory's lock and its ports. The launcher is
    this process's parent: once the parent pid differs, it has exited and the role was re-parented. The variable
    is removed, so nothing this process starts inherits the watch."""
    value = os.environ.pop(LAUNCHER_PID_VARIABLE, None)
    if not value:
        return
    try:
        launcher = int(value)
    except ValueError:
        log.warning("ignoring %s=%r: not a pid", LAUNCHER_PID_VARIABLE, value)
        return

    def watch() -> None:
        while not stop.wait(poll_seconds):
            if os.getppid() != launcher:
                log.warning("the launcher (pid %d) is gone; shutting down", launcher)
                stop.set()
                return

    threading.Thread(target=watch, name="apexrl-launcher-watch", daemon=True).start()


def host_setting() -> str:
    return setting(
        "127.0.0.1",
        "interface this process listens on (gRPC and metrics); 0.0.0.0 for every interface",
        wiring="[fleet] bind",
    )


def metrics_port_setting(default: int) -> int:
    return setting(
        default,
        "port of the Prometheus endpoint http://HOST:PORT/metrics; 0 picks a free port, -1 turns it off",
    )


def replay_resolve_setting() -> float:
    return setting(
        10.0,
        "seconds between re-resolving dns:///NAME:PORT replay addresses (shards that appear are "
        "used, shards that disappear are dropped, with no restart)",
    )


TOKEN_PRECEDENCE = (
    f"Precedence: --token, then --token-file, then the {TOKEN_VARIABLE} environment variable (none "
    f"of them: no authentication)"
)


def token_setting() -> str | None:
    return setting(
        None,
        "bearer token: servers require 'authorization: Bearer TOKEN' on every call except health "
        "checks, clients send it. A command line is visible to every local user (ps, "
        f"/proc/PID/cmdline): prefer --token-file or {TOKEN_VARIABLE}. {TOKEN_PRECEDENCE}",
    )


def token_file_setting() -> str | None:
    return setting(
        None,
        "file holding the bearer token (its content, surrounding whitespace stripped; keep it "
        f"mode 0600), used when --token is not given, before {TOKEN_VARIABLE}",
        metavar="PATH",
    )


def resolve_token(
    token: str | None, token_file: str | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The bearer token: `token` (--token), else the content of `token_file` (surrounding whitespace stripped),
    else $APEXRL_TOKEN (stripped too); None when none is given.

    SettingsError, in one line naming the path or the variable, for a token file that is missing, unreadable or
    empty, or an APEXRL_TOKEN that is set but empty: a token meant and not found must not run unauthenticated."""
    if token:
        return token
    if token_file is not None:
        try:
            text = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise SettingsError(f"--token-file: cannot read {token_file}: {reason}") from None
        if not text:
            raise SettingsError(f"--token-file: {token_file} is empty")
        _warn_if_readable_by_others(token_file)
        return text
    value = environ.get(TOKEN_VARIABLE)
    if value is None:
        return None
    if not value.strip():
        raise SettingsError(f"{TOKEN_VARIABLE} is set but empty (unset it to run without a token)")
    return value.strip()


def with_token(config: C, environ: Mapping[str, str] = os.environ) -> C:
    """`config` with `token` resolved from its token, token_file and the environment (`resolve_token`); a config
    without these fields comes back as it is."""
    if not hasattr(config, "token_file"):
        return config
    return dataclasses.replace(config, token=resolve_token(config.token, config.token_file, environ))


def _warn_if_readable_by_others(path: str) -> None:
    """Warn when users other than this process's may read the token file: anyone (o+r), or a group this process
    is not in (g+r). A Kubernetes Secret volume's 0440 files owned by the pod's fsGroup stay quiet: that group is
    the process's own, and 0440 is the only mode a non-root process can read them with."""
    try:
        st = os.stat(path)
    except OSError:
        return
    mode = st.st_mode & 0o777
    foreign_group = bool(mode & 0o040) and st.st_gid != os.getegid() and st.st_gid not in os.getgroups()
    if mode & 0o004 or foreign_group:
        logging.getLogger("apexrl").warning(
            "token file %s is readable by other users (mode %04o): chmod 600 it", path, mode
        )


def tls_cert_setting() -> str | None:
    return setting(
        None,
        "PEM certificate chain this process presents: a server's certificate (TLS on), and a "
        "client's when the servers require client certificates (mutual TLS); needs --tls-key "
        "(none: plaintext)",
        wiring="[fleet] tls_cert",
        metavar="PATH",
    )


def tls_key_setting() -> str | None:
    return setting(
        None,
        "PEM private key of --tls-cert (unencrypted; keep it readable by this process only)",
        wiring="[fleet] tls_key",
        metavar="PATH",
    )


def tls_ca_setting() -> str | None:
    return setting(
        None,
        "PEM CA bundle to verify peers: clients verify servers with it (none: the system's "
        "roots); a server given it requires and verifies client certificates (mutual TLS)",
        wiring="[fleet] tls_ca",
        metavar="PATH",
    )


def tls_server_name_setting() -> str | None:
    return setting(
        None,
        "check every server's certificate against this name instead of the address dialled "
        "(shards found through dns:/// are dialled by IP: with a Kubernetes headless Service, "
        "e.g. apexrl-replay.NAMESPACE.svc, which the fleet's one certificate holds); needs "
        "--tls-ca or --tls-cert (none: the address dialled)",
        wiring="[fleet] tls_server_name",
        metavar="NAME",
    )


def health_port_setting() -> int | None:
    return setting(
        None,
        "also serve grpc.health.v1 alone, in plaintext, on this port (Kubernetes' gRPC probes "
        "cannot use TLS or tokens); the main port keeps its health service (none: no extra "
        "port)",
        metavar="PORT",
    )


def port_file_setting() -> str | None:
    return setting(
        None,
        "write the bound gRPC port to this file once serving (useful with --port 0)",
        wiring="RUN_DIR/ports/ROLE.port",
        metavar="PATH",
    )

"""Refuse a port another process holds before a role starts, naming the port and the flag.

Without this check a busy port surfaces as gRPC's two-line "Failed to add port" error or Python's bare
`[Errno 98] Address already in use`, naming neither the port nor the setting, after other servers of the process
have started. The check binds each port the way the servers will (SO_REUSEADDR, as gRPC and the metrics server
do: a port left in TIME_WAIT is free, one with a listener is not) and lets it go at once, so a program that takes
the port in between is still possible, and then reported by the server itself.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping
from typing import Any

from apexrl.common.settings import SettingsError

# The fields of a role's settings that hold ports it listens on, by flag; 0 (a free port) and -1 (none) are skipped.
LISTENING_FIELDS = {"--port": "port", "--metrics-port": "metrics_port", "--health-port": "health_port"}


def listening_ports(config: Any) -> dict[str, int]:
    """Flag -> port of every fixed port `config` listens on: its own `listening_ports()` when it has one (a role
    whose ports depend on other settings), else the fields of LISTENING_FIELDS it has."""
    own = getattr(config, "listening_ports", None)
    if callable(own):
        return dict(own())
    ports = {flag: getattr(config, name, None) for flag, name in LISTENING_FIELDS.items()}
    return {flag: port for flag, port in ports.items() if isinstance(port, int) and port > 0}


def check_ports_free(host: str, ports: Mapping[str, int]) -> None:
    """SettingsError, in one line naming the flag, the port and the interface, when `host` is not an interface of
    this machine (--host) or a port of `ports` (flag -> port) cannot be listened on there now."""
    for flag, port in {"--host": 0, **ports}.items():
        reason = _bind_problem(host, port)
        if reason is not None:
            raise SettingsError(f"{flag}: {reason}")


def _bind_problem(host: str, port: int) -> str | None:
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as err:
        return f"cannot listen on {host}: the name does not resolve ({err.strerror})"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRNOTAVAIL:
                return f"cannot listen on {host}: it is not an address of this machine"
            if err.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use by another process (choose another port, or 0 "
                    f"for a free one)"
                )
            return f"cannot listen on port {port} of {host}: {err.strerror or err}"
    return None

"""Ports for a process that has not started yet, picked where no other program's sockets land by themselves.

A port read from binding port 0 and let go is an ephemeral port: the kernel hands the same range to every socket
that connects without binding and to every server that binds port 0, so in the seconds a role takes to start (it
imports torch, builds its environment) a gRPC channel or a test's server can take it, and the role fails to bind
(seen: a learner's parameter-service port, 8 s after the launcher picked it, beside a test suite). Ports below the
kernel's ephemeral range (ip_local_port_range) are taken only by programs that ask for them by number, so picking
there at random, checking each candidate is free, leaves only another launcher's pick to collide with.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20_000  # below it sit the well-known and commonly configured ports
TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(v) for v in PORT_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def pick_free_port(host: str = "", rng: random.Random | None = None) -> int:
    """A port nothing holds on `host` now, below the ephemeral range when there is room, else one from port 0."""
    rng = rng or random.SystemRandom()
    low = ephemeral_range()[0]
    if low - LOWEST >= 1_000:
        for _ in range(TRIES):
            port = rng.randrange(LOWEST, low)
            if _is_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_free(host: str, port: int) -> bool:
    """Free to listen on as a server would (SO_REUSEADDR: a port in TIME_WAIT is free, one with a listener not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True

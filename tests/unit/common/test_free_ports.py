"""Ports picked for roles that have not started (common/free_ports.py) lie below the kernel's ephemeral range, where
no connecting socket or port-0 server lands by itself, and are free when picked."""

from __future__ import annotations

import random
import socket

from apexrl.common import free_ports
from apexrl.common.free_ports import LOWEST, ephemeral_range, pick_free_port


def test_a_picked_port_is_below_the_ephemeral_range_and_free():
    low, _ = ephemeral_range()
    for _ in range(20):
        port = pick_free_port("127.0.0.1")
        assert LOWEST <= port < low
        with socket.socket() as sock:  # free: a server can listen on it
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_in_use_is_never_picked():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]

        class Always(random.Random):
            """Offers the busy port first, then others."""

            offers = 0

            def randrange(self, *args):
                Always.offers += 1
                return busy if Always.offers == 1 else super().randrange(*args)

        free_ports_low = free_ports.ephemeral_range
        try:
            free_ports.ephemeral_range = lambda: (max(busy + 1, LOWEST + 1_000), 60_999)
            port = pick_free_port("127.0.0.1", Always(0))
        finally:
            free_ports.ephemeral_range = free_ports_low
        assert port != busy and Always.offers >= 2


def test_without_room_below_the_ephemeral_range_it_falls_back_to_port_zero(monkeypatch):
    monkeypatch.setattr(free_ports, "ephemeral_range", lambda: (LOWEST + 10, 60_999))
    port = pick_free_port("127.0.0.1")
    assert port > 0

"""A server without any credential says so when it listens beyond loopback (issue 31): anyone who reaches the
port may call every method. Loopback binds and servers with credentials stay quiet."""

from __future__ import annotations

import logging

import pytest

from apexrl.common.grpc_util import warn_if_open


@pytest.mark.parametrize(
    ("address", "is_open", "warned"),
    [
        ("0.0.0.0:7000", True, True),
        ("10.0.0.5:7000", True, True),
        ("[::]:7000", True, True),
        ("127.0.0.1:7000", True, False),
        ("localhost:7000", True, False),
        ("[::1]:7000", True, False),
        ("0.0.0.0:7000", False, False),
    ],
)
def test_open_servers_off_loopback_are_named_in_a_warning(caplog, address, is_open, warned):
    with caplog.at_level(logging.WARNING, logger="apexrl.common.grpc_util"):
        warn_if_open(address, 7000, is_open)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(messages) == warned
    if warned:
        assert "OPEN (no token, no role tokens)" in messages[0] and "--role-tokens" in messages[0]

"""The SDK's clients refuse an address gRPC would misread, when constructed: `localhost` (gRPC dials 443),
`127.0.0.1:99999` (gRPC wraps the port), `localhost:abc` (gRPC retries forever)."""

from __future__ import annotations

import pytest

from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient

BAD = [
    ("localhost", "has no port: give HOST:PORT (e.g. localhost:7000)"),
    ("127.0.0.1:99999", "has a port out of range (99999; ports are 1..65535)"),
    ("localhost:abc", "has a port that is not a number ('abc')"),
    ("my host:7000", "holds a space"),
    ("", "is empty"),
    ("http://127.0.0.1:7000", "has a scheme"),
    ("::1:7000", "must put an IPv6 address in brackets"),
]


@pytest.mark.parametrize("client", [ReplayClient, ParameterClient])
@pytest.mark.parametrize(("address", "problem"), BAD)
def test_a_bad_address_is_refused_by_the_constructor(client, address, problem):
    with pytest.raises(ValueError) as err:
        client(address)
    assert str(err.value).startswith(f"{client.__name__} address ({address!r}) ")
    assert problem in str(err.value)


@pytest.mark.parametrize("client", [ReplayClient, ParameterClient])
@pytest.mark.parametrize("address", ["127.0.0.1:7000", "localhost:1", "[::1]:7000", "shard-0.replay:65535"])
def test_a_good_address_makes_a_client_without_dialing(client, address):
    made = client(address)  # channels connect lazily: nothing listens there and nothing is dialed yet
    try:
        assert made.address == address
    finally:
        made.close()

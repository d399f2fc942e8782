"""common.addresses: every address a setting gives is checked when parsed, with the setting and the fault named."""

from __future__ import annotations

import pytest

from apexrl.common.addresses import (
    Address,
    check_host,
    check_port,
    check_targets,
    join_host_port,
    parse_address,
    parse_dns_target,
)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:7000", Address("127.0.0.1", 7000)),
        ("localhost:1", Address("localhost", 1)),
        (
            "apexrl-replay.apexrl.svc.cluster.local:65535",
            Address("apexrl-replay.apexrl.svc.cluster.local", 65535),
        ),
        ("replay_0:7000", Address("replay_0", 7000)),
        ("[::1]:7000", Address("::1", 7000)),
        ("[fd00::12:3]:7200", Address("fd00::12:3", 7200)),
    ],
)
def test_good_addresses_parse_and_print_back(text, parsed):
    assert parse_address(text, "params") == parsed
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("localhost", "has no port: give HOST:PORT (e.g. localhost:7000)"),  # gRPC would dial 443
        (
            "127.0.0.1:99999",
            "has a port out of range (99999; ports are 1..65535)",
        ),  # gRPC would wrap it to 34463
        ("127.0.0.1:0", "has a port out of range (0;"),
        ("localhost:abc", "has a port that is not a number ('abc')"),  # gRPC would retry it forever
        ("localhost:-1", "has a port that is not a number ('-1')"),
        ("my host:7000", "holds a space"),
        (" localhost:7000", "holds a space"),
        ("", "is empty"),
        (":7000", "has no host"),
        ("http://localhost:7000", "has a scheme"),
        ("::1:7000", "must put an IPv6 address in brackets: [IPV6]:PORT"),
        ("[::1]", "has no port"),
        ("[::1]7000", "must be [IPV6]:PORT"),
        ("[::1:7000", "has no closing ']'"),
        ("[localhost]:7000", "has a host ('localhost') that is not an IPv6 address"),
        ("300.1.2.3:7000", "has a host ('300.1.2.3') that is not an IPv4 address"),
        ("a..b:7000", "that is not a host name"),
        ("host!:7000", "that is not a host name"),
    ],
)
def test_bad_addresses_are_refused_naming_the_setting_the_value_and_the_fault(text, fault):
    with pytest.raises(ValueError) as raised:
        parse_address(text, "params")
    message = str(raised.value)
    assert message.startswith(f"params ({text!r}) ") and fault in message, message


def test_replay_lists_take_addresses_and_dns_names_and_name_the_bad_entry():
    check_targets(["127.0.0.1:7000", "[::1]:7001", "dns:///apexrl-replay.apexrl.svc:7000"], "replay")
    with pytest.raises(ValueError, match=r"^replay \('localhost:abc'\) has a port that is not a number"):
        check_targets(["127.0.0.1:7000", "localhost:abc"], "replay")
    with pytest.raises(ValueError, match=r"^replay \('dns:///svc'\) is not dns:///NAME:PORT: .* has no port"):
        check_targets(["dns:///svc"], "replay")
    with pytest.raises(ValueError, match=r"is not dns:///NAME:PORT \(three slashes"):
        check_targets(["dns://svc:7000"], "replay")
    assert parse_dns_target("dns:///[fd00::1]:7000", "replay") == Address("fd00::1", 7000)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "[::1]", "m1", "node-1.example.com"])
def test_hosts_alone_take_names_and_both_address_families(host):
    check_host(host, "host")


@pytest.mark.parametrize(
    ("host", "fault"),
    [
        ("my host", "holds a space"),
        ("", "is empty"),
        ("10.0.0.1:7000", "holds a port"),
        ("256.0.0.1", "is not an IPv4 address"),
        ("[m1]", "is not an IPv6 address"),
        ("m1/24", "is not a host name"),
    ],
)
def test_bad_hosts_are_refused(host, fault):
    with pytest.raises(ValueError) as raised:
        check_host(host, "[hosts] m1")
    assert str(raised.value).startswith(f"[hosts] m1 ({host!r}) {fault}"), raised.value


def test_listening_ports_allow_0_and_minus_1_only_where_they_mean_something():
    check_port(7000, "port")
    check_port(0, "port", pick=True)
    check_port(-1, "metrics_port", pick=True, off=True)
    with pytest.raises(ValueError, match=r"^port \(0\) must be a port in 1..65535$"):
        check_port(0, "port")
    with pytest.raises(ValueError, match=r"^port \(-1\) must be a port in 1..65535 \(0 picks a free one\)$"):
        check_port(-1, "port", pick=True)
    with pytest.raises(ValueError, match=r"^metrics_port \(65536\) must be a port in 1..65535"):
        check_port(65536, "metrics_port", pick=True, off=True)


def test_ipv6_hosts_are_bracketed_when_joined_with_a_port():
    assert join_host_port("::1", 7000) == "[::1]:7000"
    assert join_host_port("[::1]", 7000) == "[::1]:7000"
    assert join_host_port("10.0.0.1", 7000) == "10.0.0.1:7000"

"""common.discovery: dns:///NAME:PORT targets, re-resolved on a period, keeping the last answer through failures."""

from __future__ import annotations

import pytest

from apexrl.common.discovery import ShardAddresses, check_targets, split_target, system_resolver


class Name:
    """A resolver whose answers the test sets (the real one is system_resolver, tested below)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.calls = 0
        self.fail = False

    def __call__(self, name: str, port: int) -> list[str]:
        self.calls += 1
        if self.fail:
            raise OSError("Temporary failure in name resolution")
        return list(self.addresses)


@pytest.mark.parametrize(
    "target, parsed",
    [
        ("dns:///apexrl-replay:7000", ("apexrl-replay", 7000)),
        ("dns:///apexrl-replay.ns.svc.cluster.local:7001", ("apexrl-replay.ns.svc.cluster.local", 7001)),
        ("dns:///[::1]:7000", ("::1", 7000)),
    ],
)
def test_split_target(target, parsed):
    assert split_target(target) == parsed


@pytest.mark.parametrize(
    "target",
    [
        "dns:///name",
        "dns:///:7000",
        "dns:///name:0",
        "dns:///name:70000",
        "dns://name:7000",
        "dns:///name:port",
    ],
)
def test_malformed_targets_are_refused_with_the_target_named(target):
    with pytest.raises(ValueError, match="is not dns:///NAME:PORT"):
        check_targets(["127.0.0.1:7000", target])


def test_plain_addresses_pass_through_and_names_expand_in_a_stable_order():
    name = Name("10.0.0.3", "10.0.0.2", "fd00::1")
    addresses = ShardAddresses(["127.0.0.1:7000", "dns:///apexrl-replay:7001"], resolver=name)
    assert addresses.dynamic
    assert addresses.current() == ["127.0.0.1:7000", "10.0.0.3:7001", "10.0.0.2:7001", "[fd00::1]:7001"]


def test_names_are_re_resolved_only_after_the_period_unless_forced():
    name = Name("10.0.0.2")
    addresses = ShardAddresses(["dns:///apexrl-replay:7000"], resolve_every=3600, resolver=name)
    assert addresses.current() == ["10.0.0.2:7000"] and name.calls == 1
    name.addresses.append("10.0.0.3")
    assert addresses.current() == ["10.0.0.2:7000"] and name.calls == 1
    assert addresses.current(force=True) == ["10.0.0.2:7000", "10.0.0.3:7000"] and name.calls == 2


def test_a_failed_resolution_keeps_the_last_known_shards():
    name = Name("10.0.0.2", "10.0.0.3")
    addresses = ShardAddresses(["dns:///apexrl-replay:7000"], resolver=name)
    assert len(addresses.current(force=True)) == 2
    name.fail = True
    assert addresses.current(force=True) == ["10.0.0.2:7000", "10.0.0.3:7000"]
    name.fail, name.addresses = False, []
    assert addresses.current(force=True) == []  # a name with no ready pod: no shard, until one appears


def test_static_targets_never_resolve():
    name = Name()
    addresses = ShardAddresses(["127.0.0.1:7000", "localhost:7001"], resolver=name)
    assert not addresses.dynamic and addresses.current(force=True) == ["127.0.0.1:7000", "localhost:7001"]
    assert name.calls == 0


def test_the_system_resolver_reads_the_hosts_file():
    assert system_resolver("localhost", 7000)[0] in ("127.0.0.1", "::1")


def test_resolve_every_must_be_positive():
    with pytest.raises(ValueError, match="resolve_every"):
        ShardAddresses(["dns:///a:1"], resolve_every=0)

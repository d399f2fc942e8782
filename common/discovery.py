"""Replay shard addresses that follow a DNS name: `dns:///NAME:PORT` stands for every address NAME resolves to.

A Kubernetes StatefulSet behind a headless Service answers its Service name with one address per ready pod, so
scaling the shards changes what the name resolves to. The learner and the actors re-resolve such names every
`resolve_every` seconds and start or stop using shards accordingly, with no restart. A plain `host:port` is one
shard, used as given (resolved by gRPC when it connects).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence

from apexrl.common.addresses import DNS_SCHEME, join_host_port, parse_dns_target
from apexrl.common.addresses import check_targets as check_replay_targets

log = logging.getLogger(__name__)

# (name, port) -> the addresses the name resolves to now (IPv4 or IPv6 literals).
Resolver = Callable[[str, int], list[str]]


def split_target(target: str) -> tuple[str, int]:
    """NAME and PORT of `dns:///NAME:PORT`; ValueError naming the target otherwise (common/addresses.py)."""
    address = parse_dns_target(target, "replay")
    return address.host, address.port


def check_targets(targets: Sequence[str]) -> None:
    """Validate every entry up front (HOST:PORT or dns:///NAME:PORT), so a typo fails at start-up rather than at
    the first dial or refresh."""
    check_replay_targets(targets, "replay")


def system_resolver(name: str, port: int) -> list[str]:
    """Every address `name` resolves to through the system resolver (/etc/hosts, DNS), in a stable order."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


class ShardAddresses:
    """The current shard addresses of a list of targets (plain `host:port` or `dns:///NAME:PORT`).

    `current()` returns them in a stable order: plain targets as given, then each name's addresses sorted. A name
    that fails to resolve keeps its last addresses (a DNS hiccup must not drop the fleet's shards)."""

    def __init__(
        self, targets: Sequence[str], *, resolve_every: float = 10.0, resolver: Resolver = system_resolver
    ) -> None:
        check_targets(targets)
        if not resolve_every > 0:
            raise ValueError(f"resolve_every ({resolve_every}) must be > 0")
        self.targets = tuple(targets)
        self.resolve_every = resolve_every
        self._resolver = resolver
        self._resolved: dict[str, list[str]] = {}
        self._resolved_at = -float("inf")

    @property
    def dynamic(self) -> bool:
        """True when some target is a name whose addresses can change."""
        return any(t.startswith(DNS_SCHEME) for t in self.targets)

    def current(self, *, force: bool = False) -> list[str]:
        """The addresses now, re-resolving names when `resolve_every` has passed (or with `force`)."""
        now = time.monotonic()
        if self.dynamic and (force or now - self._resolved_at >= self.resolve_every):
            self._resolved_at = now
            for target in self.targets:
                if target.startswith(DNS_SCHEME):
                    self._resolve(target)
        addresses: list[str] = []
        for target in self.targets:
            for address in self._resolved.get(target, []) if target.startswith(DNS_SCHEME) else [target]:
                if address not in addresses:
                    addresses.append(address)
        return addresses

    def _resolve(self, target: str) -> None:
        name, port = split_target(target)
        try:
            found = [join_host_port(a, port) for a in self._resolver(name, port)]
        except OSError as err:
            log.warning(
                "cannot resolve %s (%s); keeping its %d known shards",
                target,
                err,
                len(self._resolved.get(target, [])),
            )
            return
        before = self._resolved.get(target)
        if before is not None and found != before:
            log.info("%s now resolves to %d shards: %s", target, len(found), ", ".join(found) or "none")
        self._resolved[target] = found

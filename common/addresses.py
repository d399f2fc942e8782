"""Network addresses as settings write them, checked when they are parsed.

Every address a flag or a fleet file gives is checked here before any process starts, so that a typo is one line
naming the setting (exit status 2) instead of a dial that fails minutes later: gRPC dials `localhost` (no port) at
443, wraps `127.0.0.1:99999` to another port and retries `localhost:abc` forever.

The forms:
- `HOST:PORT`: HOST a DNS name (letters, digits, '-', '_', dot-separated), an IPv4 address, or an IPv6 address in
  brackets (`[::1]:7000`); PORT in 1..65535.
- `dns:///NAME:PORT` (replay lists only): every address NAME resolves to (common/discovery.py).
- a host alone (`--host`, `[fleet] bind`, `[hosts]` entries): a DNS name, IPv4 or IPv6 address (brackets allowed).
- ports a server listens on: 1..65535, 0 to pick a free one, -1 (metrics only) for none.

Pure: no sockets, no name resolution (a name that does not resolve is a runtime condition, not a typo).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

DNS_SCHEME = "dns:///"
MAX_PORT = 65535
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")


@dataclass(frozen=True)
class Address:
    """A checked HOST:PORT; `host` holds an IPv6 address without its brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return join_host_port(self.host, self.port)


def join_host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets (`[::1]:7000`), as gRPC and URLs want it."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def parse_address(text: str, what: str) -> Address:
    """HOST:PORT of `text`; ValueError starting with `what` (the setting's name) and quoting the text."""
    problem = _address_problem(text) if isinstance(text, str) else "is not text"
    if problem:
        raise ValueError(f"{what} ({text!r}) {problem}")
    host, _, port = text.rpartition(":")
    return Address(host[1:-1] if host.startswith("[") else host, int(port))


def check_address(text: str, what: str) -> None:
    """ValueError naming `what` unless `text` is HOST:PORT (see parse_address)."""
    parse_address(text, what)


def parse_dns_target(text: str, what: str) -> Address:
    """NAME and PORT of `dns:///NAME:PORT`; ValueError naming `what` and the target otherwise."""
    if not text.startswith(DNS_SCHEME):
        raise ValueError(f"{what} ({text!r}) is not dns:///NAME:PORT (three slashes: no DNS server named)")
    problem = _address_problem(text[len(DNS_SCHEME) :])
    if problem:
        raise ValueError(f"{what} ({text!r}) is not dns:///NAME:PORT: the part after dns:/// {problem}")
    return parse_address(text[len(DNS_SCHEME) :], what)


def check_targets(targets: Sequence[str], what: str) -> None:
    """Every entry of a replay list: HOST:PORT or dns:///NAME:PORT; ValueError naming `what` and the entry."""
    for target in targets:
        if target.startswith("dns:"):
            parse_dns_target(target, what)
        else:
            check_address(target, what)


def check_host(text: str, what: str) -> None:
    """A host alone (an interface to listen on, a machine's address): a DNS name, IPv4 or IPv6 address."""
    if not isinstance(text, str):
        raise ValueError(f"{what} ({text!r}) is not text")
    bracketed = text.startswith("[") and text.endswith("]")
    problem = _host_problem(text[1:-1] if bracketed else text, bracketed=bracketed)
    if problem:
        raise ValueError(f"{what} ({text!r}) {problem}")


def check_port(port: int, what: str, *, pick: bool = False, off: bool = False) -> None:
    """A port to listen on: 1..65535, or 0 with `pick` (a free one), or -1 with `off` (none)."""
    low = -1 if off else 0 if pick else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= MAX_PORT:
        allowed = ", ".join(f for f, ok in (("0 picks a free one", pick), ("-1 turns it off", off)) if ok)
        raise ValueError(
            f"{what} ({port}) must be a port in 1..{MAX_PORT}" + (f" ({allowed})" if allowed else "")
        )


def check_listen(host: str, port: int, metrics_port: int) -> None:
    """A server's --host, --port (0: a free one) and --metrics-port (0: a free one, -1: none)."""
    check_host(host, "host")
    check_port(port, "port", pick=True)
    check_port(metrics_port, "metrics_port", pick=True, off=True)


def _address_problem(text: str) -> str | None:
    if not text.strip():
        return "is empty: give HOST:PORT"
    if any(c.isspace() for c in text):
        return "holds a space: give HOST:PORT"
    if "://" in text:
        return "has a scheme: give HOST:PORT (replay lists also take dns:///NAME:PORT)"
    bracketed = text.startswith("[")
    if bracketed:
        host, closed, rest = text[1:].partition("]")
        if not closed:
            return "has no closing ']': give [IPV6]:PORT"
        if not rest:
            return f"has no port: give HOST:PORT (e.g. {text}:7000)"
        if not rest.startswith(":"):
            return "must be [IPV6]:PORT, with ':' after the closing bracket"
        port = rest[1:]
    else:
        if text.count(":") > 1:
            return "must put an IPv6 address in brackets: [IPV6]:PORT"
        host, colon, port = text.partition(":")
        if not colon:
            return f"has no port: give HOST:PORT (e.g. {text}:7000)"
    if not host:
        return "has no host: give HOST:PORT (e.g. 127.0.0.1:7000)"
    if not port.isascii() or not port.isdigit():
        return f"has a port that is not a number ({port!r}): give HOST:PORT"
    if not 1 <= int(port) <= MAX_PORT:
        return f"has a port out of range ({int(port)}; ports are 1..{MAX_PORT})"
    problem = _host_problem(host, bracketed=bracketed)
    return None if problem is None else f"has a host ({host!r}) that {problem}"


def _host_problem(host: str, *, bracketed: bool) -> str | None:
    """What is wrong with a host (phrased after the host's own mention), or None."""
    if not host:
        return "is empty: give a host name or an IP address"
    if any(c.isspace() for c in host):
        return "holds a space: give a host name or an IP address"
    if not bracketed and host.count(":") == 1:
        return "holds a port: give the host alone (each role's port is set apart)"
    if bracketed or ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "is not an IPv6 address"
        return None
    if _DOTTED_NUMBERS.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "is not an IPv4 address"
        return None
    if len(host) > 253 or not _DNS_NAME.fullmatch(host):
        return "is not a host name (letters, digits, '-' and '_', dot-separated)"
    return None

"""Network namespaces on one Linux bridge: "machines" or "pods" with their own IPv4 address and /etc/hosts, on one box.

    with NamespaceNetwork(["m1", "m2"]) as net:         # needs root and iproute2
        server = net.popen("m1", ["python", "-m", "http.server", "8000"])
        net.run("m2", ["curl", "http://m1:8000/"])        # "m1" resolves to net.address("m1") inside m2

Each namespace gets one end of a veth pair (`eth0` inside, an address in a private 10.213.X.0/24 chosen so that it
overlaps no address or route of this machine), loopback up, and `/etc/netns/NETNS/hosts`, which `ip netns exec`
bind-mounts over `/etc/hosts`, so names resolve per namespace (by default every namespace's name to its address;
`set_hosts` adds names, one name may map to several addresses, as a Kubernetes headless Service does).

Every object a network creates is named after its run id, `axt<pid in hex>x<sequence>`: runs in parallel never
collide, and `remove_stale` (called before each network is created) removes what a crashed earlier run left
behind, recognised by a run id whose process no longer exists. `close` kills the processes still inside the
namespaces, deletes veths, namespaces, /etc/netns entries and the bridge, and raises if anything remains.

`python -m tests.support.netns cleanup` removes leftovers by hand; `python -m tests.support.netns list` shows them.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PREFIX = "axt"  # "apexrl test": the start of every name this module creates
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` bind-mounts NETNS_ETC/NAME/* over /etc/*
SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")  # each network takes one /24 of it
MAX_NAMESPACES = 99  # keeps interface names within the kernel's 15 characters
IFNAMSIZ = 15
_CIDR = re.compile(r"^\d+\.\d+\.\d+\.\d+/\d+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_sequence = 0  # networks created by this process so far


class NetnsError(RuntimeError):
    """An `ip` command failed, or teardown left something behind; the message says what."""


@dataclass(frozen=True)
class Namespace:
    """One namespace of a network."""

    name: str  # the test's name for it ("m1", "shard-0"); resolves to `address` inside every namespace
    netns: str  # the kernel's name (`ip netns list`): the run id, '-', name
    address: str  # IPv4 address of its eth0 on the bridge
    veth: str  # this machine's end of its veth pair (the other end is eth0 inside)


HostEntries = Mapping[str, "str | Sequence[str]"]


class NamespaceNetwork:
    """N network namespaces attached to one bridge; a context manager that creates and tears them down.

    `names` are the test's names for the namespaces. `reach_from_host=True` also gives the bridge an address
    (.254), so this process, outside every namespace, can connect to the namespaces' addresses."""

    def __init__(self, names: Sequence[str], *, reach_from_host: bool = False, prefix: str = PREFIX) -> None:
        global _sequence
        names = list(names)
        if not 1 <= len(names) <= MAX_NAMESPACES:
            raise ValueError(f"between 1 and {MAX_NAMESPACES} namespaces, got {len(names)}")
        bad = [n for n in names if not _NAME.match(n)]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"namespace names must be unique and match {_NAME.pattern}: {names}")
        self.prefix = prefix
        self.run_id = f"{prefix}{os.getpid():x}x{_sequence % 100}"
        _sequence += 1
        self.bridge = f"{self.run_id}br"
        if len(f"{self.run_id}v{len(names) - 1}") > IFNAMSIZ or len(self.bridge) > IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} is too long for interface names of {IFNAMSIZ} characters")
        self.names = names
        self.reach_from_host = reach_from_host
        self.subnet: ipaddress.IPv4Network | None = None
        self.namespaces: dict[str, Namespace] = {}
        self._created = False

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def __enter__(self) -> NamespaceNetwork:
        self.create()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def create(self) -> None:
        """Create the bridge, the namespaces and their hosts files; on failure, remove what was made and raise."""
        if self._created:
            raise NetnsError(f"network {self.run_id} already created")
        self._created = True
        try:
            remove_stale(self.prefix)
            self.subnet = _free_subnet(os.getpid() + _sequence, self.prefix)
            hosts = list(self.subnet.hosts())
            _ip(
                "link",
                "add",
                self.bridge,
                "type",
                "bridge",
                "nf_call_iptables",
                "0",
                "nf_call_ip6tables",
                "0",
            )
            _ip("link", "set", self.bridge, "up")
            if self.reach_from_host:
                _ip("addr", "add", f"{hosts[-1]}/{self.subnet.prefixlen}", "dev", self.bridge)
            for i, name in enumerate(self.names):
                ns = Namespace(name, f"{self.run_id}-{name}", str(hosts[i]), f"{self.run_id}v{i}")
                self.namespaces[name] = ns
                _ip("netns", "add", ns.netns)
                _ip("link", "add", ns.veth, "type", "veth", "peer", "name", "eth0", "netns", ns.netns)
                _ip("link", "set", ns.veth, "master", self.bridge, "up")
                _ip("-n", ns.netns, "addr", "add", f"{ns.address}/{self.subnet.prefixlen}", "dev", "eth0")
                _ip("-n", ns.netns, "link", "set", "eth0", "up")
                _ip("-n", ns.netns, "link", "set", "lo", "up")
            self.set_hosts({})
        except BaseException:
            try:
                self.close()
            except NetnsError as err:  # the original error matters more; say what is left
                print(f"netns: {err}", file=sys.stderr)
            raise

    def close(self) -> None:
        """Kill the processes left in the namespaces, delete everything this network made; idempotent. Raises
        NetnsError naming what could not be removed (after trying to remove everything)."""
        problems = []
        for ns in self.namespaces.values():
            try:
                _kill_all(ns.netns)
            except NetnsError as err:
                problems.append(str(err))
        for ns in self.namespaces.values():
            _ip("link", "del", ns.veth, check=False)  # deletes eth0 inside too
            _ip("netns", "del", ns.netns, check=False)
            shutil.rmtree(NETNS_ETC / ns.netns, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        _remove_empty(NETNS_ETC)
        left = leftovers(run_id=self.run_id, prefix=self.prefix)
        if left:
            problems.append(f"left behind: {', '.join(left)}")
        if problems:
            raise NetnsError(f"network {self.run_id}: {'; '.join(problems)}")

    # --- the namespaces -------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Namespace:
        try:
            return self.namespaces[name]
        except KeyError:
            raise KeyError(f"no namespace {name!r} in this network; names: {', '.join(self.names)}") from None

    def address(self, name: str) -> str:
        return self[name].address

    @property
    def addresses(self) -> dict[str, str]:
        """Each namespace's name -> its address (what every hosts file maps by default)."""
        return {name: ns.address for name, ns in self.namespaces.items()}

    @property
    def host_address(self) -> str | None:
        """This machine's address on the bridge (reach_from_host=True), else None."""
        return str(list(self.subnet.hosts())[-1]) if self.reach_from_host and self.subnet else None

    def set_hosts(
        self, entries: HostEntries, only: Sequence[str] | None = None, *, namespace_names: bool = True
    ) -> None:
        """Write the hosts file of every namespace (or of `only`): localhost, each namespace's name (unless
        `namespace_names` is False: then only what `entries` names resolves, as for Kubernetes pods, whose names
        are not DNS names), then `entries` (name -> address or addresses; an entry overrides a namespace's name).

        The file is rewritten in place with one write, never shorter than before (padded with a comment), so a
        process already running in the namespace (its /etc/hosts is a bind mount of this very file) sees the old
        or the new mapping on its next lookup, never an empty file."""
        merged: dict[str, list[str]] = (
            {name: [address] for name, address in self.addresses.items()} if namespace_names else {}
        )
        for name, value in entries.items():
            merged[name] = [value] if isinstance(value, str) else list(value)
        for name in self.names if only is None else only:
            ns = self[name]
            path = NETNS_ETC / ns.netns / "hosts"
            path.parent.mkdir(parents=True, exist_ok=True)
            _rewrite_in_place(path, render_hosts(merged, f"namespace {ns.netns} ({name})"))

    def popen(self, name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside namespace `name` (`ip netns exec` execs it: the Popen's pid is the command's)."""
        return subprocess.Popen(["ip", "netns", "exec", self[name].netns, *argv], **kwargs)

    def run(
        self, name: str, argv: Sequence[str], *, timeout: float = 60.0, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run `argv` inside namespace `name` to completion (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self[name].netns, *argv], timeout=timeout, **kwargs)

    def pids(self, name: str) -> list[int]:
        """Processes running inside namespace `name`."""
        return _pids(self[name].netns)


def render_hosts(entries: Mapping[str, Sequence[str]], owner: str) -> str:
    """An /etc/hosts text: localhost first, then one line per (address, name), in the order given."""
    lines = [
        f"# written by tests/support/netns.py for {owner}",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    for name, addresses in entries.items():
        if not addresses:
            raise ValueError(f"hosts entry {name!r} has no address")
        for address in addresses:
            ipaddress.ip_address(address)  # ValueError names a bad one
            lines.append(f"{address}\t{name}")
    return "\n".join(lines) + "\n"


def _rewrite_in_place(path: Path, text: str) -> None:
    data = text.encode()
    try:
        old = path.stat().st_size
    except FileNotFoundError:
        old = 0
    if len(data) < old:
        data += b"#" * (old - len(data) - 1) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        written = os.pwrite(fd, data, 0)
        if written != len(data):
            raise NetnsError(f"short write to {path}: {written} of {len(data)} bytes")
    finally:
        os.close(fd)


# --- stale runs, leftovers -----------------------------------------------------------------------------------------


def parse_run_id(name: str, prefix: str = PREFIX) -> tuple[str, int] | None:
    """The run id and creating pid of an object named by this module ("axt1f2x0-m1" -> ("axt1f2x0", 0x1f2))."""
    match = re.match(rf"^({re.escape(prefix)}([0-9a-f]+)x[0-9]+)(?:br|v[0-9]+|-.+)$", name)
    return (match.group(1), int(match.group(2), 16)) if match else None


def leftovers(run_id: str | None = None, prefix: str = PREFIX) -> list[str]:
    """Namespaces, interfaces and /etc/netns entries made by this module: of one run, or of every run."""

    def ours(name: str) -> bool:
        parsed = parse_run_id(name, prefix)
        return parsed is not None and (run_id is None or parsed[0] == run_id)

    found = [f"netns {n}" for n in _netns_names() if ours(n)]
    found += [f"link {n}" for n in _link_names() if ours(n)]
    if NETNS_ETC.is_dir():
        found += [f"{NETNS_ETC}/{p.name}" for p in NETNS_ETC.iterdir() if ours(p.name)]
    return found


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Remove what earlier runs left behind whose process is gone (a crashed or killed test); return the names."""
    removed = []
    for netns in _netns_names():
        if _stale(netns, prefix):
            _kill_all(netns)
            _ip("netns", "del", netns, check=False)
            removed.append(f"netns {netns}")
    for link in _link_names():
        if _stale(link, prefix):
            _ip("link", "del", link, check=False)
            removed.append(f"link {link}")
    if NETNS_ETC.is_dir():
        for path in NETNS_ETC.iterdir():
            if _stale(path.name, prefix):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
        _remove_empty(NETNS_ETC)
    return removed


def _stale(name: str, prefix: str) -> bool:
    parsed = parse_run_id(name, prefix)
    return parsed is not None and not _alive(parsed[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty: /etc/netns may hold other tools' entries


# --- availability --------------------------------------------------------------------------------------------------


@functools.cache
def netns_unavailable() -> str | None:
    """Why namespaces cannot be used here (a reason for pytest.skip), or None: tries a real namespace and bridge."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth pairs, /etc/netns)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    try:
        with NamespaceNetwork(["probe"]):
            pass
    except (NetnsError, OSError, subprocess.SubprocessError) as err:
        return f"cannot create a network namespace on a bridge here: {err}"
    return None


# --- ip(8) ---------------------------------------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(
            f"ip {' '.join(args)}: {result.stderr.strip() or f'exit status {result.returncode}'}"
        )
    return result


def _netns_names() -> list[str]:
    result = _ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    result = _ip("-o", "link", "show", check=False)
    # "7: axt1f2x0v1@if2: <...>" -> "axt1f2x0v1"
    return [line.split(":")[1].strip().split("@")[0] for line in result.stdout.splitlines() if ":" in line]


def _pids(netns: str) -> list[int]:
    result = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def _kill_all(netns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process inside `netns` and wait until none is left (zombies have left the namespace)."""
    deadline = time.monotonic() + timeout
    while pids := _pids(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} still run in namespace {netns} {timeout:.0f}s after SIGKILL")
        time.sleep(0.05)


def _free_subnet(seed: int, prefix: str) -> ipaddress.IPv4Network:
    """A /24 of SUPERNET overlapping no address or route of this machine nor of a live network of this module."""
    taken: list[ipaddress.IPv4Network] = []
    for kind in ("addr", "route"):
        try:
            entries = json.loads(_ip("-j", "-4", kind, "show", check=False).stdout or "[]")
        except json.JSONDecodeError:
            entries = []
        for entry in entries:
            if kind == "addr":
                taken += [
                    ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}").network
                    for a in entry.get("addr_info", [])
                    if "local" in a
                ]
            elif entry.get("dst") == "default":
                continue
            elif "dst" in entry:
                taken.append(ipaddress.IPv4Network(entry["dst"], strict=False))
    for netns in _netns_names():
        if parse_run_id(netns, prefix):
            out = _ip("-n", netns, "-o", "-4", "addr", "show", "dev", "eth0", check=False).stdout
            taken += [ipaddress.IPv4Interface(word).network for word in out.split() if _CIDR.match(word)]
    subnets = list(SUPERNET.subnets(new_prefix=24))[1:-1]  # not .0.0/24 nor .255.0/24
    for k in range(len(subnets)):
        candidate = subnets[(seed + k) % len(subnets)]
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise NetnsError(f"every /24 of {SUPERNET} overlaps an address or route of this machine")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["list"]:
        print("\n".join(leftovers()) or "nothing")
        return 0
    if argv == ["cleanup"]:
        print("\n".join(remove_stale()) or "nothing stale")
        left = leftovers()
        if left:
            print("still there (their process runs):", ", ".join(left))
        return 0
    print("usage: python -m tests.support.netns list|cleanup", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""tests/support/netns.py: the hosts files and names it writes (pure), then real namespaces on a real bridge
(skipped, with the reason, without root or iproute2): they reach each other by name over TCP, names resolve to the
mapped addresses inside a namespace and not outside, a changed mapping reaches a process already running, and
teardown (also of a crashed earlier run) leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.support.netns import (
    NETNS_ETC,
    NamespaceNetwork,
    _rewrite_in_place,
    leftovers,
    netns_unavailable,
    parse_run_id,
    remove_stale,
    render_hosts,
)

pytest_plugins = ("tests.support.fixtures",)

# A name no resolver outside the namespaces knows (RFC 6761 reserves .invalid).
SERVICE = "apexrl-netns-test-svc.invalid"


# --- pure -----------------------------------------------------------------------------------------------------------


def test_hosts_file_keeps_localhost_and_maps_one_name_to_several_addresses():
    text = render_hosts({"m1": ["10.213.5.1"], "svc": ["10.213.5.1", "10.213.5.2"]}, "test")
    lines = [line.split("\t") for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        ["127.0.0.1", "localhost"],
        ["::1", "localhost ip6-localhost ip6-loopback"],
        ["10.213.5.1", "m1"],
        ["10.213.5.1", "svc"],
        ["10.213.5.2", "svc"],
    ]
    with pytest.raises(ValueError, match="10.213.5.300"):
        render_hosts({"m1": ["10.213.5.300"]}, "test")
    with pytest.raises(ValueError, match="no address"):
        render_hosts({"m1": []}, "test")


def test_rewriting_in_place_keeps_the_inode_and_never_shrinks(tmp_path):
    path = tmp_path / "hosts"
    _rewrite_in_place(path, "10.0.0.1\tlong-name-one\n10.0.0.2\tlong-name-two\n")
    inode, size = path.stat().st_ino, path.stat().st_size
    _rewrite_in_place(path, "10.0.0.3\tx\n")
    assert path.stat().st_ino == inode and path.stat().st_size == size  # a bind mount of it sees the change
    lines = path.read_text().splitlines()
    assert lines[0] == "10.0.0.3\tx" and set(lines[1]) == {"#"}  # the rest is one comment line


def test_run_ids_name_the_creating_process():
    assert parse_run_id("axt1f2x0-m1") == ("axt1f2x0", 0x1F2)
    assert parse_run_id("axt1f2x12br") == ("axt1f2x12", 0x1F2)
    assert parse_run_id("axt1f2x3v17") == ("axt1f2x3", 0x1F2)
    assert parse_run_id("eth0") is None and parse_run_id("axtzzx0-m1") is None
    network = NamespaceNetwork(["m1", "m2"])  # not created: names only
    assert parse_run_id(network.bridge)[1] == os.getpid()
    assert len(network.bridge) <= 15 and network.run_id != NamespaceNetwork(["m1"]).run_id
    with pytest.raises(ValueError, match="unique"):
        NamespaceNetwork(["m1", "m1"])
    with pytest.raises(ValueError, match="unique"):
        NamespaceNetwork(["bad/name"])


# --- real namespaces ------------------------------------------------------------------------------------------------


def resolve(network: NamespaceNetwork, inside: str, name: str) -> set[str]:
    """The IPv4 addresses `name` resolves to inside namespace `inside` (empty when it does not resolve)."""
    code = textwrap.dedent(f"""
        import socket
        try:
            print(" ".join(sorted({{a[4][0] for a in socket.getaddrinfo({name!r}, 80, socket.AF_INET)}})))
        except socket.gaierror:
            print("")
    """)
    out = network.run(inside, [sys.executable, "-c", code], timeout=20, check=True)
    return set(out.stdout.split())


@pytest.mark.timeout(60)
def test_two_namespaces_reach_each_other_by_name_over_tcp(netns_network):
    network = netns_network(["alpha", "beta"])
    assert network.address("alpha") != network.address("beta")
    server = network.popen(
        "beta",
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import socket
        with socket.create_server(("0.0.0.0", 5050)) as s:
            print("listening", flush=True)
            conn, peer = s.accept()
            conn.sendall(conn.recv(100).upper() + b" from " + peer[0].encode())
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout.readline().strip() == "listening"
    client = network.run(
        "alpha",
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import socket
        with socket.create_connection(("beta", 5050), timeout=10) as c:
            c.sendall(b"ping")
            print(c.recv(100).decode())
    """),
        ],
        timeout=20,
        check=True,
    )
    assert client.stdout.strip() == f"PING from {network.address('alpha')}"
    assert server.wait(10) == 0
    # Each namespace has its own loopback: beta's port 5050 is not alpha's.
    closed = network.run(
        "alpha",
        [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 5050), timeout=5)"],
    )
    assert closed.returncode != 0 and "ConnectionRefusedError" in closed.stderr


@pytest.mark.timeout(60)
def test_names_resolve_to_the_mapped_addresses_inside_and_not_outside(netns_network):
    host_file = Path("/etc/hosts").read_bytes()
    network = netns_network(["alpha", "beta", "gamma"])
    a, b, c = (network.address(n) for n in ("alpha", "beta", "gamma"))
    network.set_hosts({SERVICE: [a, b]}, only=["alpha"])

    assert resolve(network, "alpha", SERVICE) == {a, b}  # one name, several addresses (a headless Service)
    assert resolve(network, "alpha", "gamma") == {c}  # every namespace's name, by default
    assert resolve(network, "alpha", "localhost") == {"127.0.0.1"}
    assert resolve(network, "beta", SERVICE) == set()  # only alpha's hosts file has it
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(SERVICE, 80)  # nor does this machine
    assert Path("/etc/hosts").read_bytes() == host_file

    # A process already running in the namespace sees a changed mapping on its next lookup.
    watcher = network.popen(
        "alpha",
        [
            sys.executable,
            "-u",
            "-c",
            textwrap.dedent(f"""
        import socket, sys
        for _ in sys.stdin:
            print(" ".join(sorted({{a[4][0] for a in socket.getaddrinfo({SERVICE!r}, 80, socket.AF_INET)}})))
    """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        for mapping in ([a, b], [c], [a, b, c]):
            network.set_hosts({SERVICE: mapping}, only=["alpha"])
            watcher.stdin.write("\n")
            watcher.stdin.flush()
            seen.append(set(watcher.stdout.readline().split()))
        assert seen == [{a, b}, {c}, {a, b, c}]
    finally:
        watcher.kill()
        watcher.wait(10)


@pytest.mark.timeout(60)
def test_close_removes_everything_and_kills_what_still_runs_inside():
    if (reason := netns_unavailable()) is not None:
        pytest.skip(reason)
    network = NamespaceNetwork(["alpha", "beta"])
    with network:
        sleeper = network.popen("beta", ["sleep", "600"])
        # `ip netns exec` enters the namespace, then execs: the pid shows inside once it has, not at popen's return.
        wait_until(lambda: network.pids("beta") == [sleeper.pid], "the sleeper runs inside beta", timeout=30)
        made = leftovers(run_id=network.run_id)
        assert len(made) == 2 + 2 + 2 + 1, made  # 2 namespaces, 2 veths, 2 /etc/netns dirs, the bridge
    assert sleeper.wait(10) == -9
    assert leftovers(run_id=network.run_id) == []
    assert not any((NETNS_ETC / ns.netns).exists() for ns in network.namespaces.values())
    network.close()  # idempotent


@pytest.mark.timeout(60)
def test_leftovers_of_a_crashed_run_are_removed_and_a_live_run_is_kept(netns_network):
    live = netns_network(["alpha"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    crashed = f"axt{gone.pid:x}x7"  # what a killed test process would have left
    subprocess.run(["ip", "netns", "add", f"{crashed}-m1"], check=True)
    subprocess.run(["ip", "link", "add", f"{crashed}br", "type", "bridge"], check=True)
    (NETNS_ETC / f"{crashed}-m1").mkdir(parents=True)
    try:
        assert len(leftovers(run_id=crashed)) == 3
        removed = remove_stale()
        assert {f"netns {crashed}-m1", f"link {crashed}br", f"{NETNS_ETC}/{crashed}-m1"} <= set(removed)
        assert leftovers(run_id=crashed) == []
        assert len(leftovers(run_id=live.run_id)) == 4  # this process runs: its network stays
    finally:
        subprocess.run(["ip", "netns", "del", f"{crashed}-m1"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{crashed}br"], capture_output=True)
        shutil.rmtree(NETNS_ETC / f"{crashed}-m1", ignore_errors=True)

"""Podman for the container tests: one way to call it, the images scripts/build_images.sh makes, containers run as a
Kubernetes pod runs them, and cleanup of everything a test made.

Podman is Debian's 4.3, as root. Every call gets CONTAINERS_CONF, a containers.conf of the tests' own: the runc
runtime (crun fails on this machine's hybrid cgroups) and explicit nofile/nproc ulimits (the default ones fail
with "setrlimit: Operation not permitted"); `podman kube play`, which has no flags for either, needs it.

Containers talk over loopback only: `--network host` (127.0.0.1, ports chosen free) or, for `kube play`, pods in
network namespaces on a bridge of the test's own (kube_play.py); never podman's default 10.88 bridge.

Everything a test creates carries the label `apexrl-test-run=<pid>` (containers, pods, volumes), so `cleanup(pid)`
removes one run's objects and `remove_stale()` those of runs whose process is gone. Images stay cached (the next
run's build reuses their layers).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from apexrl.common.free_ports import pick_free_port

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "build_images.sh"
RUN_LABEL = "apexrl-test-run"
CONTAINERS_CONF = """\
# written by tests/integration/containers/engine.py
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""
# How a Kubernetes pod of the manifests runs its container (k8s/base: runAsUser/runAsGroup 10001,
# readOnlyRootFilesystem, capabilities drop ALL, allowPrivilegeEscalation false, an emptyDir at /tmp only).
# --read-only-tmpfs=false: podman would otherwise add writable tmpfs at /run, /var/tmp and /tmp by itself.
POD_LIKE = (
    "--user",
    "10001:10001",
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop",
    "all",
    "--security-opt",
    "no-new-privileges",
    "--tmpfs",
    "/tmp:rw,nosuid,nodev,size=256m,mode=1777",
)
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineError(AssertionError):
    """A podman command failed; the message holds the command and its output."""


@functools.cache
def _conf_path() -> Path:
    path = Path(f"/run/apexrl-test-containers-{os.getpid()}.conf")
    path.write_text(CONTAINERS_CONF)
    atexit.register(path.unlink, missing_ok=True)
    return path


def environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(_conf_path())}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=environment()
    )
    if check and result.returncode != 0:
        raise EngineError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}")
    return result


def unavailable() -> str | None:
    """Why containers cannot run here (a reason to skip), or None: podman installed, root, a container runs."""
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install -y podman runc catatonit mmdebstrap; scripts/setup.sh)"
    if os.geteuid() != 0:
        return "the container tests run podman as root"
    if shutil.which("runc") is None:
        return "runc is not installed (apt-get install -y runc)"
    return None


def inspect(kind: str, name: str) -> dict:
    found = json.loads(podman(kind, "inspect", name).stdout)
    return found[0] if isinstance(found, list) else found  # podman 4.3's `pod inspect` gives one object


# --- images -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    replay: str  # localhost/apexrl-replay:VERSION
    train: str  # localhost/apexrl-train:VERSION
    seconds: float  # the build script's wall time (the base image, both targets)
    log: str  # its output


def build_images(version: str, timeout: float = 1500) -> Images:
    """scripts/build_images.sh (both targets); layers and the base image are reused from earlier runs."""
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(),
    )
    seconds = time.monotonic() - started
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise EngineError(f"scripts/build_images.sh failed ({seconds:.0f} s):\n{log[-6000:]}")
    return Images(f"localhost/apexrl-replay:{version}", f"localhost/apexrl-train:{version}", seconds, log)


# --- containers -------------------------------------------------------------------------------------------------


def run_label() -> str:
    return f"{RUN_LABEL}={os.getpid()}"


@dataclass
class Container:
    name: str

    def inspect(self) -> dict:
        return inspect("container", self.name)

    def running(self) -> bool:
        return self.inspect()["State"]["Running"]

    def logs(self, tail: int = 40) -> str:
        result = podman("logs", "--tail", str(tail), self.name, check=False)
        return result.stdout + result.stderr

    def exec(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return podman("exec", self.name, *argv, timeout=timeout, check=False)

    def stop(self, grace: float) -> tuple[int, float]:
        """SIGTERM, SIGKILL after `grace` seconds, as the kubelet stops a pod: (exit status, seconds it took)."""
        started = time.monotonic()
        podman("stop", "--time", str(int(grace)), self.name, timeout=grace + 60)
        took = time.monotonic() - started
        return self.inspect()["State"]["ExitCode"], took

    def check_alive(self) -> None:
        state = self.inspect()["State"]
        if not state["Running"]:
            raise AssertionError(f"container {self.name} exited ({state['ExitCode']}):\n{self.logs()}")


def run_detached(
    image: str, name: str, argv: Sequence[str], *, options: Sequence[str] = (), network: str = "host"
) -> Container:
    """`podman run -d` under the pod-like settings (POD_LIKE), labelled for cleanup."""
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--label",
        run_label(),
        "--network",
        network,
        *POD_LIKE,
        *options,
        image,
        *argv,
    )
    return Container(name)


def run_once(
    image: str, *argv: str, entrypoint: str | None = None, options: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess:
    """`podman run --rm` of a command to completion, no network, pod-like settings."""
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman(
        "run",
        "--rm",
        "--label",
        run_label(),
        "--network",
        "none",
        *POD_LIKE,
        *extra,
        *options,
        image,
        *argv,
        timeout=timeout,
        check=False,
    )


def create_volume(name: str) -> str:
    podman("volume", "create", "--label", run_label(), name)
    return name


def cleanup(pid: int | None = None) -> list[str]:
    """Remove the containers, pods and volumes labelled with run `pid` (default: this process); their names."""
    label = f"{RUN_LABEL}={pid or os.getpid()}"
    removed = []
    for kind, listing in (
        ("pod", ["pod", "ps", "-q"]),
        ("container", ["ps", "-aq"]),
        ("volume", ["volume", "ls", "-q"]),
    ):
        names = podman(*listing, "--filter", f"label={label}", check=False).stdout.split()
        if names:
            rm = {
                "pod": ["pod", "rm", "--force", "--time", "0"],
                "container": ["rm", "--force", "--time", "0"],
                "volume": ["volume", "rm", "--force"],
            }[kind]
            podman(*rm, *names, check=False, timeout=180)
            removed += [f"{kind} {n}" for n in names]
    return removed


def remove_stale() -> list[str]:
    """Remove what earlier runs left behind whose process is gone (a crashed or killed test run)."""
    pids = set()
    for listing in (
        ["pod", "ps", "--format", "{{json .Labels}}"],
        ["ps", "-a", "--format", "{{json .Labels}}"],
        ["volume", "ls", "--format", "{{json .Labels}}"],
    ):
        for line in podman(*listing, check=False).stdout.splitlines():
            with contextlib.suppress(json.JSONDecodeError, AttributeError, ValueError):
                value = (json.loads(line) or {}).get(RUN_LABEL)
                if value:
                    pids.add(int(value))
    removed = []
    for pid in sorted(pids):
        if not _alive(pid):
            removed += cleanup(pid)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- talking to them --------------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now, below the ephemeral range (common/free_ports.py: no
    connecting socket takes them in the seconds before a container binds them)."""
    ports: list[int] = []
    while len(ports) < count:
        port = pick_free_port("127.0.0.1")
        if port not in ports:
            ports.append(port)
    return ports


def http_get(url: str, timeout: float = 5.0) -> str:
    with _NO_PROXY.open(url, timeout=timeout) as answer:
        return answer.read().decode()


def wait_until(condition, what: str, timeout: float, *, check=None, interval: float = 0.25):
    """Poll `condition` until it returns a true value (returned); `check()` runs each round and may raise (a
    container that died); AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if check is not None:
            check()
        try:
            value = condition()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - a server not up yet answers with all sorts of errors
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f" (last error: {last!r})" if last else "")
            )
        time.sleep(interval)

"""Run rendered Kubernetes manifests as real processes, one network namespace per pod: a kubelet, cluster DNS and
kube-proxy in miniature, for tests/integration/deploy/test_pod_emulation.py.

    objects = manifests.render(K8S / "overlays/small-cpu")
    with Cluster(objects, netns_network, tmp_path) as cluster:   # netns_network: tests/support/fixtures.py
        cluster.start()
        cluster.wait(cluster.all_ready, "every pod is Ready", timeout=120)
        ...
        cluster.terminate()                                     # SIGTERM, as `kubectl delete` does

What each piece does, and how close it is to a cluster:

- **Pods.** Every StatefulSet and Deployment gets `replicas` pods (StatefulSet pods `NAME-0 .. NAME-N-1`, with the
  `apps.kubernetes.io/pod-index` and `statefulset.kubernetes.io/pod-name` labels; a Deployment's pod
  `NAME-<pod-template-hash>-<5 random>`). Each pod is a network namespace on one bridge with its own address
  (`status.podIP`); the test process, on the bridge too, plays the node (probes come from it, as the kubelet's do).
- **The container** runs as the kubelet starts it: the image's ENTRYPOINT/CMD, USER, WORKDIR and ENV read from the
  repository's Dockerfile (target `replay` for the `apexrl-replay` image, `train` for `apexrl-train`), overridden by
  the container's `command`/`args`, whose `$(VAR)` references are expanded exactly as Kubernetes does (`$$` escapes)
  from the container's environment: service links (`NAME_SERVICE_HOST`, ...), then `envFrom` ConfigMaps, then
  `env` (values, ConfigMap keys, the downward API: `metadata.name`, `metadata.namespace`, `metadata.uid`,
  `metadata.labels['...']`, `metadata.annotations['...']`, `spec.serviceAccountName`, `status.podIP`). That
  environment is the process's whole environment (nothing leaks in from the test). The image's install prefix
  (`/opt/apexrl`, on its PATH) is this checkout's virtual environment: the one substitution in the image's
  environment; docker/install.sh, the image's install step, is exercised by test_image_recipe.py.
- **The sandbox** (no path in any arg is rewritten): each pod process starts in a private mount and UTS namespace
  (`ip netns exec NETNS unshare --mount --uts --propagation private`, then `sandbox_main` below, as root, before it
  execs the container's command). It sets the hostname to the pod's, bind-mounts a per-pod directory over every
  volume `mountPath` (a missing mount point is created in an overlay whose upper layer is per-pod, so nothing is
  created on this machine's filesystem), remounts every other filesystem read-only when the container has
  `readOnlyRootFilesystem: true`, then drops to the container's `runAsUser`/`runAsGroup` with the pod's `fsGroup`
  and `supplementalGroups` (no capabilities, `no_new_privs` when `allowPrivilegeEscalation: false`) and chdirs to
  the image's WORKDIR. A path the manifests write outside a writable volume therefore fails as in the cluster. Host
  directories the user cannot traverse but the process needs (the Python installation under /root here) are made
  reachable inside the sandbox only (a tmpfs over the closed directory with just the needed child bound into it).
  emptyDir volumes are mode 0777 (+ fsGroup, setgid), claims from `volumeClaimTemplates` root-owned 02775 with
  group fsGroup (what fsGroup does to a fresh volume); ConfigMap volumes hold the ConfigMap's keys, read-only;
  Secret volumes hold the Secret's keys (`data` decoded, `stringData`; `items`), read-only, owned by root with
  `defaultMode` (or the item's mode) and, with an fsGroup, that group and the group read bit, as the kubelet
  sets them; a projected volume of Secrets holds each source's items (an `optional` Secret that is not there adds
  nothing). A Secret is not part of the manifests: the test adds it to the objects (a pod mounting one that is
  not there would never start: Unsupported). A mount point under a directory holding mounts of its own (`/etc`,
  where `ip netns exec` binds the pod's hosts file) keeps them: they are bound again over the overlay.
- **Cluster DNS** is each namespace's /etc/hosts (`ip netns exec` binds /etc/netns/NETNS/hosts over /etc/hosts) plus
  a kubelet-style resolv.conf (search `NS.svc.cluster.local svc.cluster.local cluster.local`, `ndots:5`, a
  nameserver that refuses, so every name not in the hosts file fails at once, as NXDOMAIN would). A pod's hosts file
  holds what the kubelet writes (its own hostname; `HOST.SUBDOMAIN.NS.svc.cluster.local` for a StatefulSet pod),
  then every Service name as the cluster DNS answers it, in the forms `NAME`, `NAME.NS`, `NAME.NS.svc`,
  `NAME.NS.svc.cluster.local`: a headless Service (clusterIP None) resolves to the addresses of the Ready pods its
  selector matches (all running pods with publishNotReadyAddresses) and not at all when none is Ready; each Ready
  StatefulSet pod of its governing Service also as `POD.SERVICE[.NS[.svc[.cluster.local]]]`; a ClusterIP Service
  resolves to its virtual IP. Pod names are not names (only the pod's own, in its own file). The files are
  rewritten whenever a pod becomes Ready or stops being Ready.
- **ClusterIP Services (kube-proxy)**: each gets its own namespace, whose address is the Service's virtual IP, running
  a TCP proxy (`proxy_main`) that forwards each Service port to `targetPort` (a number, or a containerPort by name)
  of a Ready endpoint, round-robin, and resets the connection when there is none (kube-proxy's REJECT).
- **NetworkPolicies**, as a network plugin enforces them (`plan_firewall`): each pod's namespace gets iptables
  rules (IPv4; IPv6 closed where IPv4 is isolated) from the rendered policies, evaluated by the same function as
  the offline checks (`manifests.connection_allowed`): an isolated direction drops everything but loopback,
  replies, traffic from the node (the kubelet) and each allowed (peer address, port). A ClusterIP Service's proxy
  hides the client's address from the endpoint, so the proxy applies the endpoints' ingress policies itself (it
  resets a connection no endpoint admits: a plugin would drop it). `visitors` are pods that are not the fleet's
  (Prometheus, an intruder): a namespace each, with the labels and namespace the policies match, running what
  the test runs there (`Cluster.run_in`).
- **Probes**, as the kubelet runs them, from the test process: startupProbe every periodSeconds until it passes
  (failureThreshold failures: the pod fails, where the kubelet would restart the container), then readinessProbe
  (Ready after successThreshold successes, NotReady after failureThreshold failures) and livenessProbe (a failed
  pod after failureThreshold failures) each every periodSeconds, every attempt bounded by timeoutSeconds. gRPC
  (health Check, SERVING), httpGet (200-399) and tcpSocket probes are run; the first readiness probe runs as soon
  as the startup probe passes (the kubelet waits for its next period tick).
- **Termination**: every pod is marked terminating (it leaves the Services at once), receives SIGTERM, and must exit
  within terminationGracePeriodSeconds, after which it is SIGKILLed, as by the kubelet.

Anything in a manifest this cannot emulate (another probe kind, init or sidecar containers, lifecycle hooks,
env from Secrets, other fieldRefs, hostNetwork, ...) raises `Unsupported` naming it, never silently passes. Not
emulated (listed so nobody mistakes them for tested): resource requests and limits (peak RSS is reported for
comparison), the seccomp profile, a DNS server (the DNS egress rule has nothing to reach), PID namespaces (the container's process is not PID 1), PVC
persistence across restarts, the scheduler (topology spread, PDB), restarts (a failed pod fails the test), the API
server (no KUBERNETES_SERVICE_* variables, no service-account token), image pulls (the image is this checkout),
Secret updates reaching a mounted volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.netns import NETNS_ETC, NamespaceNetwork
from tests.unit.deploy import dockerfile
from tests.unit.deploy import manifests as m

REPO = m.REPO
# Where the images install apexrl (Dockerfile: COPY --from=build-* /opt/apexrl /opt/apexrl, on PATH); emulated by
# this checkout's virtual environment.
IMAGE_PREFIX = "/opt/apexrl"
# The environment of the Dockerfile's base image (python:3.11-slim-bookworm) as far as it matters here.
BASE_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# image repository name -> Dockerfile target
IMAGE_TARGETS = {"apexrl-replay": "replay", "apexrl-train": "train"}
CLUSTER_DOMAIN = "cluster.local"
POD_INDEX_LABEL = m.POD_INDEX_LABEL
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' rand.String / SafeEncodeString alphabet
NETNS_NAME_MAX = 32  # tests/support/netns.py's limit on a namespace's name
PROBE_KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


class Unsupported(AssertionError):
    """The manifests use something this emulation does not implement; the message names it."""


class PodFailure(AssertionError):
    """A pod failed (its process exited, a startup or liveness probe gave up) or a wait timed out; the message holds
    the fleet's state and the failed pods' log tails."""


# ---------------------------------------------------------------------------------------------------------------
# Kubernetes' $(VAR) expansion (k8s.io/kubernetes third_party/forked/golang/expansion), exactly.


def expand(text: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """`$(NAME)` -> env[NAME], `$$` -> `$`, anything else literal; an undefined `$(NAME)` stays as written. Returns
    the expansion and the undefined names."""
    out, missing, checkpoint, cursor = [], [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                out.append("$")
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    out.append("$(")
                    advance = 1
                else:
                    name = rest[1:close]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(f"$({name})")
                        missing.append(name)
                    advance = close + 1
            else:
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:], missing


# ---------------------------------------------------------------------------------------------------------------
# The image, from the Dockerfile


@dataclass
class Image:
    target: str
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    workdir: str
    uid: int
    gid: int


@functools.cache
def image_of(reference: str) -> Image:
    """What the Dockerfile's target for image `reference` (REGISTRY/NAME:TAG) gives a container."""
    name = reference.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    if name not in IMAGE_TARGETS:
        raise Unsupported(
            f"image {reference}: no Dockerfile target known for {name!r} (known: {IMAGE_TARGETS})"
        )
    target = IMAGE_TARGETS[name]
    recipe = dockerfile.parse()

    def words(keyword: str) -> list[str]:
        found = recipe.effective(target, keyword)
        if found is None:
            return []
        return json.loads(found.args) if found.args.startswith("[") else ["/bin/sh", "-c", found.args]

    env = dict(BASE_IMAGE_ENV)
    for stage in recipe.chain(target):
        for instruction in stage.all("ENV"):
            for word in shlex.split(instruction.args):
                key, eq, value = word.partition("=")
                if not eq:
                    raise Unsupported(
                        f"Dockerfile:{instruction.line}: ENV {instruction.args!r} (legacy form)"
                    )
                env[key], _ = _shell_expand(value, env)
    path = env.get("PATH", "").split(":")
    if not any(p == IMAGE_PREFIX or p.startswith(IMAGE_PREFIX + "/") for p in path):
        raise Unsupported(
            f"the Dockerfile's PATH ({env.get('PATH')}) no longer names {IMAGE_PREFIX}, which this "
            f"emulation maps to {sys.prefix}"
        )
    env["PATH"] = ":".join(
        sys.prefix + p[len(IMAGE_PREFIX) :] if p == IMAGE_PREFIX or p.startswith(IMAGE_PREFIX + "/") else p
        for p in path
    )
    user = recipe.effective(target, "USER")
    uid_text, _, gid_text = (user.args if user else "0").partition(":")
    if not uid_text.isdigit() or (gid_text and not gid_text.isdigit()):
        raise Unsupported(f"Dockerfile USER {user.args!r}: only numeric uid[:gid] is emulated")
    uid = int(uid_text)
    gid = int(gid_text) if gid_text else uid
    # Docker sets HOME from the user's passwd entry (useradd --home-dir) when ENV does not.
    home = "/"
    for stage in recipe.chain(target):
        for instruction in stage.all("RUN"):
            for command in re.split(r"&&|;", instruction.args):
                tokens = shlex.split(command)
                if tokens[:1] == ["useradd"] and _flag(tokens, "--uid", "-u") == str(uid):
                    home = _flag(tokens, "--home-dir", "-d") or f"/home/{tokens[-1]}"
    env.setdefault("HOME", home)
    workdir = recipe.effective(target, "WORKDIR")
    return Image(target, words("ENTRYPOINT"), words("CMD"), env, workdir.args if workdir else "/", uid, gid)


def _flag(tokens: list[str], *names: str) -> str | None:
    for i, token in enumerate(tokens[:-1]):
        if token in names:
            return tokens[i + 1]
    return None


def _shell_expand(value: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """Dockerfile ENV's `$NAME` / `${NAME}` substitution."""
    missing: list[str] = []

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            missing.append(name)
        return env.get(name, "")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, value), missing


# ---------------------------------------------------------------------------------------------------------------
# The rendered objects -> pods and Services


@dataclass
class Service:
    name: str
    headless: bool
    ports: list[dict]
    selector: dict[str, str]
    publish_not_ready: bool
    vip: str | None = None  # ClusterIP Services: the address of their proxy's namespace
    label: str | None = None  # that namespace's name


@dataclass
class Probe:
    kind: str
    spec: dict

    def setting(self, name: str, default: int) -> int:
        return int(self.spec.get(name, default))


@dataclass
class Pod:
    name: str
    label: str  # its network namespace's name in the NamespaceNetwork
    workload: dict
    container: dict
    ordinal: int | None
    labels: dict[str, str]
    annotations: dict[str, str]
    hostname: str
    subdomain: str | None
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ip: str = ""
    directory: Path | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    started_at: float = 0.0
    started: bool = False  # startup probe passed (or none)
    ready: bool = False
    ready_after: float | None = None
    terminating: bool = False
    failure: str | None = None
    last_probe: dict[str, str] = field(default_factory=dict)
    probe_counts: dict[str, list[int]] = field(default_factory=dict)  # kind -> [passed, failed]
    exit_code: int | None = None
    stop_seconds: float | None = None
    peak_rss: int | None = None  # bytes (VmHWM), read before SIGTERM
    cpu_seconds: float | None = None

    @property
    def workload_name(self) -> str:
        return self.workload["metadata"]["name"]

    @property
    def spec(self) -> dict:
        return m.pod_spec(self.workload)

    @property
    def grace(self) -> float:
        return float(self.spec.get("terminationGracePeriodSeconds", 30))

    def port(self, port: int | str) -> int:
        """A containerPort by name, or the number itself."""
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        ports = m.Container(self.workload, self.container).ports()
        if port not in ports:
            raise Unsupported(f"pod {self.name}: no containerPort named {port!r} (has {ports})")
        return ports[port]

    def probes(self) -> dict[str, Probe]:
        return {kind: Probe(kind, self.container[kind]) for kind in PROBE_KINDS if kind in self.container}

    def memory_limit(self) -> int | None:
        limit = self.container.get("resources", {}).get("limits", {}).get("memory")
        return None if limit is None else int(m.quantity(limit))

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


def service_forms(name: str, namespace: str) -> list[str]:
    """The names a Service (or `POD.SERVICE`) answers to from a pod in `namespace`."""
    return [
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]


def _safe_encode(number: int) -> str:
    """Kubernetes' rand.SafeEncodeString of a decimal hash (what pod-template-hash looks like)."""
    return "".join(NAME_ALPHABET[int(d) % len(NAME_ALPHABET)] for d in str(number))


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def plan_pods(fleet: m.Fleet) -> list[Pod]:
    """The pods the controllers would create for every StatefulSet and Deployment, checked for what is emulated."""
    pods: list[Pod] = []
    rng = random.Random()
    for workload in fleet.workloads():
        kind, name = workload["kind"], workload["metadata"]["name"]
        template = workload["spec"]["template"]
        spec = template["spec"]
        _check_supported(fleet, workload)
        replicas = int(workload["spec"].get("replicas", 1))
        template_hash = _safe_encode(_fnv32a(json.dumps(template, sort_keys=True).encode()))
        for ordinal in range(replicas):
            labels = dict(template["metadata"].get("labels", {}))
            if kind == "StatefulSet":
                pod_name = f"{name}-{ordinal}"
                labels.update(
                    {
                        POD_NAME_LABEL: pod_name,
                        POD_INDEX_LABEL: str(ordinal),
                        "controller-revision-hash": f"{name}-{template_hash}",
                    }
                )
                hostname, subdomain = pod_name, workload["spec"].get("serviceName")
            else:
                suffix = "".join(rng.choice(NAME_ALPHABET) for _ in range(5))
                pod_name = f"{name}-{template_hash}-{suffix}"
                labels["pod-template-hash"] = template_hash
                hostname, subdomain = spec.get("hostname", pod_name[:63]), spec.get("subdomain")
            label = pod_name if len(pod_name) <= NETNS_NAME_MAX else pod_name[-NETNS_NAME_MAX:].lstrip("-._")
            pods.append(
                Pod(
                    pod_name,
                    label,
                    workload,
                    spec["containers"][0],
                    ordinal if kind == "StatefulSet" else None,
                    labels,
                    dict(template["metadata"].get("annotations", {})),
                    hostname,
                    subdomain,
                )
            )
    labels = [p.label for p in pods]
    if len(set(labels)) != len(labels):
        raise Unsupported(f"pod names do not give unique namespace names: {labels}")
    return pods


def plan_services(fleet: m.Fleet) -> list[Service]:
    services = []
    for svc in fleet.all("Service"):
        spec, name = svc["spec"], svc["metadata"]["name"]
        kind = spec.get("type", "ClusterIP")
        if kind not in ("ClusterIP", "NodePort", "LoadBalancer"):
            raise Unsupported(f"Service {name}: type {kind}")
        if not spec.get("selector"):
            raise Unsupported(f"Service {name}: no selector (manual Endpoints are not emulated)")
        for port in spec.get("ports", []):
            if port.get("protocol", "TCP") != "TCP":
                raise Unsupported(f"Service {name}: port {port} is not TCP")
        services.append(
            Service(
                name,
                spec.get("clusterIP") == "None",
                list(spec.get("ports", [])),
                dict(spec["selector"]),
                bool(spec.get("publishNotReadyAddresses", False)),
            )
        )
    return services


def _check_supported(fleet: m.Fleet, workload: dict) -> None:
    where = f"{workload['kind']} {workload['metadata']['name']}"
    spec = m.pod_spec(workload)
    problems = []
    if len(spec.get("containers", [])) != 1:
        problems.append(f"{len(spec.get('containers', []))} containers (one per pod is emulated)")
    for key in ("initContainers", "ephemeralContainers", "hostAliases", "dnsConfig", "readinessGates"):
        if spec.get(key):
            problems.append(key)
    for key in ("hostNetwork", "hostPID", "hostIPC", "setHostnameAsFQDN", "shareProcessNamespace"):
        if spec.get(key):
            problems.append(f"{key}: true")
    if spec.get("dnsPolicy", "ClusterFirst") != "ClusterFirst":
        problems.append(f"dnsPolicy {spec['dnsPolicy']}")
    pod_sc = spec.get("securityContext", {})
    for key in ("sysctls", "windowsOptions", "appArmorProfile", "seLinuxOptions"):
        if pod_sc.get(key):
            problems.append(f"securityContext.{key}")
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    for volume in spec.get("volumes", []):
        kinds = [k for k in volume if k != "name"]
        if kinds not in (["emptyDir"], ["persistentVolumeClaim"], ["configMap"], ["secret"], ["projected"]):
            problems.append(f"volume {volume['name']} of kind {kinds}")
        if "configMap" in volume and fleet.get("ConfigMap", volume["configMap"]["name"]) is None:
            problems.append(
                f"volume {volume['name']}: ConfigMap {volume['configMap']['name']} is not rendered"
            )
        sources = [list(s) for s in (volume.get("projected") or {}).get("sources", [])]
        if any(s != ["secret"] for s in sources):
            problems.append(
                f"volume {volume['name']}: projected sources {sources} (only Secrets are emulated)"
            )
        for name in m.volume_files(fleet, volume)[1] if kinds in (["secret"], ["projected"]) else []:
            problems.append(
                f"volume {volume['name']}: Secret {name} is not among the objects (the pod would "
                f"never start; the test adds the Secrets the manifests expect)"
            )
    for c in spec.get("containers", []):
        if c.get("lifecycle"):
            problems.append(f"container {c['name']}: lifecycle hooks")
        for kind in PROBE_KINDS:
            probe = c.get(kind)
            if probe is None:
                continue
            handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
            if handlers not in (["grpc"], ["httpGet"], ["tcpSocket"]):
                problems.append(f"container {c['name']}: {kind} with handler {handlers}")
            if kind != "readinessProbe" and probe.get("successThreshold", 1) != 1:
                problems.append(f"container {c['name']}: {kind}.successThreshold must be 1")
            if probe.get("httpGet", {}).get("scheme", "HTTP") != "HTTP":
                problems.append(f"container {c['name']}: {kind} over HTTPS")
        sc = c.get("securityContext", {})
        if sc.get("privileged") or sc.get("capabilities", {}).get("add"):
            problems.append(f"container {c['name']}: privileged or added capabilities")
        for key in ("procMount", "seLinuxOptions", "windowsOptions", "appArmorProfile"):
            if key in sc:
                problems.append(f"container {c['name']}: securityContext.{key}")
        for source in c.get("envFrom", []):
            if set(source) - {"configMapRef", "prefix"}:
                problems.append(f"container {c['name']}: envFrom {source}")
        for var in c.get("env", []):
            ref = var.get("valueFrom", {})
            if set(ref) - {"fieldRef", "configMapKeyRef"}:
                problems.append(f"container {c['name']}: env {var['name']} from {sorted(ref)}")
        for mount in c.get("volumeMounts", []):
            if mount["name"] not in {v["name"] for v in spec.get("volumes", [])} | claims:
                problems.append(f"container {c['name']}: mount {mount['mountPath']} names no volume")
            if mount.get("subPathExpr") or mount.get("mountPropagation"):
                problems.append(f"container {c['name']}: mount {mount['mountPath']} subPathExpr/propagation")
    if problems:
        raise Unsupported(f"{where}: not emulated: {'; '.join(problems)}")


# ---------------------------------------------------------------------------------------------------------------
# A container's environment and command line


def service_links(services: list[Service]) -> dict[str, str]:
    """The docker-links variables the kubelet gives every container (enableServiceLinks, the default), for every
    Service with a cluster IP."""
    env: dict[str, str] = {}
    for svc in services:
        if svc.headless or not svc.ports:
            continue
        prefix = svc.name.upper().replace("-", "_")
        first = svc.ports[0]
        env[f"{prefix}_SERVICE_HOST"] = svc.vip or ""
        env[f"{prefix}_SERVICE_PORT"] = str(first["port"])
        env[f"{prefix}_PORT"] = f"tcp://{svc.vip}:{first['port']}"
        for port in svc.ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
            base = f"{prefix}_PORT_{port['port']}_TCP"
            env.update(
                {
                    base: f"tcp://{svc.vip}:{port['port']}",
                    f"{base}_PROTO": "tcp",
                    f"{base}_PORT": str(port["port"]),
                    f"{base}_ADDR": svc.vip or "",
                }
            )
    return env


def field_ref(pod: Pod, path: str, namespace: str) -> str:
    """The downward API's value of `fieldPath` for `pod`; Unsupported for a path not emulated."""
    label = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if label:
        source = pod.labels if label.group(1) == "labels" else pod.annotations
        return source.get(label.group(2), "")
    values = {
        "metadata.name": pod.name,
        "metadata.namespace": namespace,
        "metadata.uid": pod.uid,
        "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default"),
        "status.podIP": pod.ip,
        "status.podIPs": pod.ip,
    }
    if path not in values:
        raise Unsupported(
            f"pod {pod.name}: fieldRef {path!r} is not emulated (emulated: {sorted(values)}, "
            f"metadata.labels['...'], metadata.annotations['...'])"
        )
    return values[path]


def container_environment(fleet: m.Fleet, pod: Pod, services: list[Service], image: Image) -> dict[str, str]:
    """The environment the kubelet gives the container, in its order of precedence: the image's ENV, HOSTNAME,
    service links, envFrom, env (each `value` expanded with what is defined before it)."""
    namespace = fleet.namespace
    c = pod.container
    links = service_links(services) if pod.spec.get("enableServiceLinks", True) else {}
    defined: dict[str, str] = {}
    for source in c.get("envFrom", []):
        ref = source["configMapRef"]
        data = fleet.config_map_data(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise Unsupported(
                f"pod {pod.name}: envFrom ConfigMap {ref['name']} is not rendered (the pod would "
                f"not start: CreateContainerConfigError)"
            )
        defined.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for var in c.get("env", []):
        if "valueFrom" not in var:
            value, missing = expand(str(var.get("value", "")), {**links, **defined})
            if missing:
                raise Unsupported(f"pod {pod.name}: env {var['name']} refers to undefined $({missing[0]})")
            defined[var["name"]] = value
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            defined[var["name"]] = field_ref(pod, ref["fieldRef"]["fieldPath"], namespace)
        else:
            key_ref = ref["configMapKeyRef"]
            data = fleet.config_map_data(key_ref["name"]) or {}
            if key_ref["key"] not in data:
                raise Unsupported(
                    f"pod {pod.name}: env {var['name']} reads missing key {key_ref['name']}/{key_ref['key']}"
                )
            defined[var["name"]] = data[key_ref["key"]]
    return {**image.env, "HOSTNAME": pod.hostname, **links, **defined}


def container_argv(pod: Pod, image: Image) -> list[str]:
    """command (else the image's ENTRYPOINT) + args (else, with no command, the image's CMD), `$(VAR)` expanded
    from the container's environment; an undefined reference fails (Kubernetes would pass it on literally)."""
    c = pod.container
    command = c.get("command") or image.entrypoint
    args = c.get("args") if "args" in c else ([] if c.get("command") else image.cmd)
    argv = []
    for word in [*command, *args]:
        value, missing = expand(str(word), pod.env)
        if missing:
            raise Unsupported(
                f"pod {pod.name}: {word!r} refers to $({missing[0]}), defined nowhere (Kubernetes "
                f"would pass it on literally)"
            )
        argv.append(value)
    if not argv:
        raise Unsupported(f"pod {pod.name}: neither the container nor the image names a command")
    return argv


def prepare(fleet: m.Fleet, pods: list[Pod], services: list[Service]) -> None:
    """Give every pod (addresses assigned) its container's environment and command line."""
    for pod in pods:
        image = image_of(pod.container["image"])
        pod.env = container_environment(fleet, pod, services, image)
        pod.argv = container_argv(pod, image)


def dry_run(objects: list[dict]) -> tuple[list[Pod], list[Service]]:
    """The pods and Services with documentation addresses (192.0.2.0/24) and their command lines, without starting
    anything: what the emulation would run, or Unsupported."""
    fleet = m.Fleet(objects)
    pods, services = plan_pods(fleet), plan_services(fleet)
    addresses = (f"192.0.2.{i}" for i in itertools.count(1))
    for pod in pods:
        pod.ip = next(addresses)
    for svc in services:
        if not svc.headless:
            svc.vip = next(addresses)
    prepare(fleet, pods, services)
    return pods, services


# ---------------------------------------------------------------------------------------------------------------
# NetworkPolicies: a CNI that enforces them, in miniature (iptables in each pod's own network namespace)


@dataclass
class Firewall:
    rules: dict[str, str]  # namespace label -> iptables-restore input
    proxy_sources: dict[str, dict[str, list[str] | None]]  # Service -> endpoint "ip:port" -> admitted sources
    isolated: dict[str, tuple[bool, bool]]  # namespace label -> (ingress, egress) isolated


def pod_endpoint(fleet: m.Fleet, pod: Pod) -> m.Endpoint:
    """A pod as the NetworkPolicies see it: its labels (the controller's too), namespace, ports and address."""
    ports = {
        p.get("name", str(p["containerPort"])): (int(p["containerPort"]), p.get("protocol", "TCP"))
        for p in pod.container.get("ports", [])
    }
    return m.Endpoint(
        m.component(pod.workload),
        fleet.namespace,
        dict(pod.labels),
        m.namespace_labels(fleet, fleet.namespace),
        ports,
        ip=pod.ip,
    )


def plan_firewall(
    fleet: m.Fleet, pods: list[Pod], services: list[Service], visitors: list[m.Endpoint], node: str
) -> Firewall:
    """The rules that make each pod's namespace admit and send exactly what the rendered NetworkPolicies allow
    (m.connection_allowed, the evaluator the offline checks use): for an isolated direction, a DROP policy, then
    loopback, replies (conntrack), traffic from the node (the kubelet's probes: NetworkPolicies cannot block a
    pod's own node) and one ACCEPT per allowed (peer address, port). A ClusterIP Service's virtual address is a proxy here, not a
    DNAT: egress to it is allowed when egress to one of its endpoints' targetPort is, ingress from it on those
    ports, and the proxy admits a client only to endpoints whose policies admit that client (proxy_sources)."""
    endpoints = {pod.label: pod_endpoint(fleet, pod) for pod in pods}
    peers = [*endpoints.values(), *visitors]
    vips = [s for s in services if not s.headless]
    rules, isolated, proxy_sources = {}, {}, {}
    for svc in vips:
        table: dict[str, list[str] | None] = {}
        for pod in pods:
            if not m.labels_match(svc.selector, pod.labels):
                continue
            me = endpoints[pod.label]
            for port in svc.ports:
                number = pod.port(port.get("targetPort", port["port"]))
                admits = (
                    None
                    if not m.isolating(fleet, me, "Ingress")
                    else [node]
                    + sorted(
                        e.ip for e in peers if e is not me and m.connection_allowed(fleet, e, me, number)
                    )
                )
                table[f"{pod.ip}:{number}"] = admits
        proxy_sources[svc.name] = table
    for label, me in [*endpoints.items(), *((v.name, v) for v in visitors)]:
        inbound = bool(m.isolating(fleet, me, "Ingress"))
        outbound = bool(m.isolating(fleet, me, "Egress"))
        isolated[label] = (inbound, outbound)
        lines = [
            "*filter",
            f":INPUT {'DROP' if inbound else 'ACCEPT'} [0:0]",
            ":FORWARD ACCEPT [0:0]",
            f":OUTPUT {'DROP' if outbound else 'ACCEPT'} [0:0]",
        ]
        if inbound:
            lines += [
                "-A INPUT -i lo -j ACCEPT",
                "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                f"-A INPUT -s {node}/32 -j ACCEPT",
            ]
            for src in peers:
                for number, protocol in sorted(set(me.ports.values())):
                    if src is not me and m.connection_allowed(fleet, src, me, number, protocol):
                        lines.append(
                            f"-A INPUT -s {src.ip}/32 -p {protocol.lower()} --dport {number} -j ACCEPT"
                        )
            for svc in vips:
                for endpoint in proxy_sources[svc.name]:
                    ip, _, number = endpoint.rpartition(":")
                    if ip == me.ip:
                        lines.append(f"-A INPUT -s {svc.vip}/32 -p tcp --dport {number} -j ACCEPT")
        if outbound:
            lines += [
                "-A OUTPUT -o lo -j ACCEPT",
                "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            ]
            for dst in peers:
                for number, protocol in sorted(set(dst.ports.values())):
                    if dst is not me and m.connection_allowed(fleet, me, dst, number, protocol):
                        lines.append(
                            f"-A OUTPUT -d {dst.ip}/32 -p {protocol.lower()} --dport {number} -j ACCEPT"
                        )
            for svc in vips:
                members = [pod for pod in pods if m.labels_match(svc.selector, pod.labels)]
                for port in svc.ports:
                    target = port.get("targetPort", port["port"])
                    if any(
                        m.connection_allowed(fleet, me, endpoints[pod.label], pod.port(target))
                        for pod in members
                    ):
                        lines.append(f"-A OUTPUT -d {svc.vip}/32 -p tcp --dport {port['port']} -j ACCEPT")
        rules[label] = "\n".join([*lines, "COMMIT", ""])
    return Firewall(rules, proxy_sources, isolated)


def apply_firewall(netns: str, rules: str) -> None:
    """Load `rules` into the namespace (IPv4), and close IPv6 wherever IPv4 is isolated (nothing here dials it)."""
    for tool, text in (("iptables-restore", rules), ("ip6tables-restore", _ipv6_rules(rules))):
        done = subprocess.run(
            ["ip", "netns", "exec", netns, tool], input=text, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise Unsupported(
                f"{tool} in {netns} failed ({done.stderr.strip()}); NetworkPolicies need iptables"
            )


def _ipv6_rules(rules: str) -> str:
    keep = [
        line
        for line in rules.splitlines()
        if line.startswith(("*", ":", "COMMIT"))
        or " -i lo " in line
        or " -o lo " in line
        or "conntrack" in line
    ]
    return "\n".join(keep) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The cluster


class Cluster:
    """The rendered objects running as pods in network namespaces (see the module docstring). `make_network` is
    the `netns_network` fixture's factory (it tears the namespaces down, killing what is left in them)."""

    def __init__(
        self,
        objects: list[dict],
        make_network: Callable[..., NamespaceNetwork],
        workdir: Path,
        *,
        log: Callable[[str], None] = print,
        visitors: Sequence[m.Endpoint] = (),
    ) -> None:
        self.fleet = m.Fleet(objects)
        self.namespace = self.fleet.namespace
        self.pods = plan_pods(self.fleet)
        self.services = plan_services(self.fleet)
        # Pods that are not the fleet's (Prometheus, an intruder): a network namespace each, with their labels and
        # namespace as the NetworkPolicies see them, running nothing until the test runs something there.
        self.visitors = {v.name: v for v in visitors}
        clash = set(self.visitors) & {p.label for p in self.pods}
        if clash:
            raise ValueError(f"visitors {sorted(clash)} have the names of pods")
        self.images = {
            pod.name: image_of(pod.container["image"]) for pod in self.pods
        }  # unknown: Unsupported
        self.workdir = workdir
        self.log = log
        self._make_network = make_network
        self.network: NamespaceNetwork | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._logs: list[Any] = []
        self._proxies: dict[str, subprocess.Popen] = {}
        self.firewall = Firewall({}, {}, {})
        self.t0 = time.monotonic()

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Create the namespaces and start every pod at once (as the controllers do, Parallel pod management), and
        the kubelet's probe loops."""
        vips = [s for s in self.services if not s.headless]
        for svc in vips:
            svc.label = f"svc-{svc.name}"[:NETNS_NAME_MAX]
        names = [p.label for p in self.pods] + [s.label for s in vips] + list(self.visitors)
        self.network = self._make_network(names, reach_from_host=True)
        for svc in vips:
            svc.vip = self.network.address(svc.label)
        for pod in self.pods:
            pod.ip = self.network.address(pod.label)
        for name, visitor in self.visitors.items():
            visitor.ip = self.network.address(name)
        self.t0 = time.monotonic()
        prepare(self.fleet, self.pods, self.services)  # every command line before any process starts
        self.firewall = plan_firewall(
            self.fleet,
            self.pods,
            self.services,
            list(self.visitors.values()),
            self.network.host_address or "",
        )
        for label, rules in self.firewall.rules.items():
            apply_firewall(self.network[label].netns, rules)
        for svc in vips:
            self._start_proxy(svc)
        self._publish()
        for pod in self.pods:
            self._start_pod(pod)
        for pod in self.pods:
            thread = threading.Thread(
                target=self._kubelet, args=(pod,), name=f"kubelet-{pod.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop the probe loops, kill whatever still runs (SIGKILL), close the log files. Idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
        for process in [p.process for p in self.pods if p.process] + list(self._proxies.values()):
            if process.poll() is None:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(15)
        for log in self._logs:
            log.close()
        self._logs.clear()

    # --- queries ----------------------------------------------------------------------------------------------------

    def pods_of(self, workload: str) -> list[Pod]:
        return [p for p in self.pods if p.workload_name == workload]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def service_port(self, service: str, port_name: str) -> int:
        return next(int(p["port"]) for p in self.service(service).ports if p.get("name") == port_name)

    def run_in(self, name: str, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run `argv` (as root, not sandboxed) in the network namespace of pod or visitor `name`: what a process
        there can reach, under that pod's NetworkPolicies."""
        assert self.network is not None
        label = self.pod(name).label if name not in self.visitors else name
        return self.network.run(
            label,
            argv,
            timeout=timeout,
            cwd=REPO,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
        )

    def all_ready(self) -> bool:
        return all(p.ready for p in self.pods)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def check(self) -> None:
        """Raise PodFailure when a pod failed: its process exited, or a startup or liveness probe gave up."""
        for pod in self.pods:
            if pod.failure is None and not pod.terminating and pod.process and pod.process.poll() is not None:
                pod.failure = f"its process exited with status {pod.process.returncode}"
        failed = [p for p in self.pods if p.failure]
        for name, proxy in self._proxies.items():
            if proxy.poll() is not None and not self._stop.is_set():
                raise PodFailure(f"the proxy of Service {name} exited ({proxy.returncode})")
        if failed:
            raise PodFailure(
                "pods failed:\n"
                + "\n".join(f"--- {p.name} ({p.ip}): {p.failure}\n{p.log_tail()}" for p in failed)
                + "\n"
                + self.report()
            )

    def wait(self, condition: Callable[[], Any], what: str, timeout: float) -> Any:
        """Poll `condition` (a falsy result or a connection error: not yet) until it holds, checking the pods all
        along; PodFailure naming `what`, the last error and the fleet's state after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last_error = None
        while True:
            self.check()
            try:
                result = condition()
                if result:
                    return result
            except (OSError, ConnectionError) as err:
                last_error = err
            except Exception as err:  # noqa: BLE001 (apexrl's errors: UnavailableError, ...; not yet)
                if not type(err).__module__.startswith("apexrl."):
                    raise
                last_error = err
            if time.monotonic() > deadline:
                raise PodFailure(
                    f"timed out after {timeout:.0f} s waiting until {what}"
                    + (f" (last error: {last_error})" if last_error else "")
                    + "\n"
                    + self.report(log_lines=6)
                )
            time.sleep(0.2)

    def report(self, log_lines: int = 0) -> str:
        """One line per pod: address, state, probes, last probe errors; then each pod's last `log_lines` log lines
        (a wait that timed out on Ready pods is explained by what they logged)."""
        lines = []
        for p in self.pods:
            state = (
                "failed: " + p.failure
                if p.failure
                else "Ready"
                if p.ready
                else "started, not Ready"
                if p.started
                else "starting"
            )
            probes = " ".join(
                f"{k.replace('Probe', '')} {v[0]}ok/{v[1]}fail" for k, v in p.probe_counts.items()
            )
            errors = "; ".join(f"{k}: {v}" for k, v in p.last_probe.items())
            lines.append(
                f"  {p.name:<34} {p.ip:<14} {state:<20} {probes}"
                + (f" [last errors: {errors}]" if errors else "")
            )
        for p in self.pods if log_lines else ():
            tail = p.log_tail().splitlines()[-log_lines:]
            lines.append(f"  --- {p.name} log:\n" + "\n".join(f"    {line[:200]}" for line in tail))
        return "pods:\n" + "\n".join(lines)

    def hosts_of(self, pod: Pod | None) -> dict[str, list[str]]:
        """Pod `pod`'s /etc/hosts: what the kubelet writes, then the cluster DNS's answers (a visitor: the
        answers only)."""
        entries: dict[str, list[str]] = {}
        if pod is not None and pod.subdomain:
            entries[f"{pod.hostname}.{pod.subdomain}.{self.namespace}.svc.{CLUSTER_DOMAIN}"] = [pod.ip]
        if pod is not None:
            entries[pod.hostname] = [pod.ip]
        for svc in self.services:
            if not svc.headless:
                for name in service_forms(svc.name, self.namespace):
                    entries[name] = [svc.vip]
                continue
            members = self._endpoints(svc, ready_only=not svc.publish_not_ready)
            if members:
                for name in service_forms(svc.name, self.namespace):
                    entries[name] = [p.ip for p in members]
            for member in members:
                if member.subdomain == svc.name:
                    for name in service_forms(f"{member.hostname}.{svc.name}", self.namespace):
                        entries[name] = [member.ip]
        return entries

    def _endpoints(self, svc: Service, ready_only: bool = True) -> list[Pod]:
        return [
            p
            for p in self.pods
            if m.labels_match(svc.selector, p.labels)
            and not p.terminating
            and p.process is not None
            and (p.ready or not ready_only)
        ]

    # --- DNS and kube-proxy ---------------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Rewrite every pod's hosts file and every proxy's endpoints after a readiness change."""
        with self._lock:
            assert self.network is not None
            resolv = (
                f"# written by tests/integration/deploy/pods.py (kubelet-style; nothing answers DNS here)\n"
                f"search {self.namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
                f"nameserver 127.0.0.1\noptions ndots:5\n"
            )
            for label, entries in [
                *((p.label, self.hosts_of(p)) for p in self.pods),
                *((name, self.hosts_of(None)) for name in self.visitors),
            ]:
                self.network.set_hosts(entries, only=[label], namespace_names=False)
                path = NETNS_ETC / self.network[label].netns / "resolv.conf"
                if not path.exists():
                    path.write_text(resolv)
            for svc in self.services:
                if svc.headless:
                    continue
                table: dict[str, Any] = {"sources": self.firewall.proxy_sources.get(svc.name, {})}
                for port in svc.ports:
                    target = port.get("targetPort", port["port"])
                    table[str(port["port"])] = [f"{p.ip}:{p.port(target)}" for p in self._endpoints(svc)]
                path = self._dir(f"svc-{svc.name}") / "endpoints.json"
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(table))
                os.replace(tmp, path)

    def _start_proxy(self, svc: Service) -> None:
        directory = self._dir(f"svc-{svc.name}")
        (directory / "endpoints.json").write_text("{}")
        log = open(directory / "proxy.log", "w")  # noqa: SIM115 (closed by close())
        self._logs.append(log)
        assert self.network is not None
        self._proxies[svc.name] = self.network.popen(
            svc.label,
            [
                sys.executable,
                "-m",
                "tests.integration.deploy.pods",
                "proxy",
                str(directory / "endpoints.json"),
                *[str(p["port"]) for p in svc.ports],
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
        )

    # --- the kubelet ------------------------------------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        path = self.workdir / "pods" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _start_pod(self, pod: Pod) -> None:
        assert self.network is not None
        pod.directory = self._dir(pod.name)
        image = self.images[pod.name]
        spec = pod.spec
        pod_sc = spec.get("securityContext", {})
        sc = {**pod_sc, **pod.container.get("securityContext", {})}
        uid = int(sc.get("runAsUser", image.uid))
        # Without runAsGroup the runtime takes the user's primary group from the image (its USER), else 0.
        gid = int(sc.get("runAsGroup", image.gid if uid == image.uid else 0))
        if uid == 0:
            if sc.get("runAsNonRoot"):
                raise Unsupported(
                    f"pod {pod.name}: runAsNonRoot with user 0: the kubelet refuses to start it"
                )
            raise Unsupported(f"pod {pod.name}: a container running as root is not emulated")
        fs_group = pod_sc.get("fsGroup")
        groups = sorted(
            {
                gid,
                *([int(fs_group)] if fs_group is not None else []),
                *[int(g) for g in pod_sc.get("supplementalGroups", [])],
            }
        )
        mounts = self._volumes(pod, fs_group)
        # The checkout itself may be closed to other users (a clone made under `mktemp -d` is mode 700): expose
        # each of its entries, so the sandbox masks a closed checkout like any other closed directory.
        needed = {
            str(Path(p).resolve())
            for p in (
                sys.executable,
                sys.base_prefix,
                sys.prefix,
                REPO,
                *(entry for entry in Path(REPO).iterdir() if entry.name != ".git"),
            )
        }
        scratch = pod.directory / "sandbox"
        scratch.mkdir(exist_ok=True)
        sandbox = {
            "pod": pod.name,
            "host_mount_namespace": os.readlink("/proc/self/ns/mnt"),
            "hostname": pod.hostname,
            "scratch": str(scratch),
            "expose": sorted(needed),
            "mounts": mounts,
            "read_only_root": bool(sc.get("readOnlyRootFilesystem", False)),
            "uid": uid,
            "gid": gid,
            "groups": groups,
            "no_new_privs": sc.get("allowPrivilegeEscalation", True) is False,
            "workdir": pod.container.get("workingDir", image.workdir),
            "argv": pod.argv,
            "env": pod.env,
        }
        spec_path = pod.directory / "sandbox.json"
        spec_path.write_text(json.dumps(sandbox, indent=1))
        pod.log_path = pod.directory / "container.log"
        log = open(pod.log_path, "w")  # noqa: SIM115 (closed by close())
        self._logs.append(log)
        pod.started_at = time.monotonic()
        pod.process = self.network.popen(
            pod.label,
            [
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                sys.executable,
                "-m",
                "tests.integration.deploy.pods",
                "sandbox",
                str(spec_path),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
        )

    def _volumes(self, pod: Pod, fs_group: Any) -> list[dict]:
        """Make each volume's directory (as the kubelet or a provisioner would) and return the container's mounts."""
        assert pod.directory is not None
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in pod.workload["spec"].get("volumeClaimTemplates", [])}
        made: dict[str, Path] = {}
        mounts = []
        for mount in pod.container.get("volumeMounts", []):
            name = mount["name"]
            if name not in made:
                path = pod.directory / "volumes" / name
                path.mkdir(parents=True, exist_ok=True)
                volume = volumes.get(name, {})
                if "configMap" in volume:
                    data = self.fleet.config_map_data(volume["configMap"]["name"]) or {}
                    items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                    for item in items:
                        (path / item["path"]).write_text(data[item["key"]])
                        os.chmod(path / item["path"], 0o644)
                    os.chmod(path, 0o755)
                elif "secret" in volume or "projected" in volume:
                    self._secret_volume(path, volume, fs_group)
                elif name in claims or "persistentVolumeClaim" in volume:
                    # A fresh volume is root's; fsGroup gives the pod's group write access (setgid).
                    os.chown(path, 0, int(fs_group) if fs_group is not None else 0)
                    os.chmod(path, 0o2775 if fs_group is not None else 0o755)
                else:  # emptyDir
                    if fs_group is not None:
                        os.chown(path, 0, int(fs_group))
                    os.chmod(path, 0o2777 if fs_group is not None else 0o777)
                made[name] = path
            source = made[name] / mount["subPath"] if mount.get("subPath") else made[name]
            source.mkdir(parents=True, exist_ok=True)
            read_only = bool(
                mount.get("readOnly") or {"configMap", "secret", "projected"} & set(volumes.get(name, {}))
            )
            mounts.append({"path": mount["mountPath"], "source": str(source), "read_only": read_only})
        return mounts

    def _secret_volume(self, path: Path, volume: dict, fs_group: Any) -> None:
        """A Secret volume's files (or a projected volume's, from its Secrets) as the kubelet writes them: root's,
        with defaultMode (or the item's mode); with an fsGroup, that group, plus the group read bit (the kubelet's
        ownership of a read-only volume). An optional Secret that is not there adds no file."""
        files = m.volume_files(self.fleet, volume)[0] or {}
        group = int(fs_group) if fs_group is not None else 0
        for relative, data in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chown(target, 0, group)
            os.chmod(target, m.file_mode(volume, relative) | (0o440 if fs_group is not None else 0))
        for directory in [path, *(d for d in path.rglob("*") if d.is_dir())]:
            os.chown(directory, 0, group)
            os.chmod(directory, 0o755 if fs_group is None else 0o2755)

    def _kubelet(self, pod: Pod) -> None:
        """The probe workers of one pod."""
        probes = pod.probes()
        for kind in probes:
            pod.probe_counts[kind] = [0, 0]
        try:
            startup = probes.get("startupProbe")
            if startup is not None:
                if self._stop.wait(startup.setting("initialDelaySeconds", 0)):
                    return
                failures = 0
                while not self._stop.is_set() and not pod.terminating:
                    if self._attempt(pod, startup):
                        break
                    failures += 1
                    if failures >= startup.setting("failureThreshold", 3):
                        pod.failure = (
                            f"startup probe failed {failures} times: {pod.last_probe.get('startupProbe')}"
                            f" (the kubelet would kill and restart the container)"
                        )
                        return
                    if self._stop.wait(startup.setting("periodSeconds", 10)):
                        return
            pod.started = True
            now = time.monotonic()
            readiness, liveness = probes.get("readinessProbe"), probes.get("livenessProbe")
            due = {}
            if readiness is not None:
                due["readinessProbe"] = max(now, pod.started_at + readiness.setting("initialDelaySeconds", 0))
            else:
                self._set_ready(pod, True)
            if liveness is not None:
                due["livenessProbe"] = max(
                    now + liveness.setting("periodSeconds", 10),
                    pod.started_at + liveness.setting("initialDelaySeconds", 0),
                )
            streak = {"readinessProbe": [0, 0], "livenessProbe": [0, 0]}  # [successes, failures] in a row
            while due and not pod.terminating:
                kind = min(due, key=due.get)
                if self._stop.wait(max(0.0, due[kind] - time.monotonic())) or pod.terminating:
                    return
                probe = probes[kind]
                ok = self._attempt(pod, probe)
                run = streak[kind]
                run[0], run[1] = (run[0] + 1, 0) if ok else (0, run[1] + 1)
                if kind == "readinessProbe":
                    if ok and run[0] >= probe.setting("successThreshold", 1):
                        self._set_ready(pod, True)
                    elif not ok and run[1] >= probe.setting("failureThreshold", 3):
                        self._set_ready(pod, False)
                elif run[1] >= probe.setting("failureThreshold", 3):
                    pod.failure = (
                        f"liveness probe failed {run[1]} times in a row: "
                        f"{pod.last_probe.get('livenessProbe')} (the kubelet would restart it)"
                    )
                    self._set_ready(pod, False)
                    return
                due[kind] += probe.setting("periodSeconds", 10)
        except Exception as err:  # noqa: BLE001 (a bug here must fail the test, not hang it)
            pod.failure = f"the emulated kubelet failed: {type(err).__name__}: {err}"

    def _attempt(self, pod: Pod, probe: Probe) -> bool:
        ok, detail = run_probe(pod, probe)
        pod.probe_counts[probe.kind][0 if ok else 1] += 1
        if ok:
            pod.last_probe.pop(probe.kind, None)
        else:
            pod.last_probe[probe.kind] = detail
        return ok

    def _set_ready(self, pod: Pod, ready: bool) -> None:
        if pod.ready == ready or pod.terminating:
            return
        with self._lock:
            pod.ready = ready
            if ready and pod.ready_after is None:
                pod.ready_after = time.monotonic() - pod.started_at
            self.log(f"[{self.elapsed():6.1f}s] {pod.name} ({pod.ip}) is {'Ready' if ready else 'not Ready'}")
            self._publish()

    # --- termination ------------------------------------------------------------------------------------------------

    def terminate(self) -> dict[str, tuple[int | None, float]]:
        """Delete every pod as the kubelet does: out of the Services, SIGTERM, SIGKILL after
        terminationGracePeriodSeconds. Returns pod -> (exit status or None when killed, seconds to exit)."""
        self.check()
        for pod in self.pods:
            pod.peak_rss, pod.cpu_seconds = _usage(pod.process.pid) if pod.process else (None, None)
        with self._lock:
            for pod in self.pods:
                pod.terminating = True
                pod.ready = False
            self._publish()
        self._stop.set()
        started = time.monotonic()
        for pod in self.pods:
            if pod.process and pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        pending = [pod for pod in self.pods if pod.process is not None]
        while pending:
            for pod in list(pending):
                assert pod.process is not None
                now = time.monotonic()
                if pod.process.poll() is not None:
                    pod.exit_code = pod.process.returncode
                elif now > started + pod.grace:
                    pod.process.kill()  # the kubelet's SIGKILL after the grace period
                    pod.process.wait(15)
                    pod.exit_code = None
                else:
                    continue
                pod.stop_seconds = now - started
                pending.remove(pod)
            time.sleep(0.05)
        results = {pod.name: (pod.exit_code, pod.stop_seconds or 0.0) for pod in self.pods}
        for proxy in self._proxies.values():
            proxy.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proxy.wait(10)
        return results


def inspect_process(pid: int) -> dict[str, Any]:
    """What a running pod process is, seen from outside: its user, groups, capabilities, no_new_privs, hostname
    (its UTS namespace) and the mount points it can write to (kernel filesystems aside)."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    writable = set()
    for point, options in _mountinfo(Path(f"/proc/{pid}/mountinfo"), with_options=True):
        if "rw" in options.split(",") and not any(_under(point, top) for top in KERNEL_FILESYSTEMS):
            writable.add(point)
        else:
            writable.discard(point)  # a later mount on the same point covers the earlier one
    hostname = subprocess.run(
        ["nsenter", "--target", str(pid), "--uts", "hostname"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    return {
        "uids": {int(x) for x in status["Uid"].split()},
        "gids": {int(x) for x in status["Gid"].split()},
        "groups": sorted(int(x) for x in status["Groups"].split()),
        "cap_eff": int(status["CapEff"].strip(), 16),
        "no_new_privs": status.get("NoNewPrivs", "0").strip() == "1",
        "hostname": hostname,
        "writable": sorted(writable),
    }


def _usage(pid: int) -> tuple[int | None, float | None]:
    """Peak resident set (VmHWM, bytes) and CPU seconds of a running process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None, None
    hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(hwm.group(1)) * 1024 if hwm else None), (int(fields[11]) + int(fields[12])) / ticks


# ---------------------------------------------------------------------------------------------------------------
# Probes, as the kubelet runs them (from the node: here the test process on the bridge)

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def run_probe(pod: Pod, probe: Probe) -> tuple[bool, str]:
    timeout = probe.setting("timeoutSeconds", 1)
    spec = probe.spec
    try:
        if "grpc" in spec:
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            port = int(spec["grpc"]["port"])
            with grpc.insecure_channel(f"{pod.ip}:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=spec["grpc"].get("service", "")), timeout=timeout
                )
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return status == "SERVING", f"grpc :{port} {status}"
        if "httpGet" in spec:
            http = spec["httpGet"]
            port = pod.port(http["port"])
            url = f"http://{http.get('host', pod.ip)}:{port}{http.get('path', '/')}"
            headers = {h["name"]: h["value"] for h in http.get("httpHeaders", [])}
            with _NO_PROXY.open(urllib.request.Request(url, headers=headers), timeout=timeout) as answer:
                return 200 <= answer.status < 400, f"GET {url}: {answer.status}"
        port = pod.port(spec["tcpSocket"]["port"])
        with socket.create_connection((spec["tcpSocket"].get("host", pod.ip), port), timeout=timeout):
            return True, f"tcp :{port} open"
    except Exception as err:  # noqa: BLE001 (any failure is a failed probe, with what it was)
        text = getattr(err, "details", lambda: None)() if hasattr(err, "details") else None
        return False, f"{type(err).__name__}: {text or err}"[:300]


def scrape(address: str, port: int, timeout: float = 5.0) -> dict[str, float]:
    """GET http://ADDRESS:PORT/metrics; every sample's value summed over its labels, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    with _NO_PROXY.open(f"http://{address}:{port}/metrics", timeout=timeout) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


# ---------------------------------------------------------------------------------------------------------------
# Inside a pod: the sandbox (root, in the pod's own mount and UTS namespaces), then the container's command

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_NO_NEW_PRIVS = 38
KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
KERNEL_FILESYSTEMS = ("/proc", "/sys", "/dev")  # left as they are (a container has its own, not read-only)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    if _libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(
            errno, f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r}): {os.strerror(errno)}"
        )


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _mountinfo(
    path: Path = Path("/proc/self/mountinfo"), with_options: bool = False
) -> list[tuple[str, Any]]:
    """(mount point, per-mount flags to keep, or the per-mount options text) of every mount, in mountinfo's order."""
    result: list[tuple[str, Any]] = []
    for line in path.read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda x: chr(int(x.group(1), 8)), fields[4])
        if with_options:
            result.append((point, fields[5]))
            continue
        flags = 0
        for option in fields[5].split(","):
            flags |= KEEP_FLAGS.get(option, 0)
        result.append((point, flags))
    return result


def _expose(target: str, scratch: str, masked: dict[str, str]) -> None:
    """Make `target` reachable for a non-root user: each closed directory on its way (no search permission for
    others) is covered by a tmpfs holding only the needed child, bound from the original (kept under scratch)."""
    current = "/"
    for part in Path(target).parts[1:]:
        child = os.path.join(current, part)
        if current in masked or (current != "/" and not os.stat(current).st_mode & stat.S_IXOTH):
            if current not in masked:
                original = os.path.join(scratch, f"expose{len(masked)}")
                os.makedirs(original)
                _mount(current, original, None, MS_BIND | MS_REC)
                _mount("tmpfs", current, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
                masked[current] = original
            if not os.path.lexists(child):
                origin = os.path.join(masked[current], part)
                if os.path.islink(origin):
                    os.symlink(os.readlink(origin), child)
                elif os.path.isdir(origin):
                    os.mkdir(child)
                    _mount(origin, child, None, MS_BIND | MS_REC)
                else:
                    Path(child).touch()
                    _mount(origin, child, None, MS_BIND)
        current = child


def sandbox_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if os.readlink("/proc/self/ns/mnt") == spec["host_mount_namespace"]:
        raise SystemExit("pod sandbox: not in a mount namespace of its own; refusing to mount anything")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted below propagates anywhere
    socket.sethostname(spec["hostname"])
    scratch = spec["scratch"]
    # Volume sources stay reachable through descriptors once a volume covers the directory they live in.
    sources = {mt["source"]: os.open(mt["source"], os.O_PATH) for mt in spec["mounts"]}
    masked: dict[str, str] = {}
    for path in spec["expose"]:
        _expose(path, scratch, masked)
    # What the process needs and a volume will cover (a checkout under /tmp, where pods mount an emptyDir): kept
    # through a descriptor and bound again at the same path inside the volume, read-only.
    volume_points = [mt["path"] for mt in spec["mounts"]]
    covered: dict[str, int] = {}
    for path in spec["expose"]:
        for point in volume_points:
            if _under(path, point) and path != point:
                top = os.path.join(point, os.path.relpath(path, point).split(os.sep)[0])
                if top not in covered:
                    covered[top] = os.open(top, os.O_PATH)
    # Mount points the filesystem lacks: created in an overlay over their nearest existing ancestor, whose upper
    # layer is this pod's (a container runtime creates them in the container's writable layer).
    volume_paths = [mt["path"] for mt in spec["mounts"]]
    overlaid: list[str] = []
    for path in sorted(volume_paths):
        if os.path.lexists(path) or any(_under(path, v) and v != path for v in volume_paths):
            continue
        ancestor = os.path.dirname(path)
        while not os.path.lexists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if ancestor == "/":
            raise SystemExit(
                f"pod sandbox: cannot create mount point {path}: its nearest existing ancestor is /"
            )
        if not any(_under(ancestor, o) for o in overlaid):
            layer = os.path.join(scratch, f"overlay{len(overlaid)}")
            os.makedirs(f"{layer}/upper")
            os.makedirs(f"{layer}/work")
            # Mounts below the ancestor (the hosts file `ip netns exec` binds over /etc/hosts) would be hidden by
            # the overlay, which shows the ancestor's own filesystem only: keep them, and bind them again on top.
            inner = [
                (point, os.open(point, os.O_PATH))
                for point, _ in _mountinfo()
                if _under(point, ancestor) and point != ancestor and os.path.lexists(point)
            ]
            _mount(
                "overlay",
                ancestor,
                "overlay",
                0,
                f"lowerdir={ancestor},upperdir={layer}/upper,workdir={layer}/work",
            )
            for point, fd in inner:
                _mount(f"/proc/self/fd/{fd}", point, None, MS_BIND)
                os.close(fd)
            overlaid.append(ancestor)
        os.makedirs(path)
    if spec["read_only_root"]:
        for point, flags in dict(_mountinfo()).items():
            if not any(_under(point, top) for top in KERNEL_FILESYSTEMS) and os.path.lexists(point):
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    for mt in sorted(spec["mounts"], key=lambda x: x["path"]):
        if not os.path.lexists(mt["path"]):
            os.makedirs(mt["path"])  # inside a volume mounted above
        _mount(f"/proc/self/fd/{sources[mt['source']]}", mt["path"], None, MS_BIND)
        _mount(
            None,
            mt["path"],
            None,
            MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if mt["read_only"] else 0),
        )
    for top, fd in sorted(covered.items()):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(top, exist_ok=True)
        else:
            Path(top).touch()
        _mount(f"/proc/self/fd/{fd}", top, None, MS_BIND | MS_REC)
        _mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for fd in sources.values():
        os.close(fd)
    os.setgroups(spec["groups"])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    if spec["no_new_privs"] and _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit("pod sandbox: prctl(PR_SET_NO_NEW_PRIVS) failed")
    os.chdir(spec["workdir"])
    argv, env = spec["argv"], spec["env"]
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if program is None:
        raise SystemExit(
            f'pod sandbox: exec: "{argv[0]}": executable file not found in $PATH ({env.get("PATH")})'
        )
    sys.stdout.flush()
    os.execve(program, argv, env)


# ---------------------------------------------------------------------------------------------------------------
# A ClusterIP Service's virtual IP: kube-proxy in miniature, in the Service's own namespace


def proxy_main(endpoints_path: str, ports: list[int]) -> None:
    state: dict[str, Any] = {"stamp": None, "table": {}}
    turn = itertools.count()

    def endpoints(port: int) -> list[str]:
        st = os.stat(endpoints_path)
        if (st.st_ino, st.st_mtime_ns) != state["stamp"]:
            state["table"] = json.loads(Path(endpoints_path).read_text() or "{}")
            state["stamp"] = (st.st_ino, st.st_mtime_ns)
        return state["table"].get(str(port), [])

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.transport.abort()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        ready = endpoints(port)
        if not ready:
            writer.transport.abort()  # no Ready endpoint: kube-proxy rejects the connection
            return
        # The NetworkPolicies of the endpoint pods (the CNI sees the client's address; a userspace proxy hides it,
        # so the proxy applies them: only endpoints that admit this client).
        client = writer.get_extra_info("peername")[0]
        sources = state["table"].get("sources", {})
        ready = [e for e in ready if sources.get(e) is None or client in sources[e]]
        if not ready:
            writer.transport.abort()
            return
        host, _, target = ready[next(turn) % len(ready)].rpartition(":")
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(target))
        except OSError:
            writer.transport.abort()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        upstream_writer.close()
        writer.close()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        servers = [await asyncio.start_server(lambda r, w, p=p: handle(r, w, p), "0.0.0.0", p) for p in ports]
        print(f"proxy: listening on {ports}, endpoints from {endpoints_path}", flush=True)
        await stop.wait()
        for server in servers:
            server.close()

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1:2] == ["sandbox"]:
        try:
            sandbox_main(sys.argv[2])
        except OSError as err:
            raise SystemExit(f"pod sandbox: {err}") from None
    elif sys.argv[1:2] == ["proxy"]:
        proxy_main(sys.argv[2], [int(p) for p in sys.argv[3:]])
    else:
        raise SystemExit(
            "usage: python -m tests.integration.deploy.pods sandbox SPEC.json | proxy ENDPOINTS PORT..."
        )

"""Render the kustomize targets under k8s/ and check that the rendered objects line up with each other and with
the code: names, ports, selectors, probe ports, config keys, flags, security settings.

Each `check_*` function returns a list of problems (empty when the fleet is right), so the tests can both assert
that the committed manifests have none and that a broken copy of them is caught (test_manifests.py does both).

Secrets are not part of the manifests (cert-manager or `kubectl create secret` makes them): a test adds the
Secret objects a target mounts (tests/unit/deploy/fleet_secrets.py makes them as the guide does) to the rendered
objects, and the checks project each Secret volume (a `secret` volume, or a `projected` one of Secrets) into a
local directory, as the kubelet would, so that the flags naming files in it parse with real files.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import io
import ipaddress
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "k8s"
# Every kustomize target a user can apply (the base renders too, without namespace or registry).
TARGETS = {
    "base": Path("base"),
    "small-cpu": Path("overlays/small-cpu"),
    "production": Path("overlays/production"),
    "small-cpu-tls": Path("overlays/small-cpu-tls"),
    "continuous-cpu": Path("overlays/continuous-cpu"),
    "recurrent-cpu": Path("overlays/recurrent-cpu"),
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# The label every fleet pod carries (k8s/base/kustomization.yaml); the NetworkPolicy admits exactly these pods.
FLEET_LABEL = ("app.kubernetes.io/part-of", "apexrl")
# The downward-API label a StatefulSet gives each pod: its ordinal (Kubernetes >= 1.28).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
CUSTOM_API_GROUPS = ("monitoring.coreos.com/",)
# The containerPort name of a server's plaintext health port (--health-port): for the kubelet's probes only.
HEALTH_PORT = "health"
TLS_FILES = ("tls_cert", "tls_key", "tls_ca")
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubectl_missing() -> str | None:
    return (
        None if shutil.which("kubectl") else "kubectl is not installed (needed to render k8s/ with kustomize)"
    )


def render(root: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize ROOT` (offline), as a list of objects."""
    result = subprocess.run(["kubectl", "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {root} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kind_counts(objects: list[dict]) -> dict[str, int]:
    return dict(sorted(Counter(o["kind"] for o in objects).items()))


# ---------------------------------------------------------------------------------------------------------------
# The rendered fleet


@dataclass
class Container:
    workload: dict
    spec: dict

    @property
    def name(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}/{self.spec['name']}"

    def ports(self) -> dict[str, int]:
        """containerPort by name."""
        return {p["name"]: p["containerPort"] for p in self.spec.get("ports", []) if "name" in p}

    def port_numbers(self) -> set[int]:
        return {p["containerPort"] for p in self.spec.get("ports", [])}


@dataclass
class Fleet:
    objects: list[dict]
    by_kind: dict[str, list[dict]] = field(default_factory=dict)
    # Secret volumes projected into local directories (see secret_volume_directory): the directories, and each
    # one's mountPath in its container.
    _projected: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    _mounted_at: dict[str, str] = field(default_factory=dict, repr=False)
    # What the checks derive from the objects more than once (parsed command lines, dialled connections).
    _derived: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for obj in self.objects:
            self.by_kind.setdefault(obj["kind"], []).append(obj)

    def secret_volume_directory(self, c: Container, mount: dict) -> Path | None:
        """A local directory holding the files the kubelet would put in the Secret volume `mount` of container
        `c` (its keys, or its `items`; a projected volume's sources together), or None when a Secret it needs is
        not among the objects."""
        volume = next(v for v in pod_spec(c.workload).get("volumes", []) if v["name"] == mount["name"])
        files, _ = volume_files(self, volume)
        if files is None:
            return None
        if self._projected is None:
            self._projected = tempfile.TemporaryDirectory(prefix="apexrl-secrets-")
        directory = (
            Path(self._projected.name) / c.workload["kind"] / c.workload["metadata"]["name"] / mount["name"]
        )
        if not directory.exists():
            for relative, data in files.items():
                (directory / relative).parent.mkdir(parents=True, exist_ok=True)
                (directory / relative).write_bytes(data)
        self._mounted_at[str(directory)] = mount["mountPath"]
        return directory

    def original_path(self, path: str) -> str:
        """A path as the container sees it: a projected Secret volume's directory back to its mountPath."""
        for directory, mount_path in self._mounted_at.items():
            if path == directory or path.startswith(directory + "/"):
                return mount_path.rstrip("/") + path[len(directory) :]
        return path

    def original_path_in(self, text: str) -> str:
        """`text` (an error message) with every projected directory named by its mountPath."""
        for directory, mount_path in self._mounted_at.items():
            text = text.replace(directory, mount_path.rstrip("/"))
        return text

    def all(self, kind: str) -> list[dict]:
        return self.by_kind.get(kind, [])

    def get(self, kind: str, name: str) -> dict | None:
        return next((o for o in self.all(kind) if o["metadata"]["name"] == name), None)

    @property
    def namespace(self) -> str:
        spaces = {o["metadata"].get("namespace") for o in self.objects if o["kind"] != "Namespace"}
        return spaces.pop() if len(spaces) == 1 and None not in spaces else "default"

    def workloads(self) -> list[dict]:
        return [w for kind in WORKLOAD_KINDS for w in self.all(kind)]

    def containers(self) -> Iterator[Container]:
        for w in self.workloads():
            for c in pod_spec(w).get("containers", []):
                yield Container(w, c)

    def selected(self, selector: dict[str, str]) -> list[dict]:
        """Workloads whose pods carry every label of `selector` (an empty selector selects none here)."""
        return [w for w in self.workloads() if selector and labels_match(selector, pod_labels(w))]

    def config_map_data(self, name: str) -> dict[str, str] | None:
        cm = self.get("ConfigMap", name)
        return None if cm is None else dict(cm.get("data", {}))


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def secret_volume_files(fleet: Fleet, source: dict) -> dict[str, bytes] | None:
    """The files (path in the volume -> bytes) of a `secret` volume source (or a projected volume's `secret`
    source, which names its Secret by `name`), from the Secret among the objects (`data` base64-decoded,
    `stringData`); None when it is not there."""
    secret = fleet.get("Secret", source.get("secretName", source.get("name", "")))
    if secret is None:
        return None
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def secret_sources(volume: dict) -> list[tuple[str, dict]]:
    """(Secret name, its source) of every Secret a `secret` or `projected` volume holds."""
    if "secret" in volume:
        return [(volume["secret"].get("secretName", ""), volume["secret"])]
    return [
        (s["secret"].get("name", ""), s["secret"])
        for s in (volume.get("projected") or {}).get("sources", [])
        if "secret" in s
    ]


def volume_files(fleet: Fleet, volume: dict) -> tuple[dict[str, bytes] | None, list[str]]:
    """The files of a `secret` or `projected` (Secrets only) volume as the kubelet writes them, and the Secrets
    it needs that are not among the objects (then None: the pod would not start). An `optional` Secret that is
    not there adds nothing."""
    files: dict[str, bytes] = {}
    missing = []
    for name, source in secret_sources(volume):
        found = secret_volume_files(fleet, source)
        if found is None:
            if not source.get("optional"):
                missing.append(name)
            continue
        files.update(found)
    return (None if missing else files), missing


def file_mode(volume: dict, relative: str) -> int:
    """The mode the kubelet gives file `relative` of a `secret` or `projected` volume (an item's mode, else the
    volume's defaultMode, else 0644)."""
    source = volume.get("secret") or volume.get("projected") or {}
    for _, src in secret_sources(volume):
        for item in src.get("items") or []:
            if item["path"] == relative and "mode" in item:
                return item["mode"]
    return source.get("defaultMode", 0o644)


def tls_secret(name: str, namespace: str, cert: bytes, key: bytes, ca: bytes) -> dict:
    """The Secret `kubectl create secret tls` (plus ca.crt) or cert-manager would make: type kubernetes.io/tls."""
    data = {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def secret_mounts(c: Container) -> list[dict]:
    """The container's mounts of `secret` volumes and of `projected` volumes of Secrets."""
    secrets = {v["name"] for v in pod_spec(c.workload).get("volumes", []) if secret_sources(v)}
    return [mt for mt in c.spec.get("volumeMounts", []) if mt["name"] in secrets]


def pod_labels(workload: dict) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def component(workload: dict) -> str:
    return pod_labels(workload).get("app.kubernetes.io/component", "?")


def ordinals(workload: dict) -> list[int]:
    """The pod ordinals whose environment differs (StatefulSets: the first and last), or [0]."""
    if workload["kind"] != "StatefulSet":
        return [0]
    replicas = workload["spec"].get("replicas", 1)
    return sorted({0, max(0, replicas - 1)})


def container_env(fleet: Fleet, c: Container, ordinal: int) -> tuple[dict[str, str], list[str]]:
    """The environment Kubernetes gives container `c` (pod number `ordinal`), and the problems found making it."""
    env: dict[str, str] = {}
    problems: list[str] = []
    for source in c.spec.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            problems.append(f"{c.name}: envFrom other than configMapRef: {source}")
            continue
        data = fleet.config_map_data(ref["name"])
        if data is None:
            problems.append(f"{c.name}: envFrom names ConfigMap {ref['name']!r}, which is not rendered")
            continue
        env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    labels = pod_labels(c.workload)
    for var in c.spec.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var.get("valueFrom", {})
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
            if path == "metadata.namespace":
                env[var["name"]] = fleet.namespace
            elif path == "metadata.name":
                env[var["name"]] = f"{c.workload['metadata']['name']}-{ordinal}"
            elif label and label.group(1) == POD_INDEX_LABEL:
                if c.workload["kind"] != "StatefulSet":
                    problems.append(
                        f"{c.name}: {var['name']} reads {POD_INDEX_LABEL}, which only StatefulSet pods carry"
                    )
                env[var["name"]] = str(ordinal)
            elif label and label.group(1) in labels:
                env[var["name"]] = labels[label.group(1)]
            else:
                problems.append(f"{c.name}: {var['name']} reads {path}, which these checks cannot resolve")
        elif "configMapKeyRef" in ref:
            key_ref = ref["configMapKeyRef"]
            data = fleet.config_map_data(key_ref["name"]) or {}
            if key_ref["key"] not in data:
                problems.append(
                    f"{c.name}: {var['name']} reads missing ConfigMap key {key_ref['name']}/{key_ref['key']}"
                )
            env[var["name"]] = data.get(key_ref["key"], "")
        else:
            problems.append(f"{c.name}: {var['name']} has a source these checks do not know: {ref}")
    return env, problems


def expand(text: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """Kubernetes' `$(VAR)` expansion of an arg; the names it could not resolve (left as written, like Kubernetes)."""
    missing = [m for m in VAR.findall(text) if m not in env]
    return VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text), missing


def container_argv(fleet: Fleet, c: Container, ordinal: int) -> tuple[list[str], list[str]]:
    """The argv after the image's entry point (`apexrl`), as Kubernetes expands it."""
    env, problems = container_env(fleet, c, ordinal)
    argv = []
    for arg in [*c.spec.get("command", []), *c.spec.get("args", [])]:
        value, missing = expand(str(arg), env)
        problems += [
            f"{c.name}: arg {arg!r} uses $({m}), defined by neither env nor envFrom" for m in missing
        ]
        argv.append(value)
    return argv, problems


@dataclass
class Parsed:
    subcommand: str
    config: Any  # paths in a Secret volume point into its local projection (Fleet.original_path undoes that)


def parse_apexrl(argv: list[str]) -> tuple[Parsed | None, str | None]:
    """Parse `apexrl ARGV` exactly as the entry point does (launcher/cli.py: its parser, then the role's settings
    dataclass with its validation); (parsed, None) or (None, the error apexrl would print)."""
    from apexrl.common.settings import SettingsError, from_namespace
    from apexrl.launcher import cli

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = cli.build_parser().parse_args(argv)
    except SystemExit:
        return None, stderr.getvalue().strip().splitlines()[-1]
    module = importlib.import_module(cli.SUBCOMMANDS[args.command])
    if not hasattr(module, "CONFIG"):
        return Parsed(args.command, args), None
    try:
        return Parsed(args.command, from_namespace(module.CONFIG, args)), None
    except SettingsError as err:
        return None, str(err)


def project_secrets(fleet: Fleet, c: Container, argv: list[str]) -> tuple[list[str], list[str]]:
    """`argv` with every path inside a mounted Secret volume pointing into its local projection (so that files
    the flags name are read as the container would read them), and the problems (a Secret not among the
    objects)."""
    problems, prefixes = [], {}
    for mount in secret_mounts(c):
        directory = fleet.secret_volume_directory(c, mount)
        if directory is None:
            volume = next(v for v in pod_spec(c.workload)["volumes"] if v["name"] == mount["name"])
            for name in volume_files(fleet, volume)[1]:
                problems.append(
                    f"{c.name}: volume {mount['name']} mounts Secret {name!r}, which is not among the "
                    f"objects (it is made outside the manifests; the checks need one to read the files "
                    f"the flags name)"
                )
            continue
        prefixes[mount["mountPath"].rstrip("/")] = str(directory)
    projected = []
    for arg in argv:
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        for prefix, local in prefixes.items():
            if value == prefix or value.startswith(prefix + "/"):
                value = local + value[len(prefix) :]
        projected.append(f"{flag}{eq}{value}")
    return projected, problems


def parsed_containers(fleet: Fleet) -> tuple[list[tuple[Container, int, Parsed]], list[str]]:
    """Every container's command line, expanded and parsed, for each pod ordinal that matters (once per Fleet:
    the checks do not change the objects)."""
    if "parsed" not in fleet._derived:
        fleet._derived["parsed"] = _parse_containers(fleet)
    parsed, problems = fleet._derived["parsed"]
    return list(parsed), list(problems)


def _parse_containers(fleet: Fleet) -> tuple[list[tuple[Container, int, Parsed]], list[str]]:
    result, problems = [], []
    for c in fleet.containers():
        if c.spec.get("command"):
            problems.append(f"{c.name}: sets command; the image's entry point (apexrl) is what must run")
        for ordinal in ordinals(c.workload):
            argv, found = container_argv(fleet, c, ordinal)
            problems += found
            projected, found = project_secrets(fleet, c, argv)
            problems += found if ordinal == ordinals(c.workload)[0] else []
            parsed, error = parse_apexrl(projected)
            if error:
                problems.append(
                    f"{c.name} (pod {ordinal}): `apexrl {' '.join(argv)}` is refused: "
                    f"{fleet.original_path_in(error)}"
                )
            else:
                result.append((c, ordinal, parsed))
    return result, problems


# ---------------------------------------------------------------------------------------------------------------
# Addresses in args -> Services


def service_port_target(fleet: Fleet, service: dict, port: int) -> tuple[list[dict], int | None, str | None]:
    """The workloads a Service port reaches and the containerPort number it lands on (None, why: when it does not)."""
    entry = next((p for p in service["spec"].get("ports", []) if p["port"] == port), None)
    name = service["metadata"]["name"]
    if entry is None:
        return [], None, f"Service {name} has no port {port}"
    selected = fleet.selected(service["spec"].get("selector", {}))
    if not selected:
        return [], None, f"Service {name} selects no workload"
    target = entry.get("targetPort", entry["port"])
    numbers = set()
    for w in selected:
        for c in pod_spec(w)["containers"]:
            found = (
                Container(w, c).ports().get(target)
                if isinstance(target, str)
                else (target if target in Container(w, c).port_numbers() else None)
            )
            if found is not None:
                numbers.add(found)
    if len(numbers) != 1:
        return selected, None, f"Service {name} port {port} -> targetPort {target!r}: no single containerPort"
    return selected, numbers.pop(), None


def resolve_address(
    fleet: Fleet, address: str, where: str
) -> tuple[list[dict], int | None, dict | None, list[str]]:
    """Follow `[dns:///]NAME[.NAMESPACE[.svc.cluster.local]]:PORT` to a Service, the workloads behind it and the
    containerPort the connection lands on."""
    dns = address.startswith("dns:")
    rest = re.sub(r"^dns:(///)?", "", address)
    host, _, port_text = rest.rpartition(":")
    if not host or not port_text.isdigit():
        return [], None, None, [f"{where}: address {address!r} is not HOST:PORT"]
    parts = host.split(".")
    name, namespace = parts[0], parts[1] if len(parts) > 1 else fleet.namespace
    problems = []
    if len(parts) > 2 and parts[2:] != ["svc", "cluster", "local"]:
        problems.append(f"{where}: {host!r} is not a Service name (NAME.NAMESPACE.svc.cluster.local)")
    if namespace != fleet.namespace:
        problems.append(
            f"{where}: {address!r} points into namespace {namespace!r}, the fleet is in {fleet.namespace!r}"
        )
    service = fleet.get("Service", name)
    if service is None:
        return (
            [],
            None,
            None,
            [*problems, f"{where}: {address!r} names Service {name!r}, which is not rendered"],
        )
    if dns and service["spec"].get("clusterIP") != "None":
        problems.append(
            f"{where}: {address!r} resolves every shard only through a headless Service; {name} has a "
            f"cluster IP"
        )
    selected, number, why = service_port_target(fleet, service, int(port_text))
    if why:
        problems.append(f"{where}: {address!r}: {why}")
    return selected, number, service, problems


# ---------------------------------------------------------------------------------------------------------------
# Checks


def check_services(fleet: Fleet) -> list[str]:
    """Every Service selects a workload's pods and every port's targetPort names one of their containerPorts; a
    StatefulSet's serviceName is a headless Service selecting its pods."""
    problems = []
    for svc in fleet.all("Service"):
        for entry in svc["spec"].get("ports", []):
            _, _, why = service_port_target(fleet, svc, entry["port"])
            if why:
                problems.append(why)
    for sts in fleet.all("StatefulSet"):
        name = sts["spec"].get("serviceName")
        svc = fleet.get("Service", name or "")
        if svc is None:
            problems.append(
                f"StatefulSet {sts['metadata']['name']}: serviceName {name!r} is not a rendered Service"
            )
        elif svc["spec"].get("clusterIP") != "None":
            problems.append(f"StatefulSet {sts['metadata']['name']}: Service {name} is not headless")
        elif sts not in fleet.selected(svc["spec"].get("selector", {})):
            problems.append(f"StatefulSet {sts['metadata']['name']}: Service {name} does not select its pods")
    return problems


def check_workload_selectors(fleet: Fleet) -> list[str]:
    problems = []
    for w in fleet.workloads():
        selector = w["spec"]["selector"].get("matchLabels", {})
        if not selector or not labels_match(selector, pod_labels(w)):
            problems.append(
                f"{w['kind']} {w['metadata']['name']}: selector {selector} does not match its pods"
            )
        others = [o["metadata"]["name"] for o in fleet.selected(selector) if o is not w]
        if others:
            problems.append(f"{w['kind']} {w['metadata']['name']}: selector also matches {others}")
    return problems


def check_probes(fleet: Fleet) -> list[str]:
    """Startup, readiness and liveness probes on every container; gRPC servers (a port named grpc) use native gRPC
    probes on that port, or on their plaintext health port when they have one (a TLS server: Kubernetes' gRPC
    probes cannot do TLS), the others an HTTP GET of /metrics on their metrics port."""
    problems = []
    for c in fleet.containers():
        ports = c.ports()
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.spec.get(kind)
            if probe is None:
                problems.append(f"{c.name}: no {kind}")
                continue
            if "grpc" in ports:
                name = HEALTH_PORT if HEALTH_PORT in ports else "grpc"
                if probe.get("grpc", {}).get("port") != ports[name]:
                    problems.append(
                        f"{c.name}: {kind} must be grpc on the {name} containerPort {ports[name]}, is {probe}"
                    )
            else:
                http = probe.get("httpGet", {})
                port = http.get("port")
                number = ports.get(port) if isinstance(port, str) else port
                if http.get("path") != "/metrics" or number is None or number != ports.get("metrics"):
                    problems.append(
                        f"{c.name}: {kind} must GET /metrics on the metrics containerPort, is {probe}"
                    )
    return problems


def check_args(fleet: Fleet) -> list[str]:
    """Every container's args expand (every `$(VAR)` defined) and parse as the apexrl command they run; servers
    listen on 0.0.0.0 at their declared containerPorts; the addresses they dial reach the right pods' ports; every
    fleet ConfigMap key feeds some arg; paths they write lie on writable volumes."""
    parsed, problems = parsed_containers(fleet)
    used_vars: set[str] = set()
    for c in fleet.containers():
        for arg in c.spec.get("args", []):
            used_vars.update(VAR.findall(str(arg)))
    for c, ordinal, p in parsed:
        where = f"{c.name} (pod {ordinal})"
        cfg, ports = p.config, c.ports()
        if p.subcommand not in ("replay", "learner", "actor", "params"):
            problems.append(f"{where}: runs `apexrl {p.subcommand}`, not a fleet role")
            continue
        if cfg.host != "0.0.0.0":
            problems.append(f"{where}: --host is {cfg.host}; pods must listen on 0.0.0.0")
        if cfg.metrics_port != ports.get("metrics"):
            problems.append(
                f"{where}: --metrics-port {cfg.metrics_port} is not its containerPort 'metrics' "
                f"{ports.get('metrics')}"
            )
        if p.subcommand in ("replay", "learner", "params") and cfg.port != ports.get("grpc"):
            problems.append(f"{where}: --port {cfg.port} is not its containerPort 'grpc' {ports.get('grpc')}")
        if getattr(cfg, "health_port", None) != ports.get(HEALTH_PORT):
            problems.append(
                f"{where}: --health-port {getattr(cfg, 'health_port', None)} is not its containerPort "
                f"'{HEALTH_PORT}' {ports.get(HEALTH_PORT)}"
            )
        expected_image = "apexrl-replay" if p.subcommand == "replay" else "apexrl-train"
        if expected_image not in c.spec["image"]:
            problems.append(
                f"{where}: `apexrl {p.subcommand}` runs from image {c.spec['image']}, not {expected_image}"
            )
        for address in getattr(cfg, "replay", ()) or ():
            selected, number, _, found = resolve_address(fleet, address, f"{where} --replay")
            problems += found
            if selected and any(component(w) != "replay" for w in selected):
                problems.append(f"{where}: --replay {address} reaches {[component(w) for w in selected]}")
            if number is not None and selected and number != _grpc_port(selected[0]):
                problems.append(
                    f"{where}: --replay {address} lands on port {number}, not the shards' grpc port"
                )
        params = getattr(cfg, "params", None)
        if params:
            selected, number, _, found = resolve_address(fleet, params, f"{where} --params")
            problems += found
            if selected and [component(w) for w in selected] not in (["learner"], ["params"]):
                problems.append(f"{where}: --params {params} reaches {[component(w) for w in selected]}")
            if number is not None and selected and number != _grpc_port(selected[0]):
                problems.append(
                    f"{where}: --params {params} lands on port {number}, not the learner's grpc port"
                )
        for flag in ("run_dir", "episodes_csv", "port_file"):
            path = getattr(cfg, flag, None)
            if path and not _writable(c, path):
                problems.append(
                    f"{where}: --{flag.replace('_', '-')} {path} is not on a writable volume (the root "
                    f"filesystem is read-only)"
                )
        replicas = c.workload["spec"].get("replicas", 1)
        if (
            p.subcommand == "actor"
            and not cfg.evaluate
            and c.workload["kind"] == "StatefulSet"
            and cfg.num_actors != replicas
        ):
            problems.append(
                f"{where}: --num-actors {cfg.num_actors} differs from the StatefulSet's {replicas} replicas"
            )
    for cm in fleet.all("ConfigMap"):
        referenced = any(
            src.get("configMapRef", {}).get("name") == cm["metadata"]["name"]
            for c in fleet.containers()
            for src in c.spec.get("envFrom", [])
        )
        if referenced:
            unused = sorted(set(cm.get("data", {})) - used_vars)
            if unused:
                problems.append(f"ConfigMap {cm['metadata']['name']}: keys no arg uses: {unused}")
    return problems


def _grpc_port(workload: dict) -> int | None:
    return Container(workload, pod_spec(workload)["containers"][0]).ports().get("grpc")


def _writable(c: Container, path: str) -> bool:
    return any(
        path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        for m in c.spec.get("volumeMounts", [])
        if not m.get("readOnly")
    )


def check_volumes(fleet: Fleet) -> list[str]:
    """Every mount names a volume (or a volumeClaimTemplate), every volume has exactly one source, /tmp is a
    writable emptyDir, every PVC a pod names is rendered."""
    sources = (
        "emptyDir",
        "persistentVolumeClaim",
        "configMap",
        "secret",
        "projected",
        "downwardAPI",
        "ephemeral",
    )
    problems = []
    for w in fleet.workloads():
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for name, v in volumes.items():
            given = [s for s in sources if v.get(s) is not None]
            if len(given) != 1:
                problems.append(f"{w['kind']} {w['metadata']['name']}: volume {name} has sources {given}")
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and fleet.get("PersistentVolumeClaim", claim) is None:
                problems.append(
                    f"{w['kind']} {w['metadata']['name']}: volume {name} claims {claim}, not rendered"
                )
        for c in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            for path, name in mounts.items():
                if name not in volumes and name not in claims:
                    problems.append(f"{Container(w, c).name}: mount {path} names no volume ({name})")
            if "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
                problems.append(
                    f"{Container(w, c).name}: /tmp is not an emptyDir (the root filesystem is read-only)"
                )
    return problems


def check_security(fleet: Fleet, uid: int, stop_grace: float) -> list[str]:
    """Non-root as the image's user, read-only root filesystem, no privilege escalation, no capabilities, the
    runtime's seccomp profile, no service-account token, a termination grace period above the roles' own stop
    grace; resources requested and limited everywhere."""
    problems = []
    accounts = {a["metadata"]["name"]: a for a in fleet.all("ServiceAccount")}
    for w in fleet.workloads():
        name = f"{w['kind']} {w['metadata']['name']}"
        spec = pod_spec(w)
        pod_sc = spec.get("securityContext", {})
        if pod_sc.get("runAsNonRoot") is not True or pod_sc.get("runAsUser") != uid:
            problems.append(f"{name}: pod must run as non-root user {uid} (the image's USER), has {pod_sc}")
        if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: no RuntimeDefault seccomp profile")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: automountServiceAccountToken is not false")
        account = accounts.get(spec.get("serviceAccountName", ""))
        if account is None:
            problems.append(f"{name}: serviceAccountName {spec.get('serviceAccountName')!r} is not rendered")
        elif account.get("automountServiceAccountToken") is not False:
            problems.append(
                f"ServiceAccount {account['metadata']['name']}: automountServiceAccountToken not false"
            )
        grace = spec.get("terminationGracePeriodSeconds")
        if grace is None or grace <= stop_grace:
            problems.append(
                f"{name}: terminationGracePeriodSeconds {grace} is not above the roles' stop grace "
                f"{stop_grace:g} s"
            )
        for c in spec["containers"]:
            cname = Container(w, c).name
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{cname}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cname}: allowPrivilegeEscalation is not false")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
                problems.append(f"{cname}: capabilities must drop ALL and add none")
            if sc.get("runAsNonRoot") is False or sc.get("runAsUser", uid) != uid or sc.get("privileged"):
                problems.append(f"{cname}: container security context overrides the non-root user: {sc}")
            resources = c.get("resources", {})
            for what in ("cpu", "memory"):
                request = resources.get("requests", {}).get(what)
                limit = resources.get("limits", {}).get(what)
                if request is None or limit is None:
                    problems.append(f"{cname}: {what} request and limit must both be set")
                elif quantity(request) > quantity(limit):
                    problems.append(f"{cname}: {what} request {request} above its limit {limit}")
    return problems


def check_pdb(fleet: Fleet) -> list[str]:
    """The shards' PodDisruptionBudget lets voluntary disruptions (node drains) take one shard at a time
    (maxUnavailable 1, whatever the shard count: the guide's promise), and selects the shards only."""
    problems = []
    shards = [w for w in fleet.workloads() if component(w) == "replay"]
    covered = set()
    for pdb in fleet.all("PodDisruptionBudget"):
        name = f"PodDisruptionBudget {pdb['metadata']['name']}"
        selected = fleet.selected(pdb["spec"].get("selector", {}).get("matchLabels", {}))
        if not selected:
            problems.append(f"{name} selects no workload")
        covered.update(id(w) for w in selected)
        if "maxUnavailable" not in pdb["spec"] and "minAvailable" not in pdb["spec"]:
            problems.append(f"{name} sets no budget")
        if any(component(w) == "replay" for w in selected):
            if [component(w) for w in selected] != ["replay"]:
                problems.append(
                    f"{name} selects {[w['metadata']['name'] for w in selected]}, not the shards only"
                )
            if pdb["spec"].get("maxUnavailable") != 1 or "minAvailable" in pdb["spec"]:
                problems.append(
                    f"{name}: maxUnavailable {pdb['spec'].get('maxUnavailable')}, minAvailable "
                    f"{pdb['spec'].get('minAvailable')}: drains must take one shard at a time "
                    f"(maxUnavailable 1)"
                )
    problems += [
        f"StatefulSet {w['metadata']['name']}: no PodDisruptionBudget selects the shards"
        for w in shards
        if id(w) not in covered
    ]
    return problems


# ---------------------------------------------------------------------------------------------------------------
# NetworkPolicies: who may connect to whom (Kubernetes' semantics), and the fleet's design


@dataclass
class Endpoint:
    """A pod as NetworkPolicies see it (or, with `ip` and no namespace, an address outside the cluster)."""

    name: str  # a role (the component label) or a stranger's name
    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, tuple[int, str]] = field(default_factory=dict)  # port name -> (number, protocol)
    ip: str | None = None


def namespace_labels(fleet: Fleet, namespace: str) -> dict[str, str]:
    """A namespace's labels: the automatic kubernetes.io/metadata.name, and the rendered Namespace's own."""
    ns = fleet.get("Namespace", namespace)
    return {**((ns or {}).get("metadata", {}).get("labels") or {}), "kubernetes.io/metadata.name": namespace}


def workload_endpoint(fleet: Fleet, workload: dict) -> Endpoint:
    """One pod of `workload` as NetworkPolicies see it (its template's labels, its named ports)."""
    ports = {
        p["name"]: (p["containerPort"], p.get("protocol", "TCP"))
        for c in pod_spec(workload)["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }
    return Endpoint(
        component(workload),
        fleet.namespace,
        dict(pod_labels(workload)),
        namespace_labels(fleet, fleet.namespace),
        ports,
    )


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions; {} selects everything) against `labels`."""
    selector = selector or {}
    if not labels_match(selector.get("matchLabels") or {}, labels):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if not {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]:
            return False
    return True


def _peer_matches(peer: dict, policy_namespace: str, ep: Endpoint) -> bool:
    if "ipBlock" in peer:
        if ep.ip is None:
            return (
                False  # pod traffic is matched by pod and namespace selectors (CNIs differ on pod IPs here)
            )
        address = ipaddress.ip_address(ep.ip)
        return address in ipaddress.ip_network(peer["ipBlock"]["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in peer["ipBlock"].get("except") or []
        )
    if ep.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], ep.namespace_labels):
            return False
    elif ep.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or selector_matches(peer["podSelector"], ep.labels)


def _port_matches(rule_ports: list[dict] | None, number: int, protocol: str, destination: Endpoint) -> bool:
    """A rule's `ports` against a connection to `destination`'s port `number`; a named port is the destination
    pod's (for ingress rules: the selected pod's)."""
    if not rule_ports:
        return True
    for p in rule_ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        value = p["port"]
        if isinstance(value, str) and not value.isdigit():
            if destination.ports.get(value) == (number, protocol):
                return True
        elif int(value) <= number <= int(p.get("endPort", value)):
            return True
    return False


def policy_types(policy: dict) -> list[str]:
    """policyTypes, with the API server's default when unset (Ingress, and Egress when there are egress rules)."""
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def isolating(fleet: Fleet, ep: Endpoint, direction: str) -> list[dict]:
    """The NetworkPolicies that select `ep` for `direction` (Ingress or Egress): it is isolated that way when any
    does, and then admits only what one of their rules allows."""
    return [
        pol
        for pol in fleet.all("NetworkPolicy")
        if ep.namespace == pol["metadata"].get("namespace", fleet.namespace)
        and direction in policy_types(pol)
        and selector_matches(pol["spec"].get("podSelector"), ep.labels)
    ]


def connection_allowed(
    fleet: Fleet, source: Endpoint, destination: Endpoint, number: int, protocol: str = "TCP"
) -> bool:
    """Whether the rendered NetworkPolicies let `source` open a connection to `destination`'s port `number`:
    the source's egress policies (if any select it) and the destination's ingress policies (likewise) must both
    allow it. Traffic from a pod's own node (the kubelet's probes) is always allowed and is not asked about here."""

    def allows(policies: list[dict], rules_key: str, peers_key: str, peer: Endpoint) -> bool:
        return any(
            _port_matches(rule.get("ports"), number, protocol, destination)
            and (
                not rule.get(peers_key)
                or any(
                    _peer_matches(x, pol["metadata"].get("namespace", fleet.namespace), peer)
                    for x in rule[peers_key]
                )
            )
            for pol in policies
            for rule in pol["spec"].get(rules_key) or []
        )

    egress = isolating(fleet, source, "Egress") if source.namespace is not None else []
    if egress and not allows(egress, "egress", "to", destination):
        return False
    ingress = isolating(fleet, destination, "Ingress") if destination.namespace is not None else []
    return not ingress or allows(ingress, "ingress", "from", source)


# The fleet's network design (k8s/base/networkpolicy.yaml's table): every connection it allows, as (from, to, the
# destination's port name). Everything else is denied: nobody reaches the actors or the evaluator but Prometheus,
# nobody reaches a health port (the kubelet does, from the node), pods outside the fleet reach nothing.
FLEET_ROLES = ("replay", "learner", "actor", "evaluator")
NETWORK_DESIGN = frozenset(
    {
        ("actor", "replay", "grpc"),
        ("actor", "learner", "grpc"),
        ("evaluator", "learner", "grpc"),
        ("learner", "replay", "grpc"),
        *(("prometheus", role, "metrics") for role in FLEET_ROLES),
        *(
            (role, "kube-dns", port)
            for role in (*FLEET_ROLES, "fleet-labelled")
            for port in ("dns", "dns-tcp")
        ),
    }
)


def strangers(fleet: Fleet) -> list[Endpoint]:
    """The pods and addresses the design is checked against besides the fleet's own: Prometheus, the cluster DNS,
    a pod without the fleet label, a pod with only the fleet label, an actor-labelled pod in another namespace and
    an address on the internet."""
    key, value = FLEET_LABEL
    ns, ns_labels = fleet.namespace, namespace_labels(fleet, fleet.namespace)
    actor = next((pod_labels(w) for w in fleet.workloads() if component(w) == "actor"), {})
    return [
        Endpoint(
            "prometheus",
            "monitoring",
            {"app.kubernetes.io/name": "prometheus"},
            {"kubernetes.io/metadata.name": "monitoring"},
        ),
        Endpoint(
            "kube-dns",
            "kube-system",
            {"k8s-app": "kube-dns"},
            {"kubernetes.io/metadata.name": "kube-system"},
            {"dns": (53, "UDP"), "dns-tcp": (53, "TCP")},
        ),
        Endpoint("no-fleet-label", ns, {"app.kubernetes.io/name": "debug"}, ns_labels),
        Endpoint("fleet-labelled", ns, {key: value}, ns_labels),
        Endpoint("actor-elsewhere", "elsewhere", dict(actor), {"kubernetes.io/metadata.name": "elsewhere"}),
        Endpoint("internet", None, ports={"https": (443, "TCP")}, ip="203.0.113.10"),
    ]


def network_matrix(fleet: Fleet) -> set[tuple[str, str, str]]:
    """Every (from, to, port name) the rendered NetworkPolicies allow, between one pod of each role and the
    strangers: connections to the fleet's pods from anyone, and from pods with the fleet label in the fleet's
    namespace (the policies' business) to anywhere."""
    key, value = FLEET_LABEL
    fleet_eps = [workload_endpoint(fleet, w) for w in fleet.workloads()]
    others = strangers(fleet)
    allowed = set()
    for src in fleet_eps + [e for e in others if e.namespace is not None]:
        for dst in fleet_eps + [e for e in others if e.name in ("kube-dns", "internet")]:
            if dst not in fleet_eps and (src.labels.get(key) != value or src.namespace != fleet.namespace):
                continue  # a stranger's reach outside the fleet is not the fleet's policies' business
            for port_name, (number, protocol) in dst.ports.items():
                if src is not dst and connection_allowed(fleet, src, dst, number, protocol):
                    allowed.add((src.name, dst.name, port_name))
    return allowed


def check_network_policy(fleet: Fleet) -> list[str]:
    """Every fleet pod carries the fleet label and is isolated both ways by a policy with no rules (default deny);
    the policies then allow exactly NETWORK_DESIGN between the fleet's roles, Prometheus, the cluster DNS and the
    strangers (a health port, which only the kubelet needs, is opened to nobody), and every connection the pods'
    args dial is part of the design. Ports in rules name containerPorts of the fleet (or the DNS port)."""
    problems = []
    key, value = FLEET_LABEL
    for w in fleet.workloads():
        if pod_labels(w).get(key) != value:
            problems.append(f"{w['kind']} {w['metadata']['name']}: pods lack the fleet label {key}={value}")
    policies = fleet.all("NetworkPolicy")
    if not policies:
        return [*problems, "no NetworkPolicy"]
    fleet_eps = [workload_endpoint(fleet, w) for w in fleet.workloads()]
    deny_all = [
        p
        for p in policies
        if {"Ingress", "Egress"} <= set(policy_types(p))
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
        and all(selector_matches(p["spec"].get("podSelector"), e.labels) for e in fleet_eps)
    ]
    if not deny_all:
        problems.append(
            "no default-deny NetworkPolicy: none selects every fleet pod for Ingress and Egress without rules"
        )
    port_names = {name for e in fleet_eps for name in e.ports} | {"dns", "dns-tcp"}
    for pol in policies:
        for rule in [*(pol["spec"].get("ingress") or []), *(pol["spec"].get("egress") or [])]:
            for port in rule.get("ports") or []:
                named = port.get("port")
                if isinstance(named, str) and not named.isdigit() and named not in port_names:
                    problems.append(
                        f"NetworkPolicy {pol['metadata']['name']}: port {named!r} names no "
                        f"containerPort of the fleet"
                    )
    allowed = network_matrix(fleet)
    ports = {
        (e.name, name): f"{n}/{proto}"
        for e in fleet_eps + strangers(fleet)
        for name, (n, proto) in e.ports.items()
    }
    for src, dst, port in sorted(allowed - NETWORK_DESIGN):
        why = (
            "which only the kubelet needs (and always reaches)"
            if port == HEALTH_PORT
            else "which the design (k8s/base/networkpolicy.yaml) does not allow"
        )
        problems.append(f"NetworkPolicies let {src} reach {dst}:{port} ({ports[(dst, port)]}), {why}")
    roles = {e.name for e in fleet_eps}
    for src, dst, port in sorted(NETWORK_DESIGN - allowed):
        if {src, dst} & set(FLEET_ROLES) <= roles and (dst, port) in ports:
            problems.append(
                f"NetworkPolicies keep {src} from {dst}:{port} ({ports[(dst, port)]}), which the design needs"
            )
    for src, dst, port in sorted(dialled(fleet) - NETWORK_DESIGN):
        problems.append(f"{src} dials {dst}:{port}, which the network design does not allow")
    return problems


def dialled(fleet: Fleet) -> set[tuple[str, str, str]]:
    """Every (role, role, port name) a container's args dial (--replay, --params), resolved through the Services."""
    if "dialled" not in fleet._derived:
        fleet._derived["dialled"] = _dialled(fleet)
    return set(fleet._derived["dialled"])


def _dialled(fleet: Fleet) -> set[tuple[str, str, str]]:
    parsed, _ = parsed_containers(fleet)
    found = set()
    for c, _, p in parsed:
        targets = [
            *(getattr(p.config, "replay", ()) or ()),
            *([p.config.params] if getattr(p.config, "params", None) else []),
        ]
        for address in targets:
            selected, number, _, _ = resolve_address(fleet, address, c.name)
            for w in selected:
                name = next(
                    (
                        n
                        for n, port in Container(w, pod_spec(w)["containers"][0]).ports().items()
                        if port == number
                    ),
                    None,
                )
                if name is not None:
                    found.add((component(c.workload), component(w), name))
    return found


def check_learner(fleet: Fleet) -> list[str]:
    learners = [w for w in fleet.workloads() if component(w) == "learner"]
    if len(learners) != 1:
        return [f"expected one learner workload, found {len(learners)}"]
    w = learners[0]
    problems = []
    if w["kind"] != "Deployment" or w["spec"].get("replicas") != 1:
        problems.append("the learner must be a one-replica Deployment")
    if w["spec"].get("strategy", {}).get("type") != "Recreate":
        problems.append("the learner Deployment must use the Recreate strategy (never two learners at once)")
    return problems


def check_tls(fleet: Fleet) -> list[str]:
    """TLS is the whole fleet's or nobody's: every server (shards, the parameter service) serves it or none does;
    every client verifies TLS servers with a CA and, when they require client certificates, presents one;
    clients that dial shards by the addresses a headless Service returns check the certificate against
    --tls-server-name; TLS servers keep a plaintext health port for the probes (check_probes puts the probes
    there). Where the files lie and who may read them is check_credentials'."""
    parsed, _ = parsed_containers(fleet)  # refusals are check_args' to report
    problems: list[str] = []
    servers, clients = server_and_client_configs(parsed)
    serving = {c.name: cfg.tls_cert is not None for c, _, cfg in servers}
    if len(set(serving.values())) > 1:
        problems.append(f"some servers serve TLS, others plaintext: {serving}")
    tls_on = any(serving.values())
    mutual = any(cfg.tls_ca is not None for _, _, cfg in servers if cfg.tls_cert is not None)
    for c, ordinal, cfg in servers:
        if cfg.tls_cert is not None and cfg.health_port is None:
            problems.append(
                f"{c.name} (pod {ordinal}): serves TLS without --health-port (Kubernetes' gRPC probes "
                f"cannot do TLS)"
            )
    for c, ordinal, cfg in clients:
        where = f"{c.name} (pod {ordinal})"
        if tls_on and cfg.tls_ca is None:
            problems.append(f"{where}: the servers serve TLS but it has no --tls-ca to verify them with")
        if mutual and cfg.tls_cert is None:
            problems.append(f"{where}: the servers require client certificates but it has no --tls-cert")
        if not tls_on and any(getattr(cfg, name) is not None for name in TLS_FILES):
            problems.append(f"{where}: dials TLS, but the servers serve plaintext")
        dns = [t for t in getattr(cfg, "replay", ()) or () if t.startswith("dns:")]
        if tls_on and dns and cfg.tls_server_name is None:
            problems.append(
                f"{where}: dials the shards by the addresses {dns[0]} resolves to, which no certificate "
                f"names: set --tls-server-name to the name the certificate holds"
            )
    return problems


def server_and_client_configs(parsed: list[tuple[Container, int, Parsed]]) -> tuple[list, list]:
    """(container, ordinal, config) of every server (shards, parameter services, a learner hosting one) and of
    every client (learners, actors, the evaluator)."""
    servers, clients = [], []
    for c, ordinal, p in parsed:
        cfg = p.config
        if p.subcommand in ("replay", "params") or (p.subcommand == "learner" and cfg.params is None):
            servers.append((c, ordinal, cfg))
        if p.subcommand in ("learner", "actor"):
            clients.append((c, ordinal, cfg))
    return servers, clients


# Flags that name credential files (or, --role-tokens, a directory of them), and what each holds.
CREDENTIAL_FLAGS = {
    "tls_cert": "certificate",
    "tls_key": "private key",
    "tls_ca": "CA bundle",
    "token_file": "bearer token",
    "role_tokens": "role tokens",
}
SECRET_FLAGS = ("tls_key", "token_file", "role_tokens")  # what must stay readable by the pod's user alone


def check_credentials(fleet: Fleet) -> list[str]:
    """Credentials only where they are used: every credential flag names a file (or directory) in a read-only
    Secret volume of its pod, every Secret volume a container mounts is named by one of its flags, and no two
    roles share a private key's or a token's Secret (so the shards' server key is in no client's pod, and a
    stolen actor's files are an actor's credentials only). Private keys and tokens are readable by the pod's user
    and not by every user (mode 0440 with the pod's fsGroup: the kubelet gives the files that group); no token is
    on a command line."""
    parsed, _ = parsed_containers(fleet)
    problems: list[str] = []
    holders: dict[tuple[str, str], set[str]] = {}  # (flag, Secret) -> roles using it
    for c, ordinal, p in parsed:
        first = ordinal == ordinals(c.workload)[0]
        volumes = {v["name"]: v for v in pod_spec(c.workload).get("volumes", [])}
        mounts = {mt["mountPath"].rstrip("/"): mt for mt in secret_mounts(c)}
        used: set[str] = set()
        if getattr(p.config, "token", None):
            problems.append(
                f"{c.name}: a token on the command line (--token): use --token-file from a Secret"
            )
        for flag, what in CREDENTIAL_FLAGS.items():
            local = getattr(p.config, flag, None)
            if local is None:
                continue
            path = fleet.original_path(local).rstrip("/")
            mount = next(
                (mt for point, mt in mounts.items() if path == point or path.startswith(point + "/")), None
            )
            option = f"--{flag.replace('_', '-')}"
            if mount is None:
                problems.append(f"{c.name} (pod {ordinal}): {option} {path} is not in a Secret volume")
                continue
            used.add(mount["name"])
            if not mount.get("readOnly"):
                problems.append(
                    f"{c.name}: Secret volume {mount['name']} at {mount['mountPath']} is not mounted readOnly"
                )
            volume = volumes[mount["name"]]
            relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
            if flag in SECRET_FLAGS and first:
                files = [relative] if relative else sorted(volume_files(fleet, volume)[0] or {})
                for name in files:
                    problems += _secret_file_problems(c, volume, name, what)
            if flag in ("tls_key", "token_file"):
                for secret, _ in secret_sources(volume):
                    holders.setdefault((option, secret), set()).add(component(c.workload))
        if first:
            for mt in secret_mounts(c):
                if mt["name"] not in used:
                    secrets = [name for name, _ in secret_sources(volumes[mt["name"]])]
                    problems.append(
                        f"{c.name}: mounts Secret {', '.join(secrets)} at {mt['mountPath']}, which none "
                        f"of its flags reads: a credential in a pod that does not use it"
                    )
    for (option, secret), roles in sorted(holders.items()):
        if len(roles) > 1:
            problems.append(
                f"Secret {secret} is the {option} of several roles ({', '.join(sorted(roles))}): each "
                f"role needs its own, so that one pod's files are its role's credentials only"
            )
    return problems


def _secret_file_problems(c: Container, volume: dict, relative: str, what: str) -> list[str]:
    """A secret file's mode in its volume: readable by the pod's user, not by every user."""
    mode = file_mode(volume, relative)
    fs_group = pod_spec(c.workload).get("securityContext", {}).get("fsGroup")
    if mode & 0o004:
        return [
            f"{c.name}: the {what} {relative} has mode {mode:#o}: every user in the container may read it "
            f"(defaultMode 0440 with the pod's fsGroup keeps it to the fleet's user)"
        ]
    if fs_group is None:
        return [
            f"{c.name}: the {what} {relative} (mode {mode:#o}, owned by root) is unreadable for the pod's "
            f"user: the pod needs an fsGroup, whose group the kubelet gives the volume's files"
        ]
    return []


# Role names of apexrl's access list (common/access.py) a client pod acts in: its component label.
CLIENT_ROLES = ("actor", "evaluator", "learner")
OPERATOR = "operator"  # a person's or a tool's role; servers may verify it, no pod acts in it


def check_roles(fleet: Fleet) -> list[str]:
    """Role credentials are the whole fleet's or nobody's. With them on (servers given --role-tokens): every
    server verifies exactly the roles that dial it (from the args; the operator's may be there too), every client
    sends a token (--token-file), and that token is the one each server it dials holds for its role (compared
    byte for byte in the projected Secrets); the shards pin the table signature (--signature), since an actor's
    first insert cannot fix it; and no server also takes roles from certificates (--certificate-roles would let a
    caller without a token act in its certificate's role: either credential would do). Wherever the shards pin a
    signature, it is the one the actors write for their environment."""
    parsed, _ = parsed_containers(fleet)
    problems: list[str] = []
    servers, clients = server_and_client_configs(parsed)
    on = {c.name: getattr(cfg, "role_tokens", None) is not None for c, _, cfg in servers}
    if len(set(on.values())) > 1:
        problems.append(f"some servers verify role tokens, others do not: {on}")
    callers: dict[str, set[str]] = {}
    for src, dst, _ in dialled(fleet):
        callers.setdefault(dst, set()).add(src)
    if any(on.values()):
        for c, _, cfg in servers:
            if getattr(cfg, "role_tokens", None) is None:
                continue
            role = component(c.workload)
            directory = Path(cfg.role_tokens)
            verified = {f.name for f in directory.iterdir() if f.is_file() and not f.name.startswith(".")}
            verified_roles = {name.split(".", 1)[0] for name in verified}
            for missing in sorted(callers.get(role, set()) - verified_roles):
                problems.append(
                    f"{c.name}: {missing} dials it, but --role-tokens holds no {missing} token: every "
                    f"{missing} call is refused (UNAUTHENTICATED)"
                )
            for extra in sorted(verified_roles - callers.get(role, set()) - {OPERATOR}):
                problems.append(
                    f"{c.name}: --role-tokens holds the {extra} token, but no {extra} dials it: a "
                    f"server keeps only the tokens it verifies"
                )
            if getattr(cfg, "certificate_roles", False):
                problems.append(
                    f"{c.name}: --certificate-roles beside --role-tokens: a caller without a token "
                    f"would act in its certificate's role, so either credential would do"
                )
            if role == "replay" and cfg.signature is None:
                problems.append(
                    f"{c.name}: verifies roles but pins no --signature: only the learner or the "
                    f"operator may fix a table's signature, so every actor's first insert is refused"
                )
        for c, ordinal, cfg in clients:
            role = component(c.workload)
            if role not in CLIENT_ROLES:
                problems.append(f"{c.name}: component {role!r} is no client role ({', '.join(CLIENT_ROLES)})")
                continue
            if cfg.token_file is None:
                problems.append(
                    f"{c.name} (pod {ordinal}): the servers verify role tokens, but it sends none "
                    f"(--token-file)"
                )
                continue
            sent = Path(cfg.token_file).read_bytes().strip()
            for sc, _, scfg in servers:
                if component(sc.workload) not in _dialled_by(fleet, role) or scfg.role_tokens is None:
                    continue
                held = Path(scfg.role_tokens) / role
                if held.is_file() and held.read_bytes().strip() != sent:
                    problems.append(
                        f"{c.name}: the token it sends ({fleet.original_path(cfg.token_file)}) is not "
                        f"the {role} token {sc.name} verifies: its calls are refused"
                    )
    problems += _signature_problems(parsed, servers)
    return problems


def _dialled_by(fleet: Fleet, role: str) -> set[str]:
    return {dst for src, dst, _ in dialled(fleet) if src == role}


def _signature_problems(parsed: list[tuple[Container, int, Parsed]], servers: list) -> list[str]:
    """A shard's pinned signature against what every exploring actor writes (their env and compression)."""
    written = {
        (p.config.env, p.config.compress)
        for _, _, p in parsed
        if p.subcommand == "actor" and not p.config.evaluate
    }
    problems = []
    for c, _, cfg in servers:
        pinned = getattr(cfg, "signature", None)
        if pinned is None:
            continue
        for env, compress in sorted(written):
            wanted = actor_signature(env, compress)
            if str(pinned) != wanted:
                problems.append(
                    f"{c.name}: --signature {pinned} is not what the actors write for {env} "
                    f"({wanted}): every insert would be refused (INVALID_ARGUMENT)"
                )
    return problems


@functools.cache
def actor_signature(env: str, compress: str = "zstd") -> str:
    """The replay signature the built-in actor writes for `env`: its own column-building code (algorithms/nstep.py) run
    on one observation of the environment's spaces."""
    import numpy as np

    from apexrl.algorithms.nstep import Transition, item_columns
    from apexrl.common.compression import compress_image_columns
    from apexrl.common.environments import env_spaces
    from apexrl.common.signature import ROW_VERSION_COLUMN, Signature

    spaces = env_spaces(env)
    obs = np.zeros(spaces.obs_shape, dtype=spaces.obs_dtype)
    action = 0 if spaces.num_actions else np.zeros(len(spaces.action_low), dtype=np.float32)
    columns = item_columns([Transition(obs, action, 0.0, 1.0, obs)] * 2)
    columns[ROW_VERSION_COLUMN] = np.zeros(2, dtype=np.int64)
    return str(Signature.from_batch(compress_image_columns(columns, compress)))


def check_documented(fleet: Fleet) -> list[str]:
    """What k8s/README.md and docs/deploy-kubernetes.md promise and no other check covers: a Service clients
    resolve through dns:/// answers with Ready pods only (publishNotReadyAddresses off: a starting or stopping shard
    is never sampled from); the shards' volumes outlive scaling down and deleting the StatefulSet (Retain, Retain);
    StatefulSet pods start and stop in parallel; actor k of N acts as --actor-index k; the evaluator inserts
    nothing (--evaluate, no shards); the ConfigMap's name carries a content hash (changing a value rolls the pods)."""
    problems = []
    parsed, _ = parsed_containers(fleet)
    for c, ordinal, p in parsed:
        cfg = p.config
        for address in getattr(cfg, "replay", ()) or ():
            if not address.startswith("dns:"):
                continue
            _, _, service, _ = resolve_address(fleet, address, c.name)
            if service is not None and service["spec"].get("publishNotReadyAddresses"):
                problems.append(
                    f"Service {service['metadata']['name']}: publishNotReadyAddresses is true, so "
                    f"{address} also answers with shards that are not Ready ({c.name} would dial them)"
                )
        if p.subcommand == "actor" and c.workload["kind"] == "StatefulSet" and cfg.actor_index != ordinal:
            problems.append(
                f"{c.name}: pod {ordinal} acts as --actor-index {cfg.actor_index}, not its ordinal"
            )
        if component(c.workload) == "evaluator" and (
            p.subcommand != "actor" or not cfg.evaluate or cfg.replay
        ):
            problems.append(f"{c.name}: the evaluator must run `apexrl actor --evaluate` and dial no shard")
    for sts in fleet.all("StatefulSet"):
        name = f"StatefulSet {sts['metadata']['name']}"
        if sts["spec"].get("podManagementPolicy") != "Parallel":
            problems.append(f"{name}: podManagementPolicy is not Parallel (its pods start and stop together)")
        if sts["spec"].get("volumeClaimTemplates"):
            retention = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
            for when in ("whenScaled", "whenDeleted"):
                if retention.get(when, "Retain") != "Retain":  # Retain is the default
                    problems.append(
                        f"{name}: persistentVolumeClaimRetentionPolicy.{when} is {retention[when]}, not "
                        f"Retain: its pods' volumes (the shards' checkpoints) would be deleted"
                    )
    for c in fleet.containers():
        for source in c.spec.get("envFrom", []):
            ref = source.get("configMapRef", {}).get("name", "")
            if ref and not re.search(r"-[a-z0-9]{10}$", ref):
                problems.append(
                    f"{c.name}: reads ConfigMap {ref}, whose name carries no content hash: changing "
                    f"a setting would not roll the pods"
                )
    return problems


def check_custom_resources(fleet: Fleet) -> list[str]:
    """kubernetes-validate only warns about custom resources: check the Prometheus Operator's by structure."""
    problems = []
    for pm in fleet.all("PodMonitor"):
        name = f"PodMonitor {pm['metadata']['name']}"
        if pm.get("apiVersion") != "monitoring.coreos.com/v1":
            problems.append(f"{name}: apiVersion {pm.get('apiVersion')}")
        selected = fleet.selected(pm["spec"].get("selector", {}).get("matchLabels", {}))
        if len(selected) != 1:
            problems.append(f"{name}: selects {len(selected)} workloads, expected one role")
            continue
        role = component(selected[0])
        endpoints = pm["spec"].get("podMetricsEndpoints", [])
        if not endpoints:
            problems.append(f"{name}: no podMetricsEndpoints")
        for ep in endpoints:
            if ep.get("port") != "metrics" or not any(
                "metrics" in Container(selected[0], c).ports() for c in pod_spec(selected[0])["containers"]
            ):
                problems.append(f"{name}: endpoint port {ep.get('port')!r} is not the pods' metrics port")
            jobs = [r.get("replacement") for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"]
            if jobs != [f"apexrl-{role}"]:
                problems.append(
                    f"{name}: job label {jobs}, expected apexrl-{role} (as in the file-SD targets)"
                )
    for rule in fleet.all("PrometheusRule"):
        name = f"PrometheusRule {rule['metadata']['name']}"
        groups = rule.get("spec", {}).get("groups")
        if not isinstance(groups, list):
            problems.append(f"{name}: spec.groups is not a list")
            continue
        for group in groups:
            if not group.get("name") or not isinstance(group.get("rules"), list):
                problems.append(f"{name}: group {group.get('name')!r} lacks a name or rules")
                continue
            for r in group["rules"]:
                if not r.get("expr") or ("record" in r) == ("alert" in r):
                    problems.append(f"{name}: rule {r} needs an expr and exactly one of record/alert")
    return problems


def quantity(text: Any) -> float:
    """A Kubernetes resource quantity ("500m", "2", "512Mi", "4G") as a number."""
    s = str(text)
    suffixes = {
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }
    for suffix in sorted(suffixes, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * suffixes[suffix]
    return float(s)

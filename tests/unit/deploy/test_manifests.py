"""The Kubernetes manifests under k8s/ render (`kubectl kustomize`, offline), pass the Kubernetes schema
(`kubernetes-validate --strict`), and line up across objects and with the code: every Service, probe, address,
`$(VAR)`, flag, volume, security setting and budget is checked on the rendered objects of every target
(tests/unit/deploy/manifests.py). The last tests break a copy of the manifests and require the checks to notice.
The TLS target mounts a Secret made outside the manifests: the tests add one, with certificates made by trustme,
as `kubectl create secret tls` would.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from apexrl.common import grpc_util
from apexrl.common.settings import settings_of
from apexrl.launcher.fleet_config import FleetSettings
from tests.support.certs import SERVER_NAME, make_certs
from tests.unit.deploy import manifests as m
from tests.unit.deploy.dockerfile import image_uid

pytestmark = pytest.mark.skipif(m.kubectl_missing() is not None, reason=m.kubectl_missing() or "")

# Kubernetes versions the rendered objects are validated against: the oldest the manifests need (1.28: the
# apps.kubernetes.io/pod-index label the actors read) and the newest schema kubernetes-validate ships.
OLDEST_KUBERNETES = "1.28.0"
# Sizes each overlay promises in its kustomization.yaml.
OVERLAY_SIZES = {"small-cpu": {"replay": 2, "actor": 4}, "production": {"replay": 8, "actor": 64},
                 "small-cpu-tls": {"replay": 2, "actor": 4}, "continuous-cpu": {"replay": 2, "actor": 4}}
# The Secret components/tls mounts, and the name its clients check the servers' certificates against.
TLS_SECRET = "apexrl-tls"
TLS_SERVER_NAME = "apexrl-replay.apexrl.svc"


def stop_grace() -> float:
    """The longest a role takes to stop after SIGTERM: the launcher's stop grace, and a server's drain time."""
    launcher = next(s.default for s in settings_of(FleetSettings) if s.name == "stop_grace")
    server = inspect.signature(grpc_util.serve_until).parameters["grace"].default
    return max(launcher, server)


def all_problems(objects: list[dict]) -> list[str]:
    fleet = m.Fleet(objects)
    return [
        *m.check_workload_selectors(fleet),
        *m.check_services(fleet),
        *m.check_probes(fleet),
        *m.check_args(fleet),
        *m.check_volumes(fleet),
        *m.check_security(fleet, image_uid(), stop_grace()),
        *m.check_pdb(fleet),
        *m.check_network_policy(fleet),
        *m.check_learner(fleet),
        *m.check_tls(fleet),
        *m.check_custom_resources(fleet),
    ]


@pytest.fixture(scope="module")
def tls_secret(tmp_path_factory) -> dict:
    """The Secret apexrl-tls as cert-manager would write it (namespace apexrl): a certificate for SERVER_NAME."""
    assert SERVER_NAME == TLS_SERVER_NAME
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    return m.tls_secret(TLS_SECRET, "apexrl", *(Path(path).read_bytes() for path in
                                                 (certs.named_cert, certs.named_key, certs.ca)))


def with_secrets(objects: list[dict], secret: dict) -> list[dict]:
    """The rendered objects plus the Secret, when some pod mounts it (as it must exist before they start)."""
    mounted = any(v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
                  for w in m.Fleet(objects).workloads() for v in m.pod_spec(w).get("volumes", []))
    return [*objects, secret] if mounted else objects


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: m.render(m.K8S / path) for name, path in m.TARGETS.items()}


def test_every_target_renders_and_its_object_counts(rendered):
    for name, objects in rendered.items():
        counts = m.kind_counts(objects)
        print(f"{name}: {len(objects)} objects: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        for kind in ("ServiceAccount", "ConfigMap", "Service", "Deployment", "StatefulSet", "PodDisruptionBudget",
                     "NetworkPolicy"):
            assert counts.get(kind), f"{name} renders no {kind}"
        names = {(o["kind"], o["metadata"]["name"]) for o in objects}
        for wanted in [("StatefulSet", "apexrl-replay"), ("Service", "apexrl-replay"),
                       ("Deployment", "apexrl-learner"), ("Service", "apexrl-learner"),
                       ("StatefulSet", "apexrl-actor"), ("Deployment", "apexrl-evaluator")]:
            assert wanted in names, f"{name} lacks {wanted}"


@pytest.mark.parametrize("target", list(m.TARGETS))
def test_rendered_objects_pass_the_kubernetes_schema_strictly(rendered, target, tmp_path):
    path = tmp_path / f"{target}.yaml"
    path.write_text(yaml.safe_dump_all(rendered[target]))
    from kubernetes_validate.utils import latest_version

    versions = [OLDEST_KUBERNETES, latest_version()]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet",
         *[arg for v in versions for arg in ("-k", v)], str(path)],
        capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{target} fails the Kubernetes {versions} schemas:\n{output}"
    # Custom resources have no bundled schema and are only warned about: nothing else may be.
    for line in output.splitlines():
        if line.startswith("WARN"):
            assert re.search(r"kind (PodMonitor|ServiceMonitor|PrometheusRule) with api version "
                             r"monitoring\.coreos\.com/", line), line


@pytest.mark.parametrize("target", list(m.TARGETS))
def test_objects_line_up_across_the_fleet(rendered, target, tls_secret):
    problems = all_problems(with_secrets(rendered[target], tls_secret))
    assert not problems, f"{target}:\n" + "\n".join(problems)


@pytest.mark.parametrize("overlay", list(OVERLAY_SIZES))
def test_overlays_size_the_fleet_and_name_registry_images(rendered, overlay):
    fleet = m.Fleet(rendered[overlay])
    assert fleet.namespace != "default", f"{overlay} sets no namespace"
    ns = fleet.get("Namespace", fleet.namespace)
    assert ns is not None and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    sizes = {m.component(w): w["spec"].get("replicas", 1) for w in fleet.workloads()}
    assert sizes == {**OVERLAY_SIZES[overlay], "learner": 1, "evaluator": 1}
    for c in fleet.containers():
        image = c.spec["image"]
        registry, _, rest = image.partition("/")
        assert "." in registry and ":" in rest and not image.endswith(":latest"), \
            f"{c.name}: image {image} is not registry/name:tag"
    requests = {what: sum(m.quantity(c.spec["resources"]["requests"][what]) * c.workload["spec"].get("replicas", 1)
                          for c in fleet.containers()) for what in ("cpu", "memory")}
    print(f"{overlay}: {sizes}; requests {requests['cpu']:g} CPUs, {requests['memory'] / 2**30:.1f} GiB")


def test_production_runs_the_learner_on_a_gpu_and_is_scraped_by_the_operator(rendered):
    fleet = m.Fleet(rendered["production"])
    learner = next(c for c in fleet.containers() if m.component(c.workload) == "learner")
    assert str(learner.spec["resources"]["limits"].get("nvidia.com/gpu")) == "1"
    assert learner.spec["image"].endswith("-cuda")
    argv, _ = m.container_argv(fleet, learner, 0)
    parsed, error = m.parse_apexrl(argv)
    assert error is None and parsed.config.device == "cuda"
    volumes = {v["name"]: v for v in m.pod_spec(learner.workload)["volumes"]}
    assert volumes["run"]["persistentVolumeClaim"]["claimName"] == "apexrl-learner-run"
    monitored = {m.component(fleet.selected(pm["spec"]["selector"]["matchLabels"])[0])
                 for pm in fleet.all("PodMonitor")}
    assert monitored == {m.component(w) for w in fleet.workloads()}, "every role's metrics port is scraped"
    assert fleet.all("PrometheusRule"), "the PrometheusRule is part of the production overlay"
    others = [c for c in fleet.containers() if m.component(c.workload) != "learner"]
    assert all("-cuda" not in c.spec["image"] and "nvidia.com/gpu" not in c.spec["resources"]["limits"]
               for c in others)


def test_the_continuous_overlay_runs_dpg_on_pendulum_with_dpgs_replay_settings(rendered):
    from apexrl.algorithms.registry import get

    data = next(o["data"] for o in rendered["continuous-cpu"]
                if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("apexrl-fleet"))
    assert (data["APEXRL_ENV"], data["APEXRL_ALGORITHM"]) == ("Pendulum-v1", "dpg")
    assert float(data["APEXRL_REPLAY_SAMPLES_PER_INSERT"]) == get("dpg").defaults["fleet"]["samples_per_insert"]
    for workload in m.Fleet(rendered["continuous-cpu"]).workloads():
        args = m.pod_spec(workload)["containers"][0]["args"]
        if "--env=$(APEXRL_ENV)" in args:  # learner, actors, evaluator: the same algorithm everywhere
            assert "--algorithm=$(APEXRL_ALGORITHM)" in args, workload["metadata"]["name"]


def test_base_keeps_the_cpu_learner_and_finds_shards_through_the_headless_service(rendered):
    fleet = m.Fleet(rendered["base"])
    learner = next(c for c in fleet.containers() if m.component(c.workload) == "learner")
    argv, _ = m.container_argv(fleet, learner, 0)
    parsed, _ = m.parse_apexrl(argv)
    assert parsed.config.device == "cpu"
    assert parsed.config.replay == ("dns:///apexrl-replay.default.svc.cluster.local:7000",)
    replay = fleet.get("StatefulSet", "apexrl-replay")
    claims = replay["spec"]["volumeClaimTemplates"]
    mounts = {mt["mountPath"]: mt["name"] for mt in m.pod_spec(replay)["containers"][0]["volumeMounts"]}
    assert mounts["/var/lib/apexrl/replay"] == claims[0]["metadata"]["name"]


# ---------------------------------------------------------------------------------------------------------------
# The checks catch broken manifests: each case edits one line of a copy of k8s/ and names what must be reported.

BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem)
    ("base/learner.yaml", "- --port=7200", "- --port=7201", "--port 7201 is not its containerPort 'grpc'"),
    ("base/learner.yaml", "      port: 7200\n      targetPort: grpc", "      port: 7200\n      targetPort: 7300",
     "targetPort 7300"),
    ("base/actor.yaml", "svc.cluster.local:7000", "svc.cluster.local:7001", "has no port 7001"),
    ("base/actor.yaml", "apexrl-learner.$(NAMESPACE)", "apexrl-params.$(NAMESPACE)", "names Service 'apexrl-params'"),
    ("base/replay.yaml", "$(APEXRL_REPLAY_ALPHA)", "$(APEXRL_REPLAY_ALFA)", "uses $(APEXRL_REPLAY_ALFA)"),
    ("base/replay.yaml", "- --capacity=", "- --capacity-rows=", "unrecognized arguments: --capacity-rows"),
    ("base/replay.yaml", "- --host=0.0.0.0", "- --host=127.0.0.1", "pods must listen on 0.0.0.0"),
    ("base/replay.yaml", "grpc:\n              port: 7000\n            periodSeconds: 5",
     "grpc:\n              port: 7001\n            periodSeconds: 5", "readinessProbe must be grpc"),
    ("base/replay.yaml", "  clusterIP: None\n  # Only", "  # Only", "is not headless"),
    ("base/evaluator.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false",
     "readOnlyRootFilesystem is not true"),
    ("base/actor.yaml", "runAsUser: 10001", "runAsUser: 0", "must run as non-root user 10001"),
    ("base/learner.yaml", "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 3",
     "terminationGracePeriodSeconds 3"),
    ("base/learner.yaml", "- --run-dir=/var/lib/apexrl/learner", "- --run-dir=/var/lib/apexrl/elsewhere",
     "is not on a writable volume"),
    ("base/networkpolicy.yaml", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/part-of: apexrl",
     "  podSelector:\n    matchLabels:\n      app.kubernetes.io/part-of: other", "not every fleet workload"),
    ("base/replay.yaml", "    app.kubernetes.io/component: replay\n  ports:",
     "    app.kubernetes.io/component: shard\n  ports:", "Service apexrl-replay selects no workload"),
    ("base/replay.yaml", "maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: apexrl\n"
     "      app.kubernetes.io/component: replay", "maxUnavailable: 1\n  selector:\n    matchLabels:\n"
     "      app.kubernetes.io/name: apexrl\n      app.kubernetes.io/component: shard",
     "PodDisruptionBudget apexrl-replay selects no workload"),
    ("base/fleet.env", "APEXRL_NUM_ACTORS=4", "APEXRL_NUM_ACTORS=4\nAPEXRL_UNUSED=1", "keys no arg uses"),
    ("base/fleet.env", "APEXRL_NUM_ACTORS=4", "APEXRL_NUM_ACTORS=3", "differs from the StatefulSet's 4 replicas"),
]


def _break(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    path = copy / file
    text = path.read_text()
    assert text.count(old) == 1, f"{file}: {old!r} occurs {text.count(old)} times; make the case unambiguous"
    path.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize(("file", "old", "new", "expected"), BREAKAGES,
                         ids=[f"{b[0]}:{b[2][:40]}" for b in BREAKAGES])
def test_a_broken_manifest_is_reported(tmp_path, file, old, new, expected):
    copy = _break(tmp_path, file, old, new)
    target = "small-cpu" if file.startswith("overlays/small-cpu") else "base"
    problems = all_problems(m.render(copy / m.TARGETS[target]))
    assert problems, f"breaking {file} ({old!r} -> {new!r}) went unnoticed"
    if expected is not None:
        assert any(expected in p for p in problems), "\n".join(problems)


def test_scaling_actors_in_an_overlay_carries_num_actors_along(tmp_path):
    copy = _break(tmp_path, "overlays/small-cpu/kustomization.yaml", "name: apexrl-actor\n    count: 4",
                  "name: apexrl-actor\n    count: 5")
    objects = m.render(copy / m.TARGETS["small-cpu"])
    assert all_problems(objects) == []
    fleet = m.Fleet(objects)
    actor = next(c for c in fleet.containers() if m.component(c.workload) == "actor")
    parsed, _ = m.parse_apexrl(m.container_argv(fleet, actor, 4)[0])
    assert (parsed.config.actor_index, parsed.config.num_actors) == (4, 5)


def test_an_unknown_field_fails_the_strict_schema(tmp_path):
    copy = _break(tmp_path, "base/evaluator.yaml", "terminationGracePeriodSeconds: 30",
                  "terminationGracePeriod: 30")
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(m.render(copy / "base")))
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "terminationGracePeriod" in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------
# components/tls (overlays/small-cpu-tls: small-cpu + the component)

def test_the_tls_component_runs_mutual_tls_with_probes_on_plaintext_health_ports(rendered, tls_secret):
    plain, tls = m.Fleet(rendered["small-cpu"]), m.Fleet(with_secrets(rendered["small-cpu-tls"], tls_secret))
    # Only the four workloads change: no new object (the Secret is made outside), the same Services, NetworkPolicy
    # (the kubelet reaches the health ports from the node) and ConfigMap.
    assert m.kind_counts(rendered["small-cpu-tls"]) == m.kind_counts(rendered["small-cpu"])
    for kind in ("Service", "NetworkPolicy", "ConfigMap", "PodDisruptionBudget", "Namespace", "ServiceAccount"):
        assert plain.all(kind) == tls.all(kind), kind
    parsed, problems = m.parsed_containers(tls)
    assert problems == []
    for c, _, p in parsed:
        cfg, ports = p.config, c.ports()
        role = m.component(c.workload)
        # Every role presents the certificate and verifies peers with the CA: mutual TLS.
        assert [tls.original_path(getattr(cfg, name)) for name in m.TLS_FILES] == \
            ["/etc/apexrl/tls/tls.crt", "/etc/apexrl/tls/tls.key", "/etc/apexrl/tls/ca.crt"], c.name
        if role in ("replay", "learner"):
            assert cfg.health_port == ports["health"] and ports["health"] != ports["grpc"], c.name
            probes = {c.spec[kind]["grpc"]["port"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
            assert probes == {ports["health"]}, c.name
        if role != "replay":
            assert cfg.tls_server_name == TLS_SERVER_NAME, c.name
        # Metrics stay plain HTTP on the same port.
        before = next(x for x in plain.containers() if x.name == c.name)
        assert ports["metrics"] == before.ports()["metrics"]
        mount = next(mt for mt in c.spec["volumeMounts"] if mt["mountPath"] == "/etc/apexrl/tls")
        volume = next(v for v in m.pod_spec(c.workload)["volumes"] if v["name"] == mount["name"])
        assert mount["readOnly"] and volume["secret"]["secretName"] == TLS_SECRET
    assert tls_secret["type"] == "kubernetes.io/tls"


def test_the_tls_component_composes_with_the_production_overlay(tmp_path, tls_secret):
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    overlay = copy / "overlays" / "production-tls"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../production\n"
        "components:\n  - ../../components/tls\n")
    objects = m.render(overlay)
    assert all_problems(with_secrets(objects, tls_secret)) == []
    learner = next(c for c in m.Fleet(objects).containers() if m.component(c.workload) == "learner")
    assert learner.spec["image"].endswith("-cuda") and "--health-port=7201" in learner.spec["args"]


def test_a_secret_that_is_not_there_is_reported(rendered):
    problems = all_problems(rendered["small-cpu-tls"])
    assert any("mounts Secret 'apexrl-tls', which is not among the objects" in p for p in problems), problems
    assert any("tls_cert (/etc/apexrl/tls/tls.crt) cannot be read" in p for p in problems), problems


TLS_ACTOR_FLAGS = ("name: apexrl-actor\n    patch: |-\n"
                   "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-cert=/etc/apexrl/tls/tls.crt}\n"
                   "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-key=/etc/apexrl/tls/tls.key}\n"
                   "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-ca=/etc/apexrl/tls/ca.crt}\n")
TLS_BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem); rendered as small-cpu-tls
    ("components/tls/servers.yaml", "readinessProbe:\n            grpc:\n              port: 7201",
     "readinessProbe:\n            grpc:\n              port: 7200", "readinessProbe must be grpc on the health"),
    ("components/tls/kustomization.yaml", "value: --health-port=7001}", "value: --health-port=7002}",
     "--health-port 7002 is not its containerPort 'health' 7001"),
    ("components/tls/kustomization.yaml", TLS_ACTOR_FLAGS + "      - {op: add, path: /spec/template/spec/"
     "containers/0/args/-, value: \"--tls-server-name=apexrl-replay.$(NAMESPACE).svc\"}\n", TLS_ACTOR_FLAGS,
     "set --tls-server-name"),
    ("components/tls/kustomization.yaml", TLS_ACTOR_FLAGS, TLS_ACTOR_FLAGS.replace(
        "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-cert=/etc/apexrl/tls/tls.crt}\n"
        "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-key=/etc/apexrl/tls/tls.key}\n",
        ""), "require client certificates but it has no --tls-cert"),
    ("components/tls/clients.yaml", "      securityContext:\n        fsGroup: 10001\n        fsGroupChangePolicy: "
     "OnRootMismatch\n      containers:\n        - name: actor", "      containers:\n        - name: actor",
     "unreadable for the pod's user"),
    ("components/tls/clients.yaml", "defaultMode: 0440\n---", "defaultMode: 0444\n---",
     "every user in the container may read it"),
    ("base/networkpolicy.yaml", "        - protocol: TCP\n          port: metrics\n    - from:",
     "        - protocol: TCP\n          port: metrics\n        - protocol: TCP\n          port: health\n"
     "    - from:", "opens the health port"),
]


@pytest.mark.parametrize(("file", "old", "new", "expected"), TLS_BREAKAGES,
                         ids=["probe-port", "health-port", "no-server-name", "no-client-cert", "no-fsgroup",
                              "world-readable-key", "policy-opens-health"])
def test_a_broken_tls_component_is_reported(tmp_path, tls_secret, file, old, new, expected):
    copy = _break(tmp_path, file, old, new)
    problems = all_problems(with_secrets(m.render(copy / m.TARGETS["small-cpu-tls"]), tls_secret))
    assert any(expected in p for p in problems), f"breaking {file} went unnoticed:\n" + "\n".join(problems)

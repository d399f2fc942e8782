"""The Kubernetes manifests under k8s/ render (`kubectl kustomize`, offline), pass the Kubernetes schema
(`kubernetes-validate --strict`), and line up across objects and with the code: every Service, probe, address,
`$(VAR)`, flag, volume, security setting and budget is checked on the rendered objects of every target
(tests/unit/deploy/manifests.py). The last tests break a copy of the manifests and require the checks to notice.
The TLS and role targets mount Secrets made outside the manifests: the tests add them, made as the guide makes them
(tests/unit/deploy/fleet_secrets.py: a CA, a certificate per role, a token per role).
"""

from __future__ import annotations

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
from tests.unit.deploy import fleet_secrets
from tests.unit.deploy import manifests as m
from tests.unit.deploy.dockerfile import image_uid

pytestmark = pytest.mark.skipif(m.kubectl_missing() is not None, reason=m.kubectl_missing() or "")

# Kubernetes versions the rendered objects are validated against: the oldest the manifests need (1.28: the
# apps.kubernetes.io/pod-index label the actors read) and the newest schema kubernetes-validate ships.
OLDEST_KUBERNETES = "1.28.0"
# Sizes each overlay promises in its kustomization.yaml.
OVERLAY_SIZES = {
    "small-cpu": {"replay": 2, "actor": 4},
    "production": {"replay": 8, "actor": 64},
    "small-cpu-tls": {"replay": 2, "actor": 4},
    "continuous-cpu": {"replay": 2, "actor": 4},
    "recurrent-cpu": {"replay": 2, "actor": 4},
}
# The name the TLS component's clients check the servers' certificates against.
TLS_SERVER_NAME = "apexrl-replay.apexrl.svc"


def stop_grace() -> float:
    """The longest a role takes to stop after SIGTERM: the launcher's stop grace, and a server's drain time."""
    launcher = next(s.default for s in settings_of(FleetSettings) if s.name == "stop_grace")
    server = grpc_util.DRAIN_GRACE_SECONDS
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
        *m.check_credentials(fleet),
        *m.check_roles(fleet),
        *m.check_documented(fleet),
        *m.check_custom_resources(fleet),
    ]


@pytest.fixture(scope="module")
def credentials() -> fleet_secrets.FleetCredentials:
    """The fleet's Secrets as the guide makes them (namespace apexrl): certificates per role, tokens per role."""
    made = fleet_secrets.make_fleet_credentials("apexrl")
    assert made.server_name == TLS_SERVER_NAME
    return made


@pytest.fixture(scope="module")
def secrets(credentials) -> list[dict]:
    return credentials.secrets()


def with_secrets(objects: list[dict], secrets: list[dict]) -> list[dict]:
    """The rendered objects plus the Secrets some pod mounts (they must exist before the pods start)."""
    fleet = m.Fleet(objects)
    mounted = {
        name
        for w in fleet.workloads()
        for v in m.pod_spec(w).get("volumes", [])
        for name, _ in m.secret_sources(v)
    }
    return [*objects, *(s for s in secrets if s["metadata"]["name"] in mounted)]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: m.render(m.K8S / path) for name, path in m.TARGETS.items()}


def test_every_target_renders_and_its_object_counts(rendered):
    for name, objects in rendered.items():
        counts = m.kind_counts(objects)
        print(f"{name}: {len(objects)} objects: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        for kind in (
            "ServiceAccount",
            "ConfigMap",
            "Service",
            "Deployment",
            "StatefulSet",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ):
            assert counts.get(kind), f"{name} renders no {kind}"
        names = {(o["kind"], o["metadata"]["name"]) for o in objects}
        for wanted in [
            ("StatefulSet", "apexrl-replay"),
            ("Service", "apexrl-replay"),
            ("Deployment", "apexrl-learner"),
            ("Service", "apexrl-learner"),
            ("StatefulSet", "apexrl-actor"),
            ("Deployment", "apexrl-evaluator"),
        ]:
            assert wanted in names, f"{name} lacks {wanted}"


@pytest.mark.parametrize("target", list(m.TARGETS))
def test_rendered_objects_pass_the_kubernetes_schema_strictly(rendered, target, tmp_path):
    path = tmp_path / f"{target}.yaml"
    path.write_text(yaml.safe_dump_all(rendered[target]))
    from kubernetes_validate.utils import latest_version

    versions = [OLDEST_KUBERNETES, latest_version()]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            *[arg for v in versions for arg in ("-k", v)],
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{target} fails the Kubernetes {versions} schemas:\n{output}"
    # Custom resources have no bundled schema and are only warned about: nothing else may be.
    for line in output.splitlines():
        if line.startswith("WARN"):
            assert re.search(
                r"kind (PodMonitor|ServiceMonitor|PrometheusRule) with api version "
                r"monitoring\.coreos\.com/",
                line,
            ), line


@pytest.mark.parametrize("target", list(m.TARGETS))
def test_objects_line_up_across_the_fleet(rendered, target, secrets):
    problems = all_problems(with_secrets(rendered[target], secrets))
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
        assert "." in registry and ":" in rest and not image.endswith(":latest"), (
            f"{c.name}: image {image} is not registry/name:tag"
        )
    requests = {
        what: sum(
            m.quantity(c.spec["resources"]["requests"][what]) * c.workload["spec"].get("replicas", 1)
            for c in fleet.containers()
        )
        for what in ("cpu", "memory")
    }
    print(f"{overlay}: {sizes}; requests {requests['cpu']:g} CPUs, {requests['memory'] / 2**30:.1f} GiB")


def test_production_runs_the_learner_on_a_gpu_and_is_scraped_by_the_operator(rendered, secrets):
    fleet = m.Fleet(with_secrets(rendered["production"], secrets))
    learner = next(c for c in fleet.containers() if m.component(c.workload) == "learner")
    assert str(learner.spec["resources"]["limits"].get("nvidia.com/gpu")) == "1"
    assert learner.spec["image"].endswith("-cuda")
    parsed, problems = m.parsed_containers(fleet)
    assert problems == [] and next(p for c, _, p in parsed if c.name == learner.name).config.device == "cuda"
    volumes = {v["name"]: v for v in m.pod_spec(learner.workload)["volumes"]}
    assert volumes["run"]["persistentVolumeClaim"]["claimName"] == "apexrl-learner-run"
    monitored = {
        m.component(fleet.selected(pm["spec"]["selector"]["matchLabels"])[0])
        for pm in fleet.all("PodMonitor")
    }
    assert monitored == {m.component(w) for w in fleet.workloads()}, "every role's metrics port is scraped"
    assert fleet.all("PrometheusRule"), "the PrometheusRule is part of the production overlay"
    others = [c for c in fleet.containers() if m.component(c.workload) != "learner"]
    assert all(
        "-cuda" not in c.spec["image"] and "nvidia.com/gpu" not in c.spec["resources"]["limits"]
        for c in others
    )


def test_the_continuous_overlay_runs_dpg_on_pendulum_with_dpgs_replay_settings(rendered):
    from apexrl.algorithms.registry import get

    data = next(
        o["data"]
        for o in rendered["continuous-cpu"]
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("apexrl-fleet")
    )
    assert (data["APEXRL_ENV"], data["APEXRL_ALGORITHM"]) == ("Pendulum-v1", "dpg")
    assert (
        float(data["APEXRL_REPLAY_SAMPLES_PER_INSERT"]) == get("dpg").defaults["fleet"]["samples_per_insert"]
    )
    for workload in m.Fleet(rendered["continuous-cpu"]).workloads():
        args = m.pod_spec(workload)["containers"][0]["args"]
        if "--env=$(APEXRL_ENV)" in args:  # learner, actors, evaluator: the same algorithm everywhere
            assert "--algorithm=$(APEXRL_ALGORITHM)" in args, workload["metadata"]["name"]


def test_the_recurrent_overlay_starts_shards_and_learner_as_apexrl_launch_would(rendered):
    """k8s/overlays/recurrent-cpu's values are what `apexrl launch --algorithm r2d2 --env CartPoleNoVel-v1` gives its
    shards and learner (launcher/commands.py): the window's length, the windows' fields, the batch of sequences and
    the algorithm's fleet defaults; a change of R2D2's defaults that the overlay does not follow fails here."""
    from apexrl.algorithms.registry import get
    from apexrl.launcher import commands
    from apexrl.launcher.topology import local_fleet

    objects = rendered["recurrent-cpu"]
    data = next(
        o["data"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("apexrl-fleet")
    )
    fleet = commands.with_algorithm(local_fleet(env=data["APEXRL_ENV"], algorithm=data["APEXRL_ALGORITHM"]))
    table = commands.sequence_table(fleet, {})
    assert (data["APEXRL_ENV"], data["APEXRL_ALGORITHM"]) == ("CartPoleNoVel-v1", "r2d2")
    assert int(data["APEXRL_REPLAY_MAX_SEQUENCE_LENGTH"]) == table["max_sequence_length"]
    assert data["APEXRL_REPLAY_ITEM_SIGNATURE"] == str(table["item_signature"])
    assert int(data["APEXRL_LEARNER_BATCH_SIZE"]) == commands.learner_sequences(fleet)["batch_size"]
    defaults = get("r2d2").defaults["fleet"]
    shards = OVERLAY_SIZES["recurrent-cpu"]["replay"]
    assert int(data["APEXRL_REPLAY_CAPACITY"]) * shards == defaults["replay_capacity"]
    assert float(data["APEXRL_REPLAY_SAMPLES_PER_INSERT"]) == defaults["samples_per_insert"]
    replay = next(w for w in m.Fleet(objects).workloads() if w["metadata"]["name"] == "apexrl-replay")
    args = m.pod_spec(replay)["containers"][0]["args"]
    assert "--max-sequence-length=$(APEXRL_REPLAY_MAX_SEQUENCE_LENGTH)" in args
    assert "--item-signature=$(APEXRL_REPLAY_ITEM_SIGNATURE)" in args


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
    (
        "base/learner.yaml",
        "      port: 7200\n      targetPort: grpc",
        "      port: 7200\n      targetPort: 7300",
        "targetPort 7300",
    ),
    ("base/actor.yaml", "svc.cluster.local:7000", "svc.cluster.local:7001", "has no port 7001"),
    (
        "base/actor.yaml",
        "apexrl-learner.$(NAMESPACE)",
        "apexrl-params.$(NAMESPACE)",
        "names Service 'apexrl-params'",
    ),
    ("base/replay.yaml", "$(APEXRL_REPLAY_ALPHA)", "$(APEXRL_REPLAY_ALFA)", "uses $(APEXRL_REPLAY_ALFA)"),
    ("base/replay.yaml", "- --capacity=", "- --capacity-rows=", "unknown flag --capacity-rows"),
    ("base/replay.yaml", "- --host=0.0.0.0", "- --host=127.0.0.1", "pods must listen on 0.0.0.0"),
    (
        "base/replay.yaml",
        "grpc:\n              port: 7000\n            periodSeconds: 5",
        "grpc:\n              port: 7001\n            periodSeconds: 5",
        "readinessProbe must be grpc",
    ),
    ("base/replay.yaml", "  clusterIP: None\n  # Only", "  # Only", "is not headless"),
    (
        "base/evaluator.yaml",
        "readOnlyRootFilesystem: true",
        "readOnlyRootFilesystem: false",
        "readOnlyRootFilesystem is not true",
    ),
    ("base/actor.yaml", "runAsUser: 10001", "runAsUser: 0", "must run as non-root user 10001"),
    (
        "base/learner.yaml",
        "terminationGracePeriodSeconds: 60",
        "terminationGracePeriodSeconds: 3",
        "terminationGracePeriodSeconds 3",
    ),
    (
        "base/learner.yaml",
        "- --run-dir=/var/lib/apexrl/learner",
        "- --run-dir=/var/lib/apexrl/elsewhere",
        "is not on a writable volume",
    ),
    (
        "base/networkpolicy.yaml",
        "apexrl-default-deny\nspec:\n  podSelector:\n    matchLabels:\n"
        "      app.kubernetes.io/part-of: apexrl",
        "apexrl-default-deny\nspec:\n  podSelector:\n    matchLabels:\n"
        "      app.kubernetes.io/part-of: other",
        "no default-deny NetworkPolicy",
    ),
    (
        "base/replay.yaml",
        "    app.kubernetes.io/component: replay\n  ports:",
        "    app.kubernetes.io/component: shard\n  ports:",
        "Service apexrl-replay selects no workload",
    ),
    (
        "base/replay.yaml",
        "maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: apexrl\n"
        "      app.kubernetes.io/component: replay",
        "maxUnavailable: 1\n  selector:\n    matchLabels:\n"
        "      app.kubernetes.io/name: apexrl\n      app.kubernetes.io/component: shard",
        "PodDisruptionBudget apexrl-replay selects no workload",
    ),
    ("base/fleet.env", "APEXRL_NUM_ACTORS=4", "APEXRL_NUM_ACTORS=4\nAPEXRL_UNUSED=1", "keys no arg uses"),
    (
        "base/fleet.env",
        "APEXRL_NUM_ACTORS=4",
        "APEXRL_NUM_ACTORS=3",
        "differs from the StatefulSet's 4 replicas",
    ),
]


def _break(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    path = copy / file
    text = path.read_text()
    assert text.count(old) == 1, f"{file}: {old!r} occurs {text.count(old)} times; make the case unambiguous"
    path.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"), BREAKAGES, ids=[f"{b[0]}:{b[2][:40]}" for b in BREAKAGES]
)
def test_a_broken_manifest_is_reported(tmp_path, file, old, new, expected):
    copy = _break(tmp_path, file, old, new)
    target = "small-cpu" if file.startswith("overlays/small-cpu") else "base"
    problems = all_problems(m.render(copy / m.TARGETS[target]))
    assert problems, f"breaking {file} ({old!r} -> {new!r}) went unnoticed"
    if expected is not None:
        assert any(expected in p for p in problems), "\n".join(problems)


def test_scaling_actors_in_an_overlay_carries_num_actors_along(tmp_path):
    copy = _break(
        tmp_path,
        "overlays/small-cpu/kustomization.yaml",
        "name: apexrl-actor\n    count: 4",
        "name: apexrl-actor\n    count: 5",
    )
    objects = m.render(copy / m.TARGETS["small-cpu"])
    assert all_problems(objects) == []
    fleet = m.Fleet(objects)
    actor = next(c for c in fleet.containers() if m.component(c.workload) == "actor")
    parsed, _ = m.parse_apexrl(m.container_argv(fleet, actor, 4)[0])
    assert (parsed.config.actor_index, parsed.config.num_actors) == (4, 5)


def test_an_unknown_field_fails_the_strict_schema(tmp_path):
    copy = _break(
        tmp_path, "base/evaluator.yaml", "terminationGracePeriodSeconds: 30", "terminationGracePeriod: 30"
    )
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(m.render(copy / "base")))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "terminationGracePeriod" in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Invariants the guides rely on (check_documented, check_pdb): each edit below breaks one promise of k8s/README.md
# or docs/deploy-kubernetes.md, and must be reported.

DOCUMENTED_BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem); rendered as base
    (
        "base/replay.yaml",
        "publishNotReadyAddresses: false",
        "publishNotReadyAddresses: true",
        "publishNotReadyAddresses is true",
    ),
    (
        "base/replay.yaml",
        "spec:\n  maxUnavailable: 1",
        "spec:\n  maxUnavailable: 3",
        "drains must take one shard at a time",
    ),
    (
        "base/replay.yaml",
        "spec:\n  maxUnavailable: 1",
        "spec:\n  minAvailable: 1",
        "drains must take one shard at a time",
    ),
    (
        "base/replay.yaml",
        "whenScaled: Retain",
        "whenScaled: Delete",
        "persistentVolumeClaimRetentionPolicy.whenScaled is Delete",
    ),
    (
        "base/replay.yaml",
        "whenDeleted: Retain",
        "whenDeleted: Delete",
        "persistentVolumeClaimRetentionPolicy.whenDeleted is Delete",
    ),
    (
        "base/actor.yaml",
        "podManagementPolicy: Parallel",
        "podManagementPolicy: OrderedReady",
        "podManagementPolicy is not Parallel",
    ),
    ("base/actor.yaml", "- --actor-index=$(ACTOR_INDEX)", "- --actor-index=0", "acts as --actor-index 0"),
    (
        "base/kustomization.yaml",
        "configMapGenerator:\n",
        "generatorOptions:\n  disableNameSuffixHash: true\nconfigMapGenerator:\n",
        "carries no content hash",
    ),
]


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    DOCUMENTED_BREAKAGES,
    ids=[
        "publish-not-ready",
        "pdb-3",
        "pdb-min-available",
        "pvc-deleted-on-scale",
        "pvc-deleted-with-statefulset",
        "ordered-actors",
        "actor-index",
        "no-hash",
    ],
)
def test_a_broken_documented_invariant_is_reported(tmp_path, file, old, new, expected):
    problems = all_problems(m.render(_break(tmp_path, file, old, new) / m.TARGETS["base"]))
    assert any(expected in p for p in problems), f"breaking {file} went unnoticed:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# NetworkPolicies (base/networkpolicy.yaml): exactly the design's connections, checked on every target above.


def test_the_network_policies_allow_exactly_the_design(rendered):
    fleet = m.Fleet(rendered["production"])
    allowed = m.network_matrix(fleet)
    print("allowed connections: " + ", ".join(f"{s}->{d}:{p}" for s, d, p in sorted(allowed)))
    assert allowed == set(m.NETWORK_DESIGN)
    assert m.dialled(m.Fleet(rendered["small-cpu"])) <= allowed
    # Nobody reaches the actors or the evaluator but Prometheus; shards and strangers dial nothing in the fleet.
    assert {s for s, d, _ in allowed if d in ("actor", "evaluator")} == {"prometheus"}
    strangers = ("replay", "no-fleet-label", "actor-elsewhere", "fleet-labelled")
    assert {d for s, d, _ in allowed if s in strangers} <= {"kube-dns"}


def test_network_policy_semantics_follow_kubernetes():
    """The evaluator the checks and the pod emulation share: selectors AND within one peer; a named port is the
    destination pod's; an isolated pod admits only what a rule allows, an unselected one everything; ipBlock
    matches addresses, less its exceptions."""

    def policy(name, selector, types, **rules):
        spec = {"podSelector": {"matchLabels": selector}, "policyTypes": types, **rules}
        return {"kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}

    fleet = m.Fleet(
        [
            policy(
                "db",
                {"app": "db"},
                ["Ingress"],
                ingress=[
                    {
                        "from": [
                            {
                                "namespaceSelector": {"matchLabels": {"team": "a"}},
                                "podSelector": {"matchLabels": {"app": "web"}},
                            }
                        ],
                        "ports": [{"port": "sql"}],
                    }
                ],
            ),
            policy(
                "locked",
                {"locked": "yes"},
                ["Egress"],
                egress=[{"to": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.9/32"]}}]}],
            ),
        ]
    )
    team_a, team_b = {"team": "a"}, {"team": "b"}
    db = m.Endpoint("db", "ns", {"app": "db"}, team_a, {"sql": (5432, "TCP")})
    web_a = m.Endpoint("web", "other", {"app": "web"}, team_a)
    web_b = m.Endpoint("web", "third", {"app": "web"}, team_b)
    cache = m.Endpoint("cache", "ns", {"app": "cache"}, team_a)
    locked = m.Endpoint("web", "ns", {"app": "web", "locked": "yes"}, team_a)
    assert m.connection_allowed(fleet, web_a, db, 5432)  # namespace and pod selector both match
    assert not m.connection_allowed(fleet, web_b, db, 5432)  # the pod matches, its namespace does not
    assert not m.connection_allowed(fleet, cache, db, 5432)  # the namespace matches, the pod does not
    assert not m.connection_allowed(fleet, web_a, db, 5433)  # the named port is 5432 only
    assert m.connection_allowed(fleet, db, cache, 80)  # nothing selects cache, nor db for egress
    assert not m.connection_allowed(fleet, locked, db, 5432)  # egress-isolated: only the ipBlock
    assert m.connection_allowed(fleet, locked, m.Endpoint("x", None, ip="203.0.113.10"), 443)
    assert not m.connection_allowed(fleet, locked, m.Endpoint("y", None, ip="203.0.113.9"), 443)


POLICY_BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem); rendered as base
    (
        "base/networkpolicy.yaml",
        "  name: apexrl-default-deny\nspec:\n  podSelector:\n    matchLabels:\n"
        "      app.kubernetes.io/part-of: apexrl\n  policyTypes:\n    - Ingress\n    - Egress\n",
        "  name: apexrl-default-deny\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/part-of: apexrl\n"
        "  policyTypes:\n    - Ingress\n",
        "no default-deny NetworkPolicy",
    ),
    (
        "base/networkpolicy.yaml",
        "  name: apexrl-actor\nspec:\n  podSelector:\n    matchLabels:\n"
        "      app.kubernetes.io/name: apexrl\n      app.kubernetes.io/component: actor\n  policyTypes:\n    - Egress\n"
        "  egress:\n    - to:\n",
        "  name: apexrl-actor\nspec:\n  podSelector:\n    matchLabels:\n"
        "      app.kubernetes.io/name: apexrl\n      app.kubernetes.io/component: actor\n  policyTypes:\n    - Egress\n"
        "  egress:\n    - {}\n    - to:\n",
        "NetworkPolicies let actor reach internet:https",
    ),
    (
        "base/networkpolicy.yaml",
        "  egress:\n    - to:\n        - podSelector:\n            matchLabels:\n"
        "              app.kubernetes.io/name: apexrl\n              app.kubernetes.io/component: replay\n"
        "      ports:\n        - protocol: TCP\n          port: grpc\n---\n# Actors",
        "  egress:\n    - to:\n        - podSelector:\n            matchLabels:\n"
        "              app.kubernetes.io/name: apexrl\n              app.kubernetes.io/component: shard\n"
        "      ports:\n        - protocol: TCP\n          port: grpc\n---\n# Actors",
        "NetworkPolicies keep learner from replay:grpc",
    ),
    (
        "base/networkpolicy.yaml",
        "  ingress:\n    - from:\n        - podSelector:\n            matchLabels:\n"
        "              app.kubernetes.io/name: apexrl\n              app.kubernetes.io/component: actor\n"
        "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: apexrl\n"
        "              app.kubernetes.io/component: learner\n",
        "  ingress:\n    - from:\n        - namespaceSelector: {}\n          podSelector:\n            matchLabels:\n"
        "              app.kubernetes.io/name: apexrl\n              app.kubernetes.io/component: actor\n"
        "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: apexrl\n"
        "              app.kubernetes.io/component: learner\n",
        "let actor-elsewhere reach replay:grpc",
    ),
    (
        "base/networkpolicy.yaml",
        "          port: 53\n        - protocol: TCP\n          port: 53",
        "          port: 53\n        - protocol: TCP\n          port: 5353",
        "keep actor from kube-dns:dns-tcp",
    ),
    (
        "base/networkpolicy.yaml",
        "              app.kubernetes.io/name: prometheus\n      ports:\n        - protocol: TCP\n"
        "          port: metrics\n",
        "              app.kubernetes.io/name: prometheus\n",
        "let prometheus reach replay:grpc",
    ),
    (
        "base/networkpolicy.yaml",
        "          port: metrics\n",
        "          port: metrix\n",
        "port 'metrix' names no containerPort",
    ),
]


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    POLICY_BREAKAGES,
    ids=[
        "no-default-deny",
        "actor-egress-anywhere",
        "learner-cut-off",
        "actors-of-any-namespace",
        "dns-tcp-port",
        "prometheus-any-port",
        "port-typo",
    ],
)
def test_a_broken_network_policy_is_reported(tmp_path, file, old, new, expected):
    problems = all_problems(m.render(_break(tmp_path, file, old, new) / m.TARGETS["base"]))
    assert any(expected in p for p in problems), f"breaking {file} went unnoticed:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# components/tls (overlays/small-cpu-tls: small-cpu + the component; production has it too)

ROLE_TLS_SECRETS = {
    "replay": "apexrl-tls-replay",
    "learner": "apexrl-tls-learner",
    "actor": "apexrl-tls-actor",
    "evaluator": "apexrl-tls-evaluator",
}


def test_the_tls_component_runs_mutual_tls_with_a_certificate_per_role(rendered, secrets):
    plain, tls = m.Fleet(rendered["small-cpu"]), m.Fleet(with_secrets(rendered["small-cpu-tls"], secrets))
    # Only the four workloads change: no new object (the Secrets are made outside), the same Services,
    # NetworkPolicies (the kubelet reaches the health ports from the node) and ConfigMap.
    assert m.kind_counts(rendered["small-cpu-tls"]) == m.kind_counts(rendered["small-cpu"])
    for kind in (
        "Service",
        "NetworkPolicy",
        "ConfigMap",
        "PodDisruptionBudget",
        "Namespace",
        "ServiceAccount",
    ):
        assert plain.all(kind) == tls.all(kind), kind
    parsed, problems = m.parsed_containers(tls)
    assert problems == []
    for c, _, p in parsed:
        cfg, ports = p.config, c.ports()
        role = m.component(c.workload)
        # Every role presents its own certificate and verifies peers with the CA: mutual TLS.
        assert [tls.original_path(getattr(cfg, name)) for name in m.TLS_FILES] == [
            "/etc/apexrl/tls/tls.crt",
            "/etc/apexrl/tls/tls.key",
            "/etc/apexrl/tls/ca.crt",
        ], c.name
        if role in ("replay", "learner"):
            assert cfg.health_port == ports["health"] and ports["health"] != ports["grpc"], c.name
            probes = {
                c.spec[kind]["grpc"]["port"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")
            }
            assert probes == {ports["health"]}, c.name
        if role != "replay":
            assert cfg.tls_server_name == TLS_SERVER_NAME, c.name
        # Metrics stay plain HTTP on the same port.
        before = next(x for x in plain.containers() if x.name == c.name)
        assert ports["metrics"] == before.ports()["metrics"]
        # Its role's Secret, and no other: the shards' server key is in no other pod.
        mounted = {
            name
            for mt in m.secret_mounts(c)
            for v in m.pod_spec(c.workload)["volumes"]
            if v["name"] == mt["name"]
            for name, _ in m.secret_sources(v)
        }
        assert mounted == {ROLE_TLS_SECRETS[role]}, c.name
        assert all(mt["readOnly"] for mt in m.secret_mounts(c)), c.name


def test_a_secret_that_is_not_there_is_reported(rendered):
    problems = all_problems(rendered["small-cpu-tls"])
    assert any("mounts Secret 'apexrl-tls-replay', which is not among the objects" in p for p in problems), (
        problems
    )
    assert any("tls_cert (/etc/apexrl/tls/tls.crt) cannot be read" in p for p in problems), problems


TLS_ACTOR_FLAGS = (
    "name: apexrl-actor\n    patch: |-\n"
    "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-cert=/etc/apexrl/tls/tls.crt}\n"
    "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-key=/etc/apexrl/tls/tls.key}\n"
    "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-ca=/etc/apexrl/tls/ca.crt}\n"
)
TLS_BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem); rendered as small-cpu-tls
    (
        "components/tls/servers.yaml",
        "readinessProbe:\n            grpc:\n              port: 7201",
        "readinessProbe:\n            grpc:\n              port: 7200",
        "readinessProbe must be grpc on the health",
    ),
    (
        "components/tls/kustomization.yaml",
        "value: --health-port=7001}",
        "value: --health-port=7002}",
        "--health-port 7002 is not its containerPort 'health' 7001",
    ),
    (
        "components/tls/kustomization.yaml",
        TLS_ACTOR_FLAGS + "      - {op: add, path: /spec/template/spec/"
        'containers/0/args/-, value: "--tls-server-name=apexrl-replay.$(NAMESPACE).svc"}\n',
        TLS_ACTOR_FLAGS,
        "set --tls-server-name",
    ),
    (
        "components/tls/kustomization.yaml",
        TLS_ACTOR_FLAGS,
        TLS_ACTOR_FLAGS.replace(
            "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-cert=/etc/apexrl/tls/tls.crt}\n"
            "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-key=/etc/apexrl/tls/tls.key}\n",
            "",
        ),
        "require client certificates but it has no --tls-cert",
    ),
    (
        "components/tls/clients.yaml",
        "      securityContext:\n        fsGroup: 10001\n        fsGroupChangePolicy: "
        "OnRootMismatch\n      containers:\n        - name: actor",
        "      containers:\n        - name: actor",
        "unreadable for the pod's user",
    ),
    (
        "components/tls/clients.yaml",
        "defaultMode: 0440\n---",
        "defaultMode: 0444\n---",
        "every user in the container may read it",
    ),
    # The shards' server key in the actors' pods (as the one shared Secret had it).
    (
        "components/tls/clients.yaml",
        "secretName: apexrl-tls-actor",
        "secretName: apexrl-tls-replay",
        "Secret apexrl-tls-replay is the --tls-key of several roles (actor, replay)",
    ),
    # A Secret mounted where no flag uses it.
    (
        "components/tls/clients.yaml",
        "      volumes:\n        - name: tls\n          secret:\n"
        "            secretName: apexrl-tls-evaluator\n",
        "      volumes:\n        - name: spare\n          secret:\n"
        "            secretName: apexrl-tls-replay\n        - name: tls\n          secret:\n"
        "            secretName: apexrl-tls-evaluator\n",
        "NOTUSED",
    ),
    (
        "base/networkpolicy.yaml",
        "      ports:\n        - protocol: TCP\n          port: metrics\n---\n# Shards",
        "      ports:\n        - protocol: TCP\n          port: metrics\n        - protocol: TCP\n          port: health\n"
        "---\n# Shards",
        "reach replay:health (7001/TCP), which only the kubelet needs",
    ),
]


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    TLS_BREAKAGES,
    ids=[
        "probe-port",
        "health-port",
        "no-server-name",
        "no-client-cert",
        "no-fsgroup",
        "world-readable-key",
        "server-key-on-actors",
        "unused-secret",
        "policy-opens-health",
    ],
)
def test_a_broken_tls_component_is_reported(tmp_path, secrets, file, old, new, expected):
    copy = _break(tmp_path, file, old, new)
    if expected == "NOTUSED":  # the spare volume needs a mount to be one the container has
        path = copy / file
        path.write_text(
            path.read_text().replace(
                "        - name: evaluator\n          volumeMounts:\n",
                "        - name: evaluator\n          volumeMounts:\n            - name: spare\n"
                "              mountPath: /etc/apexrl/spare\n              readOnly: true\n",
            )
        )
        expected = "mounts Secret apexrl-tls-replay at /etc/apexrl/spare, which none of its flags reads"
    problems = all_problems(with_secrets(m.render(copy / m.TARGETS["small-cpu-tls"]), secrets))
    assert any(expected in p for p in problems), f"breaking {file} went unnoticed:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# components/roles (in overlays/production, with components/tls)


def test_production_runs_tls_and_role_credentials_with_least_privilege(rendered, secrets, credentials):
    fleet = m.Fleet(with_secrets(rendered["production"], secrets))
    parsed, problems = m.parsed_containers(fleet)
    assert problems == []
    verified = {"replay": {"actor", "learner", "operator"}, "learner": {"actor", "evaluator", "operator"}}
    for c, _, p in parsed:
        cfg, role = p.config, m.component(c.workload)
        if role in verified:  # the servers verify exactly the roles that dial them (and the operator's)
            directory = Path(cfg.role_tokens)
            assert fleet.original_path(str(directory)) == "/etc/apexrl/role-tokens", c.name
            assert {f.name for f in directory.iterdir()} == verified[role], c.name
            assert {f.name: f.read_text() for f in directory.iterdir()} == {
                r: credentials.tokens[r] for r in verified[role]
            }, c.name
            assert not cfg.certificate_roles, c.name
        if role != "replay":  # every client sends its own role's token, from its own Secret
            assert fleet.original_path(cfg.token_file) == "/etc/apexrl/token/token", c.name
            assert Path(cfg.token_file).read_text() == credentials.tokens[role], c.name
            assert cfg.token is None, c.name
        mounted = {
            name
            for mt in m.secret_mounts(c)
            for v in m.pod_spec(c.workload)["volumes"]
            if v["name"] == mt["name"]
            for name, _ in m.secret_sources(v)
        }
        tokens = {f"apexrl-token-{r}" for r in verified.get(role, set())} | (
            {f"apexrl-token-{role}"} if role != "replay" else set()
        )
        assert mounted == {ROLE_TLS_SECRETS[role], *tokens}, c.name
    shard = next(p.config for c, _, p in parsed if p.subcommand == "replay")
    assert (
        str(shard.signature)
        == m.actor_signature("CartPole-v1")
        == "obs:float32[4],action:int64[],reward:float32[],discount:float32[],next_obs:float32[4],weight_version:int64[]"
    )


def test_the_roles_component_adds_no_object_and_composes_with_small_cpu(tmp_path, secrets):
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    overlay = copy / "overlays" / "secure"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../small-cpu\n"
        "components:\n  - ../../components/tls\n  - ../../components/roles\n"
    )
    objects = m.render(overlay)
    assert m.kind_counts(objects) == m.kind_counts(m.render(m.K8S / m.TARGETS["small-cpu"]))
    assert all_problems(with_secrets(objects, secrets)) == []
    # Without the operator's Secret (optional) the servers start and verify the three other roles.
    without_operator = [s for s in secrets if s["metadata"]["name"] != "apexrl-token-operator"]
    assert all_problems(with_secrets(objects, without_operator)) == []


ROLES_BREAKAGES = [
    # (file under k8s/, text, replacement, a fragment of the expected problem); rendered as production
    (
        "components/roles/clients.yaml",
        "secretName: apexrl-token-actor",
        "secretName: apexrl-token-learner",
        "is not the actor token StatefulSet/apexrl-replay/replay verifies",
    ),
    (
        "components/roles/clients.yaml",
        "secretName: apexrl-token-actor",
        "secretName: apexrl-token-learner",
        "Secret apexrl-token-learner is the --token-file of several roles (actor, learner)",
    ),
    (
        "components/roles/servers.yaml",
        "              - secret:\n                  name: apexrl-token-learner\n"
        "                  items: [{key: token, path: learner}]\n",
        "",
        "learner dials it, but --role-tokens holds no learner token",
    ),
    (
        "components/roles/servers.yaml",
        "                  items: [{key: token, path: learner}]\n",
        "                  items: [{key: token, path: learner}]\n              - secret:\n"
        "                  name: apexrl-token-evaluator\n                  items: [{key: token, path: evaluator}]\n",
        "holds the evaluator token, but no evaluator dials it",
    ),
    (
        "components/roles/kustomization.yaml",
        '      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--signature=$(APEXRL_REPLAY_SIGNATURE)"}\n',
        "",
        "pins no --signature",
    ),
    (
        "components/roles/kustomization.yaml",
        "next_obs:float32[4],weight_version:int64[]",
        "next_obs:float32[4]",
        "is not what the actors write for CartPole-v1",
    ),
    (
        "components/roles/servers.yaml",
        "          projected:\n            defaultMode: 0440\n            sources:\n"
        "              - secret:\n                  name: apexrl-token-actor\n                  items: [{key: token, path: "
        "actor}]\n              - secret:\n                  name: apexrl-token-learner",
        "          projected:\n            defaultMode: 0444\n            sources:\n"
        "              - secret:\n                  name: apexrl-token-actor\n                  items: [{key: token, path: "
        "actor}]\n              - secret:\n                  name: apexrl-token-learner",
        "the role tokens actor has mode 0o444",
    ),
    (
        "components/roles/kustomization.yaml",
        "      name: apexrl-evaluator\n    patch: |-\n"
        "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --token-file=/etc/apexrl/token/token}",
        "      name: apexrl-evaluator\n    patch: |-\n      - {op: add, path: /spec/template/spec/containers/0/args/-, "
        "value: --num-envs=1}",
        "the servers verify role tokens, but it sends none",
    ),
    (
        "components/roles/kustomization.yaml",
        "      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --role-tokens=/etc/apexrl/role-tokens}\n"
        "  - target:\n      kind: StatefulSet\n      name: apexrl-actor",
        "  - target:\n      kind: StatefulSet\n      name: apexrl-actor",
        "some servers verify role tokens, others do not",
    ),
    (
        "components/roles/kustomization.yaml",
        "value: --role-tokens=/etc/apexrl/role-tokens}\n      - {op: add, path: /spec/template/spec/containers/0/args/-, "
        'value: "--signature',
        "value: --role-tokens=/etc/apexrl/role-tokens}\n      - {op: add, path: /spec/template/spec/containers/0/args/-, "
        'value: --certificate-roles}\n      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--signature',
        "--certificate-roles beside --role-tokens",
    ),
    (
        "overlays/production/kustomization.yaml",
        "      - APEXRL_ACTOR_NUM_ENVS=4\n",
        "      - APEXRL_ACTOR_NUM_ENVS=4\n      - APEXRL_ENV=Acrobot-v1\n",
        "is not what the actors write for Acrobot-v1",
    ),
]


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    ROLES_BREAKAGES,
    ids=[
        "actor-sends-learner-token",
        "token-secret-shared",
        "shards-miss-learner",
        "shards-hold-evaluator",
        "no-signature",
        "wrong-signature",
        "world-readable-tokens",
        "evaluator-sends-none",
        "learner-verifies-none",
        "certificate-roles-too",
        "env-changed-signature-not",
    ],
)
def test_a_broken_roles_component_is_reported(tmp_path, secrets, file, old, new, expected):
    copy = _break(tmp_path, file, old, new)
    problems = all_problems(with_secrets(m.render(copy / m.TARGETS["production"]), secrets))
    assert any(expected in p for p in problems), f"breaking {file} went unnoticed:\n" + "\n".join(problems)

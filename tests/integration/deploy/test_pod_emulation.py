"""The manifests are what runs (issue 7, item 4): the small-cpu overlay, rendered by `kubectl kustomize`, executed as
real processes, one network namespace per pod, by the kubelet/DNS/kube-proxy emulation in pods.py (its docstring
says what is emulated and how): each container's command, args and env exactly as the rendered objects give them,
under its own hostname, user, read-only root and volumes; Service names resolved per pod as the cluster DNS would,
headless names only to Ready pods, the ClusterIP Service through a virtual IP; the pods' own probes decide
readiness. The fleet must serve, insert, sample and publish weights through exactly those names and ports, every
metrics port must answer, and every pod must stop with status 0 within its terminationGracePeriodSeconds after
SIGTERM.

The second test breaks a copy of the manifests in a way the offline checks (tests/unit/deploy) do not see, and
requires the emulation to report that the fleet cannot reach its shards.

The third runs the TLS component (overlays/small-cpu-tls with one actor): the Secrets it mounts (a certificate per
role, the servers' for the one name every client checks, apexrl-replay.apexrl.svc) are made here as the guide makes
them (tests/unit/deploy/fleet_secrets.py) and added to the objects. The fleet must train over mutual TLS between
pod addresses that certificate does not name, with the probes on the plaintext health ports while the gRPC ports
refuse plaintext, each pod holding its own role's key only.

The fourth runs the production overlay's security (components tls + roles) on the small fleet, with the
NetworkPolicies enforced (every test here enforces them) and three visitors: Prometheus, an intruder pod of the
fleet's namespace, an actor-labelled pod of another namespace. The fleet must train with its role tokens; what each
role may not do must be refused, for real: the actor's own credentials from its own pod (Sample, UpdatePriorities,
Checkpoint, Publish: PERMISSION_DENIED), a shard's key with the learner token the shard holds (its certificate
cannot dial), a certificate without a token (UNAUTHENTICATED), and every connection the policies do not allow.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apexrl.common.errors import UnauthenticatedError, UnavailableError
from apexrl.common.grpc_util import make_channel
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.integration.deploy import pods
from tests.unit.deploy import fleet_secrets
from tests.unit.deploy import manifests as m

pytest_plugins = ("tests.support.fixtures",)
pytestmark = pytest.mark.skipif(m.kubectl_missing() is not None, reason=m.kubectl_missing() or "")

OVERLAY = "overlays/small-cpu"
# The one name every client checks the servers' certificates against (--tls-server-name, components/tls).
SERVER_NAME = "apexrl-replay.apexrl.svc"
# Everything below must happen within BUDGET seconds of the pods' start, so a slow machine fails with the fleet's
# state (PodFailure) rather than with pytest-timeout's traceback; SIGTERM and the teardown need the rest.
BUDGET = 170.0
ROLE_METRICS = {
    "replay": "apexrl_replay_",
    "learner": "apexrl_learner_",
    "actor": "apexrl_actor_",
    "evaluator": "apexrl_actor_",
}


class Deadline:
    def __init__(self, cluster: pods.Cluster, budget: float) -> None:
        self.cluster, self.end = cluster, time.monotonic() + budget

    def wait(self, condition, what: str, timeout: float):
        return self.cluster.wait(condition, what, min(timeout, max(1.0, self.end - time.monotonic())))


def metrics_port(pod: pods.Pod) -> int:
    return m.Container(pod.workload, pod.container).ports()["metrics"]


def shard_counts(clients: dict[str, ReplayClient]) -> dict[str, tuple[int, int]]:
    return {
        name: (info.inserted_total, info.sampled_total)
        for name, info in ((name, c.info(timeout=3)) for name, c in clients.items())
    }


def written_and_sampled(clients: dict[str, ReplayClient]) -> bool:
    return all(inserted > 0 and sampled > 0 for inserted, sampled in shard_counts(clients).values())


def check_sandbox(pod: pods.Pod) -> None:
    """The running process is what the pod's securityContext and volumes say: its user and groups, no
    capabilities, no_new_privs, its hostname, and (read-only root filesystem) writable only where a volume is."""
    pod_sc = m.pod_spec(pod.workload).get("securityContext", {})
    sc = {**pod_sc, **pod.container.get("securityContext", {})}
    facts = pods.inspect_process(pod.process.pid)
    assert facts["uids"] == {sc["runAsUser"]} and facts["gids"] == {sc["runAsGroup"]}, (pod.name, facts)
    assert set(facts["groups"]) == {
        sc["runAsGroup"],
        *([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []),
    }, (pod.name, facts)
    assert facts["cap_eff"] == 0 and facts["no_new_privs"] == (sc.get("allowPrivilegeEscalation") is False), (
        facts
    )
    assert facts["hostname"] == pod.name, (pod.name, facts)
    if sc.get("readOnlyRootFilesystem"):
        projected = {
            v["name"]
            for v in m.pod_spec(pod.workload).get("volumes", [])
            if {"configMap", "secret", "projected"} & set(v)
        }
        volumes = sorted(
            v["mountPath"]
            for v in pod.container.get("volumeMounts", [])
            if not v.get("readOnly") and v["name"] not in projected
        )
        assert facts["writable"] == volumes, (
            f"{pod.name} can write to {facts['writable']}, its volumes: {volumes}"
        )


def hosts_file(cluster: pods.Cluster, pod: pods.Pod) -> str:
    text = (pods.NETNS_ETC / cluster.network[pod.label].netns / "hosts").read_text()
    return "\n".join(line for line in text.splitlines() if line.strip("#"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_small_cpu_overlay_runs_as_pods_and_trains_through_its_service_names(netns_network, tmp_path):
    objects = m.render(m.K8S / OVERLAY)
    host_had_var_lib_apexrl = Path("/var/lib/apexrl").exists()
    started = time.monotonic()
    with pods.Cluster(objects, netns_network, tmp_path) as cluster:
        print(f"\n{OVERLAY}: {len(cluster.pods)} pods: " + ", ".join(p.name for p in cluster.pods))
        cluster.start()
        deadline = Deadline(cluster, BUDGET)
        deadline.wait(cluster.all_ready, "every pod passes its startup and readiness probes", timeout=150)
        print(f"[{cluster.elapsed():6.1f}s] every pod is Ready")

        shards = cluster.pods_of("apexrl-replay")
        shard_port = cluster.service_port("apexrl-replay", "grpc")
        learner_service = cluster.service("apexrl-learner")
        params_port = cluster.service_port("apexrl-learner", "grpc")
        clients = {p.name: ReplayClient(f"{p.ip}:{shard_port}", timeout=3) for p in shards}
        params = ParameterClient(f"{learner_service.vip}:{params_port}", timeout=3)
        try:
            deadline.wait(
                lambda: written_and_sampled(clients),
                "every shard is written to and sampled (ReplayService Info at POD_IP:SERVICE_PORT)",
                timeout=120,
            )
            counts = shard_counts(clients)
            print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}")

            first = deadline.wait(params.version, "the learner publishes weights (Service VIP)", timeout=60)
            version = deadline.wait(
                lambda: (v := params.version()) > first and v,
                f"the published weights version grows past {first}",
                timeout=90,
            )
            print(
                f"[{cluster.elapsed():6.1f}s] parameter service at {learner_service.vip}:{params_port} "
                f"(Service apexrl-learner): version {first} -> {version}"
            )

            actors = [p for p in cluster.pods if m.component(p.workload) in ("actor", "evaluator")]
            deadline.wait(
                lambda: all(
                    pods.scrape(p.ip, metrics_port(p)).get("apexrl_actor_weight_version", 0) > 0
                    for p in actors
                ),
                "every actor and the evaluator act with published weights (apexrl_actor_weight_version)",
                timeout=60,
            )

            scraped = {}
            for pod in cluster.pods:
                values = pods.scrape(pod.ip, metrics_port(pod))
                prefix = ROLE_METRICS[m.component(pod.workload)]
                assert any(name.startswith(prefix) for name in values), (
                    f"{pod.name}: metrics port {metrics_port(pod)} serves no {prefix}* series"
                )
                scraped[pod.name] = values
            counts = shard_counts(clients)
            for pod in cluster.pods:
                check_sandbox(pod)
            cluster.check()
        finally:
            for client in clients.values():
                client.close()
            params.close()

        learner = cluster.pods_of("apexrl-learner")[0]
        env_steps = sum(
            scraped[p.name].get("apexrl_actor_env_steps_total", 0)
            for p in actors
            if m.component(p.workload) == "actor"
        )
        print(
            f"[{cluster.elapsed():6.1f}s] env steps {env_steps:.0f} (exploring actors), learner updates "
            f"{scraped[learner.name].get('apexrl_learner_updates_total', 0):.0f}, published version "
            f"{scraped[learner.name].get('apexrl_learner_weight_version', 0):.0f}; weights held: "
            + ", ".join(f"{p.name} v{scraped[p.name]['apexrl_actor_weight_version']:.0f}" for p in actors)
        )
        print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}")

        print(f"/etc/hosts of {learner.name}:\n" + textwrap.indent(hosts_file(cluster, learner), "    "))
        stopped = cluster.terminate()
        print(
            f"{'pod':<34} {'address':<14} {'ready after':>11} {'exit':>5} {'stopped in':>10} {'grace':>6} "
            f"{'peak RSS':>9} {'mem limit':>9} {'CPU s':>6}  probes passed/failed (startup readiness liveness)"
        )
        for pod in cluster.pods:
            limit = pod.memory_limit()
            probes = " ".join(f"{ok}/{failed}" for ok, failed in pod.probe_counts.values())
            print(
                f"{pod.name:<34} {pod.ip:<14} {pod.ready_after or 0:>10.1f}s {str(pod.exit_code):>5} "
                f"{pod.stop_seconds:>9.1f}s {pod.grace:>5.0f}s {(pod.peak_rss or 0) / 2**20:>7.0f}Mi "
                f"{(limit or 0) / 2**20:>7.0f}Mi {pod.cpu_seconds or 0:>6.1f}  {probes}"
            )
        print(f"whole run: {time.monotonic() - started:.0f} s")
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, (
            "every pod exits 0 on SIGTERM: "
            + "\n".join(
                f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}" for p in cluster.pods if p.exit_code != 0
            )
        )
        run_dir = learner.directory / "volumes" / "run"
        written = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        print(f"the learner's --run-dir (its volume 'run'): {written}")
        assert any(name.startswith("checkpoints/") for name in written), written
        assert Path("/var/lib/apexrl").exists() == host_had_var_lib_apexrl, (
            "a pod wrote to this machine's /var/lib"
        )
        for pod in cluster.pods:
            assert pod.stop_seconds <= pod.grace, f"{pod.name} took {pod.stop_seconds:.1f} s > {pod.grace} s"
            limit = pod.memory_limit()
            # Only a necessary condition for the memory limit (a cgroup also counts page cache): never above it.
            assert limit is None or pod.peak_rss is None or pod.peak_rss < limit, (
                f"{pod.name}: peak RSS {pod.peak_rss / 2**20:.0f} MiB exceeds its memory limit {limit / 2**20:.0f} MiB"
            )


def broken_overlay(tmp_path: Path) -> Path:
    """A copy of k8s/ with an overlay on top of small-cpu whose shards listen on 7001 (args, containerPort and probes
    agree, so the pods become Ready) while the headless Service and everyone dialling it keep port 7000. The offline
    checks accept it (the Service's targetPort names the grpc containerPort, wherever that is), but a headless
    Service forwards nothing: clients dial POD_IP:7000. Smaller fleet: one actor, no evaluator."""
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    broken = copy / "overlays" / "broken"
    broken.mkdir()
    (broken / "kustomization.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources:
          - ../small-cpu
        replicas:
          - name: apexrl-actor
            count: 1
          - name: apexrl-evaluator
            count: 0
        configMapGenerator:
          - name: apexrl-fleet
            behavior: merge
            literals:
              - APEXRL_NUM_ACTORS=1
        patches:
          - target: {kind: StatefulSet, name: apexrl-replay}
            patch: |-
              - {op: replace, path: /spec/template/spec/containers/0/args/3, value: --port=7001}
              - {op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: 7001}
              - {op: replace, path: /spec/template/spec/containers/0/startupProbe/grpc/port, value: 7001}
              - {op: replace, path: /spec/template/spec/containers/0/readinessProbe/grpc/port, value: 7001}
              - {op: replace, path: /spec/template/spec/containers/0/livenessProbe/grpc/port, value: 7001}
        """)
    )
    return broken


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_shard_port_the_service_does_not_use_is_reported(netns_network, tmp_path):
    objects = m.render(broken_overlay(tmp_path))
    fleet = m.Fleet(objects)
    replay = fleet.get("StatefulSet", "apexrl-replay")
    assert "--port=7001" in m.pod_spec(replay)["containers"][0]["args"], "the patch missed the shard's --port"
    static = [*m.check_services(fleet), *m.check_probes(fleet), *m.check_args(fleet)]
    assert static == [], f"the offline checks now see this breakage (fine, but pick another): {static}"

    with pods.Cluster(objects, netns_network, tmp_path / "run") as cluster:
        cluster.start()
        deadline = Deadline(cluster, BUDGET)
        deadline.wait(
            cluster.all_ready, "every pod is Ready (the shards' probes are on their real port)", timeout=150
        )
        actor = cluster.pods_of("apexrl-actor")[0]
        # The actor inserts from its start (random actions until the first weights: act_before_weights), and with
        # no shard reachable it may block on its full backlogs before it ever fetches weights: no wait for them.
        # The actor's inserts to the shards' Service port fail (positive evidence, not a wait for a timeout)...
        failing = re.compile(r".*insert stream to \S+ failed.*")
        deadline.wait(
            lambda: failing.search(actor.log_tail(100_000)),
            "the actor's inserts to the shards' Service port fail",
            timeout=60,
        )
        print(f"\nactor: {failing.search(actor.log_tail(100_000)).group(0)}")
        shards = cluster.pods_of("apexrl-replay")
        clients = {p.name: ReplayClient(f"{p.ip}:7001", timeout=3) for p in shards}
        try:
            # ...and the emulation reports the fleet as not training.
            with pytest.raises(pods.PodFailure) as failure:
                deadline.wait(
                    lambda: written_and_sampled(clients), "every shard is written to and sampled", timeout=5
                )
            counts = shard_counts(clients)
        finally:
            for client in clients.values():
                client.close()
        message = str(failure.value)
        print(
            f"\nreported: {message.splitlines()[0]}\nshards (inserted, sampled) on their real port: {counts}"
        )
        assert "timed out" in message and "written to and sampled" in message
        assert all(inserted == 0 for inserted, _ in counts.values()), counts
        cluster.terminate()


TLS_BUDGET = 50.0


def small_overlay(
    tmp_path: Path, base: str, components: tuple[str, ...] = (), literals: tuple[str, ...] = ()
) -> Path:
    """`base` (an overlay under k8s/overlays) with one actor and the given components (and fleet settings,
    KEY=VALUE), in a copy of k8s/: every workload the components patch, one pod each but the two shards (whose
    different addresses the servers' certificate must cover)."""
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    overlay = copy / "overlays" / "emulated"
    overlay.mkdir()
    listed = "".join(f"  - ../../components/{c}\n" for c in components)
    (overlay / "kustomization.yaml").write_text(
        textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources:
          - ../{base}
        replicas:
          - name: apexrl-actor
            count: 1
        configMapGenerator:
          - name: apexrl-fleet
            behavior: merge
            literals:
              - APEXRL_NUM_ACTORS=1
        """)
        + "".join(f"      - {literal}\n" for literal in literals)
        + (f"components:\n{listed}" if components else "")
    )
    return overlay


def test_the_recurrent_overlay_trains_r2d2_on_sequence_shards(netns_network, tmp_path):
    """k8s/overlays/recurrent-cpu (R2D2 on CartPoleNoVel-v1) as pods, one actor: the shards are sequence tables
    with the overlay's window and fields, the actor's windows reach both, the learner samples them and publishes
    weights the actor then plays, and every pod stops with status 0 (smaller minimum sizes, so a minute suffices)."""
    overlay = small_overlay(
        tmp_path,
        "recurrent-cpu",
        literals=("APEXRL_REPLAY_MIN_SIZE_TO_SAMPLE=50", "APEXRL_LEARNER_MIN_REPLAY_SIZE=100"),
    )
    objects = m.render(overlay)
    data = next(o["data"] for o in objects if o["kind"] == "ConfigMap")
    with pods.Cluster(objects, netns_network, tmp_path) as cluster:
        cluster.start()
        deadline = Deadline(cluster, BUDGET)
        deadline.wait(cluster.all_ready, "every pod passes its startup and readiness probes", timeout=150)
        shard_port = cluster.service_port("apexrl-replay", "grpc")
        clients = {
            p.name: ReplayClient(f"{p.ip}:{shard_port}", timeout=3) for p in cluster.pods_of("apexrl-replay")
        }
        try:
            infos = {name: c.info(timeout=3) for name, c in clients.items()}
            for name, info in infos.items():
                assert info.max_sequence_length == int(data["APEXRL_REPLAY_MAX_SEQUENCE_LENGTH"]), name
                assert str(info.item_signature) == data["APEXRL_REPLAY_ITEM_SIGNATURE"], name
            deadline.wait(
                lambda: all(
                    i.items_inserted_total > 0 and i.sampled_total > 0
                    for i in (c.info(timeout=3) for c in clients.values())
                ),
                "both shards hold windows and are sampled",
                timeout=120,
            )
            actor = cluster.pods_of("apexrl-actor")[0]
            deadline.wait(
                lambda: pods.scrape(actor.ip, metrics_port(actor)).get("apexrl_actor_weight_version", 0) > 1,
                "the actor plays weights the learner published after training on the windows",
                timeout=90,
            )
            print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {shard_counts(clients)}")
            cluster.check()
        finally:
            for client in clients.values():
                client.close()
        stopped = cluster.terminate()
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, (
            "\n".join(
                f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}" for p in cluster.pods if p.exit_code != 0
            )
        )


def grpc_port_refuses_plaintext(address: str) -> bool:
    with make_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.UNAVAILABLE
    return False


def client_tls(files: dict[str, str], server_name: str | None = SERVER_NAME) -> TlsFiles:
    return TlsFiles.read(files["cert"], files["key"], files["ca"], server_name=server_name)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_tls_component_trains_over_mutual_tls_with_probes_on_the_health_ports(netns_network, tmp_path):
    credentials = fleet_secrets.make_fleet_credentials("apexrl")
    files = credentials.write(tmp_path / "credentials")
    secrets = [s for s in credentials.secrets() if s["type"] == "kubernetes.io/tls"]
    objects = [*m.render(small_overlay(tmp_path, "small-cpu-tls")), *secrets]
    operator = client_tls(
        files["operator"]
    )  # a client certificate of the fleet's CA (common name `operator`)
    started = time.monotonic()
    with pods.Cluster(objects, netns_network, tmp_path / "run") as cluster:
        print(
            f"\nsmall-cpu-tls with one actor: {len(cluster.pods)} pods: "
            + ", ".join(p.name for p in cluster.pods)
        )
        cluster.start()
        assert all(
            "--tls-server-name=apexrl-replay.apexrl.svc" in p.argv
            for p in cluster.pods
            if m.component(p.workload) != "replay"
        )
        deadline = Deadline(cluster, TLS_BUDGET)
        deadline.wait(
            cluster.all_ready,
            "every pod passes its probes (gRPC on the plaintext health ports)",
            timeout=TLS_BUDGET,
        )
        print(f"[{cluster.elapsed():6.1f}s] every pod is Ready")
        shards = cluster.pods_of("apexrl-replay")
        learner = cluster.pods_of("apexrl-learner")[0]
        actor = cluster.pods_of("apexrl-actor")[0]
        shard_port = cluster.service_port("apexrl-replay", "grpc")
        learner_service = cluster.service("apexrl-learner")
        params_port = cluster.service_port("apexrl-learner", "grpc")
        for pod in (*shards, learner):  # the probes ran on the health port; the gRPC port refuses plaintext
            health = pod.port("health")
            assert {probe.spec["grpc"]["port"] for probe in pod.probes().values()} == {health}, pod.name
            assert pod.probe_counts["readinessProbe"][0] > 0, pod.name
            assert grpc_port_refuses_plaintext(f"{pod.ip}:{pod.port('grpc')}"), pod.name
        clients = {p.name: ReplayClient(f"{p.ip}:{shard_port}", timeout=3, tls=operator) for p in shards}
        params = ParameterClient(f"{learner_service.vip}:{params_port}", timeout=3, tls=operator)
        try:
            deadline.wait(
                lambda: written_and_sampled(clients),
                "every shard is written to and sampled over mutual TLS",
                timeout=TLS_BUDGET,
            )
            version = deadline.wait(
                params.version, "the learner publishes weights over mutual TLS", timeout=TLS_BUDGET
            )
            # Metrics stay plain HTTP.
            players = [actor, *cluster.pods_of("apexrl-evaluator")]
            deadline.wait(
                lambda: all(
                    pods.scrape(p.ip, metrics_port(p)).get("apexrl_actor_weight_version", 0) for p in players
                ),
                "the actor and the evaluator act with published weights (pulled over mutual TLS)",
                timeout=TLS_BUDGET,
            )
            counts = shard_counts(clients)
            print(
                f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}; weights version {version}"
            )
            # Without the name, a client checks the pod address, which the certificate does not name.
            with (
                ReplayClient(
                    f"{shards[0].ip}:{shard_port}", timeout=3, tls=client_tls(files["operator"], None)
                ) as client,
                pytest.raises(UnavailableError, match="Hostname Verification Check failed"),
            ):
                client.info()
        finally:
            for client in clients.values():
                client.close()
            params.close()
        assert all("mutual TLS" in p.log_tail(20_000) for p in shards), [p.log_tail() for p in shards]
        assert re.search(r"\(hosted, [^)]*mutual TLS", learner.log_tail(20_000)), learner.log_tail()
        for pod in cluster.pods:
            check_sandbox(pod)
            tls = pod.directory / "volumes" / "tls"  # what the pod reads at /etc/apexrl/tls
            st = (tls / "tls.key").stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 10001, 0o440), (pod.name, st)
            # Its own role's certificate and key: the shards' key is on the shards only.
            holder = m.component(pod.workload)
            assert (tls / "tls.key").read_bytes() == credentials.certs[holder].key, pod.name
            assert (tls / "ca.crt").read_bytes() == credentials.ca, pod.name
        stopped = cluster.terminate()
        print(
            f"whole run: {time.monotonic() - started:.0f} s; exits "
            + ", ".join(f"{name} {code} in {seconds:.1f}s" for name, (code, seconds) in stopped.items())
        )
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, (
            "\n".join(
                f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}" for p in cluster.pods if p.exit_code != 0
            )
        )


# ---------------------------------------------------------------------------------------------------------------
# Least privilege (components/tls + components/roles, as in overlays/production, on the small fleet), with the
# NetworkPolicies enforced: the fleet trains with its role credentials, and what must be refused is refused.

SECURE_BUDGET = 60.0
# A process in a pod's network namespace tries TCP connections (all at once): "open" (the connection stands: the
# server answers or waits for us), "blocked" (no answer: a DROP on the way in, EPERM from one on the way out),
# "reset" (accepted then closed at once: the Service proxy refusing a client the endpoints' policies do not admit).
REACH = r"""
import concurrent.futures, errno, json, socket, sys

def attempt(target):
    host, port = target.rsplit(":", 1)
    try:
        conn = socket.create_connection((host, int(port)), timeout=2)
    except socket.timeout:
        return "blocked"
    except OSError as err:
        return "blocked" if err.errno == errno.EPERM else f"error {err}"
    with conn:
        conn.settimeout(1)
        try:
            return "open" if conn.recv(1) != b"" else "reset"
        except socket.timeout:
            return "open"
        except ConnectionResetError:
            return "reset"

with concurrent.futures.ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(attempt, sys.argv[1:])))))
"""
# Inside the actor's pod network namespace, with the actor's own mounted credentials (token and certificate):
# calls only the learner may make.
STOLEN_ACTOR = r"""
import json, sys
from apexrl.common.errors import ApexError
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient
import numpy as np

volumes, shard, params, name = sys.argv[1:5]
token = open(f"{volumes}/token/token").read().strip()
tls = TlsFiles.read(f"{volumes}/tls/tls.crt", f"{volumes}/tls/tls.key", f"{volumes}/tls/ca.crt", server_name=name)
answers = {}
def call(what, fn):
    try:
        fn()
        answers[what] = "allowed"
    except ApexError as err:
        answers[what] = f"{type(err).__name__}: {err}"
with ReplayClient(shard, token=token, tls=tls, timeout=5) as replay:
    call("Info", replay.info)
    call("Sample", lambda: replay.sample(8))
    call("UpdatePriorities", lambda: replay.update_priorities(np.array([1], dtype=np.uint64), np.array([1e25]),
                                                              incarnation=0))
    call("Checkpoint", replay.checkpoint)
with ParameterClient(params, token=token, tls=tls, timeout=5) as weights:
    call("GetVersion", weights.version)
    call("Publish", lambda: weights.publish({"planted": np.zeros(2, dtype=np.float32)}))
print(json.dumps(answers))
"""


def reach(cluster: pods.Cluster, where: str, targets: list[str]) -> dict[str, str]:
    done = cluster.run_in(where, [sys.executable, "-c", REACH, *targets], timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def visitors(namespace: str) -> list[m.Endpoint]:
    """Prometheus where the policies expect it; a pod of the fleet's namespace without the fleet's labels; a pod
    labelled like an actor in another namespace."""
    actor_labels = {
        "app.kubernetes.io/name": "apexrl",
        "app.kubernetes.io/component": "actor",
        "app.kubernetes.io/part-of": "apexrl",
    }
    return [
        m.Endpoint(
            "prometheus",
            "monitoring",
            {"app.kubernetes.io/name": "prometheus"},
            {"kubernetes.io/metadata.name": "monitoring"},
        ),
        m.Endpoint(
            "intruder",
            namespace,
            {"app.kubernetes.io/name": "debug"},
            {"kubernetes.io/metadata.name": namespace},
        ),
        m.Endpoint(
            "actor-elsewhere", "elsewhere", actor_labels, {"kubernetes.io/metadata.name": "elsewhere"}
        ),
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_least_privilege_trains_and_refuses_what_each_role_may_not_do(netns_network, tmp_path):
    credentials = fleet_secrets.make_fleet_credentials("apexrl")
    files = credentials.write(tmp_path / "credentials")
    objects = [*m.render(small_overlay(tmp_path, "small-cpu", ("tls", "roles"))), *credentials.secrets()]
    operator = client_tls(files["operator"])
    started = time.monotonic()
    with pods.Cluster(objects, netns_network, tmp_path / "run", visitors=visitors("apexrl")) as cluster:
        print(
            f"\nsmall-cpu + tls + roles with one actor: {len(cluster.pods)} pods: "
            + ", ".join(p.name for p in cluster.pods)
            + f"; visitors {sorted(cluster.visitors)}"
        )
        cluster.start()
        deadline = Deadline(cluster, SECURE_BUDGET)
        deadline.wait(cluster.all_ready, "every pod passes its probes", timeout=SECURE_BUDGET)
        print(f"[{cluster.elapsed():6.1f}s] every pod is Ready")
        shards = cluster.pods_of("apexrl-replay")
        learner = cluster.pods_of("apexrl-learner")[0]
        actor = cluster.pods_of("apexrl-actor")[0]
        evaluator = cluster.pods_of("apexrl-evaluator")[0]
        shard_port = cluster.service_port("apexrl-replay", "grpc")
        vip = cluster.service("apexrl-learner").vip
        params_port = cluster.service_port("apexrl-learner", "grpc")
        # The operator (a person's tool, from the node): Info and GetVersion are its to call.
        clients = {
            p.name: ReplayClient(
                f"{p.ip}:{shard_port}", timeout=3, tls=operator, token=credentials.tokens["operator"]
            )
            for p in shards
        }
        params = ParameterClient(
            f"{vip}:{params_port}", timeout=3, tls=operator, token=credentials.tokens["operator"]
        )
        try:
            deadline.wait(
                lambda: written_and_sampled(clients),
                "the actor writes to every shard and the learner samples them, with their role tokens",
                timeout=SECURE_BUDGET,
            )
            version = deadline.wait(params.version, "the learner publishes weights", timeout=SECURE_BUDGET)
            deadline.wait(
                lambda: all(
                    pods.scrape(p.ip, metrics_port(p)).get("apexrl_actor_weight_version", 0)
                    for p in (actor, evaluator)
                ),
                "the actor and the evaluator pull weights with their role tokens",
                timeout=SECURE_BUDGET,
            )
            print(
                f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {shard_counts(clients)}; weights "
                f"version {version}"
            )

            # A stolen actor: its own token and certificate, from its own pod, may insert and read, nothing else.
            stolen = cluster.run_in(
                actor.name,
                [
                    sys.executable,
                    "-c",
                    STOLEN_ACTOR,
                    str(actor.directory / "volumes"),
                    f"{shards[0].ip}:{shard_port}",
                    f"{vip}:{params_port}",
                    SERVER_NAME,
                ],
            )
            assert stolen.returncode == 0, stolen.stderr
            answers = json.loads(stolen.stdout)
            print(
                "calls with the actor's credentials, from its pod:\n"
                + "\n".join(f"    {call}: {answer[:150]}" for call, answer in answers.items())
            )
            assert answers["Info"] == answers["GetVersion"] == "allowed", answers
            for call in ("Sample", "UpdatePriorities", "Checkpoint", "Publish"):
                assert (
                    answers[call].startswith("PermissionDeniedError")
                    and f"actor may not call {'ParameterService' if call == 'Publish' else 'ReplayService'}/{call}"
                    in answers[call]
                ), (call, answers[call])
            assert "planted" not in params.fetch()[1], "the refused Publish changed nothing"

            # A stolen shard holds the learner's and the actor's tokens (it verifies them) but no client
            # certificate: its server certificate cannot dial (serverAuth only), so the tokens are of no use.
            shard_files = shards[0].directory / "volumes"
            as_shard = TlsFiles.read(
                str(shard_files / "tls" / "tls.crt"),
                str(shard_files / "tls" / "tls.key"),
                str(shard_files / "tls" / "ca.crt"),
                server_name=SERVER_NAME,
            )
            learner_token = (shard_files / "role-tokens" / "learner").read_text()
            with (
                ReplayClient(
                    f"{shards[1].ip}:{shard_port}", timeout=3, tls=as_shard, token=learner_token
                ) as c,
                pytest.raises(UnavailableError),
            ):
                c.sample(8, wait=False)
            # A client certificate of the fleet without a token, or with a token of nobody: not authenticated.
            for token in (None, "not-a-role-token"):
                with (
                    ReplayClient(
                        f"{shards[0].ip}:{shard_port}", timeout=3, tls=client_tls(files["actor"]), token=token
                    ) as c,
                    pytest.raises(UnauthenticatedError),
                ):
                    c.info()

            # The network: every role reaches what it dials and nothing else; Prometheus the metrics ports only;
            # a pod without the fleet's labels, or an actor-labelled pod of another namespace, nothing.
            shard, other = (f"{shards[0].ip}:{shard_port}", f"{shards[1].ip}:{shard_port}")
            learner_pod, learner_vip = f"{learner.ip}:{learner.port('grpc')}", f"{vip}:{params_port}"
            metrics = {p.name: f"{p.ip}:{metrics_port(p)}" for p in (shards[0], learner, actor, evaluator)}
            health = f"{shards[0].ip}:{shards[0].port('health')}"
            everything = [shard, learner_pod, learner_vip, health, *metrics.values()]
            seen = {
                "actor": reach(
                    cluster,
                    actor.name,
                    [
                        shard,
                        other,
                        learner_pod,
                        learner_vip,
                        health,
                        metrics[learner.name],
                        metrics[evaluator.name],
                    ],
                ),
                "evaluator": reach(
                    cluster, evaluator.name, [shard, learner_pod, learner_vip, metrics[actor.name]]
                ),
                "learner": reach(cluster, learner.name, [shard, other, metrics[actor.name]]),
                "shard": reach(
                    cluster, shards[0].name, [other, learner_pod, learner_vip, metrics[actor.name]]
                ),
                "prometheus": reach(cluster, "prometheus", everything),
                "intruder": reach(cluster, "intruder", everything),
                "actor-elsewhere": reach(cluster, "actor-elsewhere", everything),
            }
            for who, answers in seen.items():
                print(f"    from {who:<16} " + ", ".join(f"{t} {a}" for t, a in answers.items()))
            opened = {who: {t for t, a in answers.items() if a == "open"} for who, answers in seen.items()}
            assert opened == {
                "actor": {shard, other, learner_pod, learner_vip},
                "evaluator": {learner_pod, learner_vip},
                "learner": {shard, other},
                "shard": set(),
                "prometheus": set(metrics.values()),
                "intruder": set(),
                "actor-elsewhere": set(),
            }, opened
            assert all(
                a in ("open", "blocked", "reset") for answers in seen.values() for a in answers.values()
            ), seen
            # Through the Service address the proxy turns strangers away (a CNI would drop them on the way).
            assert seen["intruder"][learner_vip] == seen["actor-elsewhere"][learner_vip] == "reset"
            cluster.check()
        finally:
            for client in clients.values():
                client.close()
            params.close()
        for server in (*shards, learner):  # their start lines name the access mode
            assert "roles from role tokens in /etc/apexrl/role-tokens" in server.log_tail(20_000), (
                server.log_tail()
            )
        for pod in cluster.pods:
            check_sandbox(pod)
            volumes = pod.directory / "volumes"
            role = m.component(pod.workload)
            secret_files = [
                volumes / "tls" / "tls.key",
                *(volumes / "role-tokens").glob("*"),
                *([volumes / "token" / "token"] if role != "replay" else []),
            ]
            for path in secret_files:
                st = path.stat()
                assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 10001, 0o440), (pod.name, path, st)
            if role != "replay":
                assert (volumes / "token" / "token").read_text() == credentials.tokens[role], pod.name
        stopped = cluster.terminate()
        print(f"whole run: {time.monotonic() - started:.0f} s")
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, (
            "\n".join(
                f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}" for p in cluster.pods if p.exit_code != 0
            )
        )


# ---------------------------------------------------------------------------------------------------------------
# Without running anything: the command lines and environments the emulation gives the pods, and what it refuses.


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return m.render(m.K8S / OVERLAY)


def test_pods_get_the_kubelets_names_environment_and_command_lines(rendered):
    pod_list, services = pods.dry_run(copy.deepcopy(rendered))
    by_name = {p.name: p for p in pod_list}
    assert [n for n in by_name if n.startswith(("apexrl-replay-", "apexrl-actor-"))] == [
        "apexrl-actor-0",
        "apexrl-actor-1",
        "apexrl-actor-2",
        "apexrl-actor-3",
        "apexrl-replay-0",
        "apexrl-replay-1",
    ]
    learner = next(p for p in pod_list if p.workload_name == "apexrl-learner")
    assert learner.name.startswith("apexrl-learner-") and len(learner.name.split("-")[-1]) == 5
    vip = next(s.vip for s in services if s.name == "apexrl-learner")
    actor = by_name["apexrl-actor-2"]
    assert actor.argv[0] == "apexrl"  # the image's ENTRYPOINT; the manifests give args only
    assert "--actor-index=2" in actor.argv and "--num-actors=4" in actor.argv
    assert "--params=apexrl-learner.apexrl.svc.cluster.local:7200" in actor.argv
    assert actor.env["ACTOR_INDEX"] == "2" and actor.env["NAMESPACE"] == "apexrl"
    assert actor.env["HOSTNAME"] == "apexrl-actor-2" and actor.env["HOME"] == "/tmp"
    assert (
        actor.env["APEXRL_LEARNER_SERVICE_HOST"] == vip
        and actor.env["APEXRL_LEARNER_SERVICE_PORT_GRPC"] == "7200"
    )
    assert actor.env["PATH"].split(":")[0] == str(Path(sys.prefix) / "bin")
    assert not any(k.startswith("APEXRL_REPLAY_SERVICE") for k in actor.env), "headless Services get no links"
    assert "PYTHONPATH" not in actor.env and "VIRTUAL_ENV" not in actor.env


def _mutate(path: str, value):
    def apply(objects: list[dict]) -> None:
        fleet = m.Fleet(objects)
        workload = fleet.get("StatefulSet", "apexrl-actor")
        container = m.pod_spec(workload)["containers"][0]
        if path == "fieldRef":
            container["env"].append({"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": value}}})
        elif path == "secret":
            container["env"].append(
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            )
        elif path == "exec":
            container["readinessProbe"] = {"exec": {"command": ["true"]}}
        elif path == "sidecar":
            m.pod_spec(workload)["containers"].append({**container, "name": "sidecar"})
        elif path == "arg":
            container["args"].append(value)
        elif path == "image":
            container["image"] = value
        elif path == "volume":
            m.pod_spec(workload)["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        elif path == "secret-volume":
            m.pod_spec(workload)["volumes"].append({"name": "tls", "secret": {"secretName": value}})
        elif path == "projected":
            m.pod_spec(workload)["volumes"].append({"name": "p", "projected": {"sources": [value]}})

    return apply


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (_mutate("fieldRef", "spec.nodeName"), "fieldRef 'spec.nodeName' is not emulated"),
        (_mutate("secret", None), "from ['secretKeyRef']"),
        (_mutate("exec", None), "readinessProbe with handler ['exec']"),
        (_mutate("sidecar", None), "2 containers"),
        (_mutate("arg", "--seed=$(APEXRL_SEED)"), "$(APEXRL_SEED), defined nowhere"),
        (_mutate("image", "registry.example.com/apexrl/other:1"), "no Dockerfile target known for 'other'"),
        (_mutate("volume", None), "volume host of kind ['hostPath']"),
        (_mutate("secret-volume", "absent"), "Secret absent is not among the objects"),
        (_mutate("projected", {"secret": {"name": "absent"}}), "Secret absent is not among the objects"),
        (
            _mutate("projected", {"serviceAccountToken": {"path": "t"}}),
            "projected sources [['serviceAccountToken']]",
        ),
    ],
    ids=[
        "fieldRef",
        "secretKeyRef",
        "exec-probe",
        "sidecar",
        "undefined-var",
        "image",
        "hostPath",
        "no-secret",
        "no-projected-secret",
        "projected-token",
    ],
)
def test_what_the_emulation_cannot_run_fails_loudly(rendered, mutation, expected):
    objects = copy.deepcopy(rendered)
    mutation(objects)
    with pytest.raises(pods.Unsupported) as error:
        pods.dry_run(objects)
    assert expected in str(error.value)


def test_args_expand_as_kubernetes_expands_them():
    env = {"A": "1", "EMPTY": ""}
    assert pods.expand("x$(A)y", env) == ("x1y", [])
    assert pods.expand("$$(A)", env) == ("$(A)", [])  # $$ escapes
    assert pods.expand("$(B)-$(EMPTY)", env) == ("$(B)-", ["B"])  # undefined: left as written
    assert pods.expand("$A $( $", env) == ("$A $( $", [])


def test_the_network_policies_become_each_pods_firewall(rendered):
    """Without running anything: the iptables rules and proxy admissions the emulation derives from small-cpu's
    NetworkPolicies (documentation addresses)."""
    pod_list, services = pods.dry_run(copy.deepcopy(rendered))
    intruder = m.Endpoint(
        "intruder",
        "apexrl",
        {"app.kubernetes.io/name": "debug"},
        {"kubernetes.io/metadata.name": "apexrl"},
        ip="192.0.2.200",
    )
    firewall = pods.plan_firewall(m.Fleet(rendered), pod_list, services, [intruder], "192.0.2.254")
    by_role: dict[str, list[pods.Pod]] = {}
    for pod in pod_list:
        by_role.setdefault(m.component(pod.workload), []).append(pod)
    vip = next(s.vip for s in services if s.name == "apexrl-learner")
    learner, shards, actor = by_role["learner"][0], by_role["replay"], by_role["actor"][0]

    def accepted(label: str, chain: str) -> set[str]:
        rules = [
            line.split() for line in firewall.rules[label].splitlines() if line.startswith(f"-A {chain} -")
        ]
        flag = "-s" if chain == "INPUT" else "-d"
        return {
            f"{r[r.index(flag) + 1].removesuffix('/32')}:{r[r.index('--dport') + 1]}"
            for r in rules
            if flag in r and "--dport" in r
        }

    assert firewall.isolated[actor.label] == (True, True) and firewall.isolated["intruder"] == (False, False)
    assert accepted(actor.label, "OUTPUT") == {f"{s.ip}:7000" for s in shards} | {
        f"{learner.ip}:7200",
        f"{vip}:7200",
    }
    assert accepted(actor.label, "INPUT") == set()  # the node (the kubelet, Prometheus here) only
    assert "-A INPUT -s 192.0.2.254/32 -j ACCEPT" in firewall.rules[actor.label]
    clients = {p.ip for role in ("actor", "learner") for p in by_role[role]}
    assert accepted(shards[0].label, "INPUT") == {f"{ip}:7000" for ip in clients}
    assert accepted(shards[0].label, "OUTPUT") == set()
    players = {p.ip for role in ("actor", "evaluator") for p in by_role[role]}
    # From the Service's proxy, on both of its ports: the proxy decides whom it admits (below).
    assert accepted(learner.label, "INPUT") == {f"{ip}:7200" for ip in players} | {
        f"{vip}:7200",
        f"{vip}:9200",
    }
    assert accepted(learner.label, "OUTPUT") == {f"{s.ip}:7000" for s in shards}
    # Through the Service address: the proxy admits the actors, the evaluator and the node to the parameter
    # service, only the node to the learner's metrics, never the intruder.
    sources = firewall.proxy_sources["apexrl-learner"]
    assert set(sources[f"{learner.ip}:7200"]) == players | {"192.0.2.254"}
    assert sources[f"{learner.ip}:9200"] == ["192.0.2.254"]

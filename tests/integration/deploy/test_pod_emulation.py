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

The third runs the TLS component (overlays/small-cpu-tls with one actor): the Secret it mounts is made here with
trustme, for the one name every client checks (apexrl-replay.apexrl.svc), and added to the objects as cert-manager
would create it. The fleet must train over mutual TLS between pod addresses that certificate does not name, with
the probes on the plaintext health ports while the gRPC ports refuse plaintext.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apexrl.common.errors import UnavailableError
from apexrl.common.grpc_util import make_channel
from apexrl.common.tls import TlsFiles
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client import ReplayClient
from tests.integration.deploy import pods
from tests.support.certs import SERVER_NAME, make_certs
from tests.unit.deploy import manifests as m

pytest_plugins = ("tests.support.fixtures",)
pytestmark = pytest.mark.skipif(m.kubectl_missing() is not None, reason=m.kubectl_missing() or "")

OVERLAY = "overlays/small-cpu"
# Everything below must happen within BUDGET seconds of the pods' start, so a slow machine fails with the fleet's
# state (PodFailure) rather than with pytest-timeout's traceback; SIGTERM and the teardown need the rest.
BUDGET = 170.0
ROLE_METRICS = {"replay": "apexrl_replay_", "learner": "apexrl_learner_", "actor": "apexrl_actor_",
                "evaluator": "apexrl_actor_"}


class Deadline:
    def __init__(self, cluster: pods.Cluster, budget: float) -> None:
        self.cluster, self.end = cluster, time.monotonic() + budget

    def wait(self, condition, what: str, timeout: float):
        return self.cluster.wait(condition, what, min(timeout, max(1.0, self.end - time.monotonic())))


def metrics_port(pod: pods.Pod) -> int:
    return m.Container(pod.workload, pod.container).ports()["metrics"]


def shard_counts(clients: dict[str, ReplayClient]) -> dict[str, tuple[int, int]]:
    return {name: (info.inserted_total, info.sampled_total)
            for name, info in ((name, c.info(timeout=3)) for name, c in clients.items())}


def written_and_sampled(clients: dict[str, ReplayClient]) -> bool:
    return all(inserted > 0 and sampled > 0 for inserted, sampled in shard_counts(clients).values())


def check_sandbox(pod: pods.Pod) -> None:
    """The running process is what the pod's securityContext and volumes say: its user and groups, no
    capabilities, no_new_privs, its hostname, and (read-only root filesystem) writable only where a volume is."""
    pod_sc = m.pod_spec(pod.workload).get("securityContext", {})
    sc = {**pod_sc, **pod.container.get("securityContext", {})}
    facts = pods.inspect_process(pod.process.pid)
    assert facts["uids"] == {sc["runAsUser"]} and facts["gids"] == {sc["runAsGroup"]}, (pod.name, facts)
    assert set(facts["groups"]) == {sc["runAsGroup"], *([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else [])}, \
        (pod.name, facts)
    assert facts["cap_eff"] == 0 and facts["no_new_privs"] == (sc.get("allowPrivilegeEscalation") is False), facts
    assert facts["hostname"] == pod.name, (pod.name, facts)
    if sc.get("readOnlyRootFilesystem"):
        projected = {v["name"] for v in m.pod_spec(pod.workload).get("volumes", []) if {"configMap", "secret"} & set(v)}
        volumes = sorted(v["mountPath"] for v in pod.container.get("volumeMounts", [])
                         if not v.get("readOnly") and v["name"] not in projected)
        assert facts["writable"] == volumes, f"{pod.name} can write to {facts['writable']}, its volumes: {volumes}"


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
            deadline.wait(lambda: written_and_sampled(clients),
                          "every shard is written to and sampled (ReplayService Info at POD_IP:SERVICE_PORT)",
                          timeout=120)
            counts = shard_counts(clients)
            print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}")

            first = deadline.wait(params.version, "the learner publishes weights (Service VIP)", timeout=60)
            version = deadline.wait(lambda: (v := params.version()) > first and v,
                                    f"the published weights version grows past {first}", timeout=90)
            print(f"[{cluster.elapsed():6.1f}s] parameter service at {learner_service.vip}:{params_port} "
                  f"(Service apexrl-learner): version {first} -> {version}")

            actors = [p for p in cluster.pods if m.component(p.workload) in ("actor", "evaluator")]
            deadline.wait(lambda: all(pods.scrape(p.ip, metrics_port(p)).get("apexrl_actor_weight_version", 0) > 0
                                      for p in actors),
                          "every actor and the evaluator act with published weights (apexrl_actor_weight_version)",
                          timeout=60)

            scraped = {}
            for pod in cluster.pods:
                values = pods.scrape(pod.ip, metrics_port(pod))
                prefix = ROLE_METRICS[m.component(pod.workload)]
                assert any(name.startswith(prefix) for name in values), \
                    f"{pod.name}: metrics port {metrics_port(pod)} serves no {prefix}* series"
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
        env_steps = sum(scraped[p.name].get("apexrl_actor_env_steps_total", 0) for p in actors
                        if m.component(p.workload) == "actor")
        print(f"[{cluster.elapsed():6.1f}s] env steps {env_steps:.0f} (exploring actors), learner updates "
              f"{scraped[learner.name].get('apexrl_learner_updates_total', 0):.0f}, published version "
              f"{scraped[learner.name].get('apexrl_learner_weight_version', 0):.0f}; weights held: "
              + ", ".join(f"{p.name} v{scraped[p.name]['apexrl_actor_weight_version']:.0f}" for p in actors))
        print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}")

        print(f"/etc/hosts of {learner.name}:\n" + textwrap.indent(hosts_file(cluster, learner), "    "))
        stopped = cluster.terminate()
        print(f"{'pod':<34} {'address':<14} {'ready after':>11} {'exit':>5} {'stopped in':>10} {'grace':>6} "
              f"{'peak RSS':>9} {'mem limit':>9} {'CPU s':>6}  probes passed/failed (startup readiness liveness)")
        for pod in cluster.pods:
            limit = pod.memory_limit()
            probes = " ".join(f"{ok}/{failed}" for ok, failed in pod.probe_counts.values())
            print(f"{pod.name:<34} {pod.ip:<14} {pod.ready_after or 0:>10.1f}s {str(pod.exit_code):>5} "
                  f"{pod.stop_seconds:>9.1f}s {pod.grace:>5.0f}s {(pod.peak_rss or 0) / 2**20:>7.0f}Mi "
                  f"{(limit or 0) / 2**20:>7.0f}Mi {pod.cpu_seconds or 0:>6.1f}  {probes}")
        print(f"whole run: {time.monotonic() - started:.0f} s")
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, \
            "every pod exits 0 on SIGTERM: " + "\n".join(f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}"
                                                         for p in cluster.pods if p.exit_code != 0)
        run_dir = learner.directory / "volumes" / "run"
        written = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        print(f"the learner's --run-dir (its volume 'run'): {written}")
        assert any(name.startswith("checkpoints/") for name in written), written
        assert Path("/var/lib/apexrl").exists() == host_had_var_lib_apexrl, "a pod wrote to this machine's /var/lib"
        for pod in cluster.pods:
            assert pod.stop_seconds <= pod.grace, f"{pod.name} took {pod.stop_seconds:.1f} s > {pod.grace} s"
            limit = pod.memory_limit()
            # Only a necessary condition for the memory limit (a cgroup also counts page cache): never above it.
            assert limit is None or pod.peak_rss is None or pod.peak_rss < limit, \
                f"{pod.name}: peak RSS {pod.peak_rss / 2**20:.0f} MiB exceeds its memory limit {limit / 2**20:.0f} MiB"


def broken_overlay(tmp_path: Path) -> Path:
    """A copy of k8s/ with an overlay on top of small-cpu whose shards listen on 7001 (args, containerPort and probes
    agree, so the pods become Ready) while the headless Service and everyone dialling it keep port 7000. The offline
    checks accept it (the Service's targetPort names the grpc containerPort, wherever that is), but a headless
    Service forwards nothing: clients dial POD_IP:7000. Smaller fleet: one actor, no evaluator."""
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    broken = copy / "overlays" / "broken"
    broken.mkdir()
    (broken / "kustomization.yaml").write_text(textwrap.dedent("""\
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
        """))
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
        deadline.wait(cluster.all_ready, "every pod is Ready (the shards' probes are on their real port)",
                      timeout=150)
        actor = cluster.pods_of("apexrl-actor")[0]
        deadline.wait(lambda: pods.scrape(actor.ip, metrics_port(actor)).get("apexrl_actor_weight_version", 0) > 0,
                      "the actor holds the learner's weights (so it is ready to insert)", timeout=60)
        shards = cluster.pods_of("apexrl-replay")
        clients = {p.name: ReplayClient(f"{p.ip}:7001", timeout=3) for p in shards}
        try:
            with pytest.raises(pods.PodFailure) as failure:
                deadline.wait(lambda: written_and_sampled(clients),
                              "every shard is written to and sampled", timeout=30)
            counts = shard_counts(clients)
        finally:
            for client in clients.values():
                client.close()
        message = str(failure.value)
        print(f"\nreported: {message.splitlines()[0]}\nshards (inserted, sampled) on their real port: {counts}")
        assert "timed out" in message and "written to and sampled" in message
        assert all(inserted == 0 for inserted, _ in counts.values()), counts
        cluster.terminate()


TLS_BUDGET = 50.0


def tls_overlay(tmp_path: Path) -> Path:
    """overlays/small-cpu-tls with one actor (every workload the component patches, one pod each but the two
    shards, whose different addresses the one certificate must cover), in a copy of k8s/."""
    copy = tmp_path / "k8s"
    shutil.copytree(m.K8S, copy)
    overlay = copy / "overlays" / "tls-test"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(textwrap.dedent("""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources:
          - ../small-cpu-tls
        replicas:
          - name: apexrl-actor
            count: 1
        configMapGenerator:
          - name: apexrl-fleet
            behavior: merge
            literals:
              - APEXRL_NUM_ACTORS=1
        """))
    return overlay


def grpc_port_refuses_plaintext(address: str) -> bool:
    with make_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.UNAVAILABLE
    return False


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_tls_component_trains_over_mutual_tls_with_probes_on_the_health_ports(netns_network, tmp_path):
    certs = make_certs(tmp_path / "certs")
    secret = m.tls_secret("apexrl-tls", "apexrl", *(Path(path).read_bytes() for path in
                                                    (certs.named_cert, certs.named_key, certs.ca)))
    objects = [*m.render(tls_overlay(tmp_path)), secret]
    tls = TlsFiles.read(certs.named_cert, certs.named_key, certs.ca, server_name=SERVER_NAME)
    started = time.monotonic()
    with pods.Cluster(objects, netns_network, tmp_path / "run") as cluster:
        print(f"\nsmall-cpu-tls with one actor: {len(cluster.pods)} pods: " + ", ".join(p.name for p in cluster.pods))
        cluster.start()
        assert all("--tls-server-name=apexrl-replay.apexrl.svc" in p.argv for p in cluster.pods
                   if m.component(p.workload) != "replay")
        deadline = Deadline(cluster, TLS_BUDGET)
        deadline.wait(cluster.all_ready, "every pod passes its probes (gRPC on the plaintext health ports)",
                      timeout=TLS_BUDGET)
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
        clients = {p.name: ReplayClient(f"{p.ip}:{shard_port}", timeout=3, tls=tls) for p in shards}
        params = ParameterClient(f"{learner_service.vip}:{params_port}", timeout=3, tls=tls)
        try:
            deadline.wait(lambda: written_and_sampled(clients),
                          "every shard is written to and sampled over mutual TLS", timeout=TLS_BUDGET)
            version = deadline.wait(params.version, "the learner publishes weights over mutual TLS",
                                    timeout=TLS_BUDGET)
            # Metrics stay plain HTTP.
            players = [actor, *cluster.pods_of("apexrl-evaluator")]
            deadline.wait(lambda: all(pods.scrape(p.ip, metrics_port(p)).get("apexrl_actor_weight_version", 0)
                                      for p in players),
                          "the actor and the evaluator act with published weights (pulled over mutual TLS)",
                          timeout=TLS_BUDGET)
            counts = shard_counts(clients)
            print(f"[{cluster.elapsed():6.1f}s] shards (inserted, sampled): {counts}; weights version {version}")
            # Without the name, a client checks the pod address, which the certificate does not name.
            unnamed = TlsFiles.read(certs.named_cert, certs.named_key, certs.ca)
            with ReplayClient(f"{shards[0].ip}:{shard_port}", timeout=3, tls=unnamed) as client, \
                    pytest.raises(UnavailableError, match="Hostname Verification Check failed"):
                client.info()
        finally:
            for client in clients.values():
                client.close()
            params.close()
        assert all("mutual TLS" in p.log_tail(20_000) for p in shards), [p.log_tail() for p in shards]
        assert "hosted, mutual TLS" in learner.log_tail(20_000)
        for pod in cluster.pods:
            check_sandbox(pod)
            key = pod.directory / "volumes" / "tls" / "tls.key"  # what the pod reads at /etc/apexrl/tls/tls.key
            st = key.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 10001, 0o440), (pod.name, st)
            assert os.path.exists(pod.directory / "volumes" / "tls" / "ca.crt")
        stopped = cluster.terminate()
        print(f"whole run: {time.monotonic() - started:.0f} s; exits " + ", ".join(
            f"{name} {code} in {seconds:.1f}s" for name, (code, seconds) in stopped.items()))
        assert {name: code for name, (code, _) in stopped.items()} == {p.name: 0 for p in cluster.pods}, \
            "\n".join(f"{p.name}: {p.exit_code}\n{p.log_tail(1500)}" for p in cluster.pods if p.exit_code != 0)


# ---------------------------------------------------------------------------------------------------------------
# Without running anything: the command lines and environments the emulation gives the pods, and what it refuses.

@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return m.render(m.K8S / OVERLAY)


def test_pods_get_the_kubelets_names_environment_and_command_lines(rendered):
    pod_list, services = pods.dry_run(copy.deepcopy(rendered))
    by_name = {p.name: p for p in pod_list}
    assert [n for n in by_name if n.startswith(("apexrl-replay-", "apexrl-actor-"))] == [
        "apexrl-actor-0", "apexrl-actor-1", "apexrl-actor-2", "apexrl-actor-3", "apexrl-replay-0", "apexrl-replay-1"]
    learner = next(p for p in pod_list if p.workload_name == "apexrl-learner")
    assert learner.name.startswith("apexrl-learner-") and len(learner.name.split("-")[-1]) == 5
    vip = next(s.vip for s in services if s.name == "apexrl-learner")
    actor = by_name["apexrl-actor-2"]
    assert actor.argv[0] == "apexrl"  # the image's ENTRYPOINT; the manifests give args only
    assert "--actor-index=2" in actor.argv and "--num-actors=4" in actor.argv
    assert "--params=apexrl-learner.apexrl.svc.cluster.local:7200" in actor.argv
    assert actor.env["ACTOR_INDEX"] == "2" and actor.env["NAMESPACE"] == "apexrl"
    assert actor.env["HOSTNAME"] == "apexrl-actor-2" and actor.env["HOME"] == "/tmp"
    assert actor.env["APEXRL_LEARNER_SERVICE_HOST"] == vip and actor.env["APEXRL_LEARNER_SERVICE_PORT_GRPC"] == "7200"
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
            container["env"].append({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
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
    return apply


@pytest.mark.parametrize(("mutation", "expected"), [
    (_mutate("fieldRef", "spec.nodeName"), "fieldRef 'spec.nodeName' is not emulated"),
    (_mutate("secret", None), "from ['secretKeyRef']"),
    (_mutate("exec", None), "readinessProbe with handler ['exec']"),
    (_mutate("sidecar", None), "2 containers"),
    (_mutate("arg", "--seed=$(APEXRL_SEED)"), "$(APEXRL_SEED), defined nowhere"),
    (_mutate("image", "registry.example.com/apexrl/other:1"), "no Dockerfile target known for 'other'"),
    (_mutate("volume", None), "volume host of kind ['hostPath']"),
    (_mutate("secret-volume", "absent"), "Secret absent is not among the objects"),
], ids=["fieldRef", "secretKeyRef", "exec-probe", "sidecar", "undefined-var", "image", "hostPath", "no-secret"])
def test_what_the_emulation_cannot_run_fails_loudly(rendered, mutation, expected):
    objects = copy.deepcopy(rendered)
    mutation(objects)
    with pytest.raises(pods.Unsupported) as error:
        pods.dry_run(objects)
    assert expected in str(error.value)


def test_args_expand_as_kubernetes_expands_them():
    env = {"A": "1", "EMPTY": ""}
    assert pods.expand("x$(A)y", env) == ("x1y", [])
    assert pods.expand("$$(A)", env) == ("$(A)", [])           # $$ escapes
    assert pods.expand("$(B)-$(EMPTY)", env) == ("$(B)-", ["B"])  # undefined: left as written
    assert pods.expand("$A $( $", env) == ("$A $( $", [])

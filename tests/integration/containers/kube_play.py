"""The rendered manifests in a real container engine: `podman kube play` (podman 4.3, Debian's) runs what it
supports of them, the test supplies what it cannot, and every adaptation is written down here (ADAPTATIONS) and
printed by the test, so nobody mistakes the rest for tested.

What podman 4.3's `kube play` does with the small-cpu overlay's 12 objects (measured here):

- **Kinds.** It plays Pod, Deployment (one pod, `NAME-pod-0`), PersistentVolumeClaim (a podman volume named after the
  claim) and ConfigMap (only as the source of a pod's `envFrom`/`configMapKeyRef`; alone it refuses it). StatefulSet,
  Service, NetworkPolicy, PodDisruptionBudget, ServiceAccount and Namespace are skipped without a word in a
  multi-document file (alone: "YAML document does not contain any supported kube kind").
- **Honoured** (checked on the running containers): image, args, `envFrom` ConfigMap, `env` values and the
  `metadata.labels['apps.kubernetes.io/pod-index']` fieldRef, runAsUser/runAsGroup, readOnlyRootFilesystem,
  capabilities drop ALL, allowPrivilegeEscalation false (no_new_privs), resources.limits (memory, CPU quota) and
  requests.memory (a reservation), hostname, pod labels (as container labels), persistentVolumeClaim volumes.
- **Refused** (kube play fails): `fieldRef: metadata.namespace` ("not valid or not supported"), and containerPorts
  under any network but podman's bridge (4.3 publishes every containerPort on the host: "PortMappings can only be
  used with Bridge or slirp4netns networking"); pods cannot join a network namespace by path ("pods presently do not
  support network mode path").
- **Ignored** (accepted, no effect): `$(VAR)` in args (passed literally: the process would get
  `--log-level=$(APEXRL_LOG_LEVEL)`), hostAliases, readinessProbe, startupProbe, gRPC livenessProbes (no
  healthcheck), httpGet livenessProbes become a podman healthcheck (`curl` in the container, which the image lacks,
  run by systemd timers, which this machine lacks: never run), terminationGracePeriodSeconds (stop timeout stays
  10 s), resources.requests.cpu, emptyDir's medium and sizeLimit (an emptyDir becomes a named volume, shared by every
  pod whose emptyDir has that name, kept after the pod), fsGroup (the processes have group 10001 from runAsGroup
  anyway, and podman chowns a new volume to the container's user), seccompProfile (podman's default filter applies
  anyway: checked), serviceAccountName, automountServiceAccountToken, topologySpreadConstraints, Deployment strategy and
  replicas beyond one pod, StatefulSet semantics (none: the kind is skipped).

What the test does about it (ADAPTATIONS): the documents handed to kube play are the rendered ones with the
refused and ignored parts that matter replaced by what the kubelet or the API server would do: StatefulSets become
their Pods (ordinal names, pod-index and pod-name labels, hostname) and claims; containerPorts are dropped;
metadata.namespace fieldRefs become the namespace; `$(VAR)`s are expanded as the kubelet expands them; emptyDirs are
named per pod. The pods run with `--network none` (a namespace of their own, loopback only) and the test wires
each into a bridge of its own (a veth into the pod's namespace, an address of a free 10.213.X.0/24: the CNI's
job), writes cluster DNS as /etc/hosts entries into every container before it starts (each Service name in its
`NAME[.NS[.svc[.cluster.local]]]` forms: a headless Service to its pods' addresses, the ClusterIP Service to its one
pod's, whose port is its targetPort), probes readiness itself and stops each pod as the kubelet would (SIGTERM,
SIGKILL after the pod's terminationGracePeriodSeconds). The network-namespace emulation
(tests/integration/deploy/pods.py) remains the test of what podman cannot do: Services proper (Ready-only
endpoints, a virtual IP and proxy), StatefulSet ordinals as a controller makes them, probes as the kubelet runs them.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.integration.containers import engine
from tests.integration.deploy import pods
from tests.support import netns
from tests.unit.deploy import manifests as m

PREFIX = "axc"  # "apexrl containers": the start of every netns and link name made here (tests/support/netns.py scheme)
PLAYED_KINDS = ("ConfigMap", "Deployment", "Pod", "PersistentVolumeClaim")
ADAPTATIONS = (
    "StatefulSet -> its Pods NAME-0..N-1 (labels apps.kubernetes.io/pod-index, statefulset.kubernetes.io/pod-name; "
    "hostname) and a PersistentVolumeClaim CLAIM-NAME-i per volumeClaimTemplate: podman skips StatefulSets",
    "containers[].ports dropped: podman 4.3 publishes them on the host, refused without its bridge network",
    "env fieldRef metadata.namespace -> its value: refused by podman 4.3",
    "args: $(VAR) expanded as the kubelet does: podman passes them literally",
    "emptyDir volumes named POD-VOLUME: podman makes one named volume per name, shared across pods",
    "network: --network none, then a veth per pod into the test's bridge (the CNI's job); podman 4.3 pods take no "
    "network namespace by path and its bridge is off limits here",
    "cluster DNS: Service names written into each container's /etc/hosts before it starts (hostAliases ignored)",
    "probes run by the test (readiness: the gRPC health or /metrics of each pod); stop: SIGTERM with the pod's "
    "terminationGracePeriodSeconds (podman keeps 10 s)",
)


@dataclass
class PlayedPod:
    name: str  # podman's pod name: NAME-i (StatefulSet), NAME-pod-0 (Deployment)
    workload: dict  # the rendered object it comes from
    ordinal: int
    address: str = ""
    grace: float = 30.0
    veth: str = ""
    netns: str = ""
    containers: list[str] = field(default_factory=list)

    @property
    def component(self) -> str:
        return m.component(self.workload)

    def port(self, name: str) -> int:
        return m.Container(self.workload, m.pod_spec(self.workload)["containers"][0]).ports()[name]


class KubePlay:
    """The rendered objects through `podman kube play`, wired and named as above; a context manager that removes
    every pod, volume, link and namespace it made."""

    def __init__(self, objects: list[dict], workdir: Path) -> None:
        self.fleet = m.Fleet(objects)
        self.namespace = self.fleet.namespace
        self.workdir = workdir
        self.run_id = f"{PREFIX}{os.getpid():x}x0"
        self.bridge = f"{self.run_id}br"
        self.pods: list[PlayedPod] = []
        self.volumes: list[str] = []
        self.documents: list[dict] = []
        self.skipped: dict[str, int] = {}
        self.started = 0.0
        self.subnet: ipaddress.IPv4Network | None = None

    # --- the documents ------------------------------------------------------------------------------------------

    def plan(self) -> list[dict]:
        """The documents kube play gets (ADAPTATIONS applied); `skipped` counts the kinds left out (podman would
        skip them silently)."""
        documents: list[dict] = []
        for obj in self.fleet.objects:
            if obj["kind"] == "ConfigMap":
                documents.append(obj)
            elif obj["kind"] == "StatefulSet":
                for i in range(obj["spec"].get("replicas", 1)):
                    documents += self._statefulset_pod(obj, i)
            elif obj["kind"] == "Deployment":
                documents.append(self._deployment(obj))
            else:
                self.skipped[obj["kind"]] = self.skipped.get(obj["kind"], 0) + 1
        self.documents = documents
        return documents

    def _statefulset_pod(self, sts: dict, i: int) -> list[dict]:
        name = f"{sts['metadata']['name']}-{i}"
        template = copy.deepcopy(sts["spec"]["template"])
        labels = {
            **template["metadata"].get("labels", {}),
            m.POD_INDEX_LABEL: str(i),
            pods.POD_NAME_LABEL: name,
            engine.RUN_LABEL: str(os.getpid()),
        }
        spec = template["spec"]
        spec["hostname"] = name
        claims = []
        for vct in sts["spec"].get("volumeClaimTemplates", []):
            claim = f"{vct['metadata']['name']}-{name}"
            claims.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": claim,
                        "namespace": self.namespace,
                        "labels": {**vct["metadata"].get("labels", {}), engine.RUN_LABEL: str(os.getpid())},
                    },
                    "spec": vct["spec"],
                }
            )
            spec.setdefault("volumes", []).append(
                {"name": vct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}}
            )
            self.volumes.append(claim)
        self._adapt(sts, spec, name, i)
        return [
            *claims,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
                "spec": spec,
            },
        ]

    def _deployment(self, deployment: dict) -> dict:
        obj = copy.deepcopy(deployment)
        name = f"{deployment['metadata']['name']}-pod-0"  # podman's name for a Deployment's pod
        obj["spec"]["template"]["metadata"].setdefault("labels", {})[engine.RUN_LABEL] = str(os.getpid())
        self._adapt(deployment, obj["spec"]["template"]["spec"], name, 0)
        return obj

    def _adapt(self, workload: dict, spec: dict, pod_name: str, ordinal: int) -> None:
        renamed = {}
        for volume in spec.get("volumes", []):
            if "emptyDir" in volume:
                renamed[volume["name"]] = volume["name"] = f"{pod_name}-{volume['name']}"
                self.volumes.append(volume["name"])
        for container in spec["containers"]:
            env, problems = m.container_env(self.fleet, m.Container(workload, container), ordinal)
            assert not problems, problems
            container.pop("ports", None)
            container["args"] = [pods.expand(str(arg), env)[0] for arg in container.get("args", [])]
            for var in container.get("env", []):
                if var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                    var.pop("valueFrom")
                    var["value"] = self.namespace
            for mount in container.get("volumeMounts", []):
                mount["name"] = renamed.get(mount["name"], mount["name"])
        self.pods.append(
            PlayedPod(pod_name, workload, ordinal, grace=float(spec.get("terminationGracePeriodSeconds", 30)))
        )

    # --- running ------------------------------------------------------------------------------------------------

    def __enter__(self) -> KubePlay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """kube play (pods created, not started), the network, DNS, then every pod started."""
        documents = self.plan()
        path = self.workdir / "kube-play.yaml"
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        netns.remove_stale(PREFIX)
        # Pods and volumes of these names are what a killed earlier run left (kube play would refuse to replace them).
        engine.podman(
            "pod", "rm", "--force", "--time", "0", *(p.name for p in self.pods), check=False, timeout=180
        )
        engine.podman("volume", "rm", "--force", *self.volumes, check=False, timeout=120)
        engine.podman("kube", "play", "--start=false", "--network", "none", str(path), timeout=300)
        self.subnet = netns._free_subnet(os.getpid(), PREFIX)
        hosts = list(self.subnet.hosts())
        netns._ip("link", "add", self.bridge, "type", "bridge")
        netns._ip(
            "addr", "add", f"{hosts[-1]}/{self.subnet.prefixlen}", "dev", self.bridge
        )  # the node's address
        netns._ip("link", "set", self.bridge, "up")
        for k, pod in enumerate(self.pods):
            facts = engine.inspect("pod", pod.name)
            pod.containers = [c["Name"] for c in facts["Containers"] if c["Id"] != facts["InfraContainerID"]]
            engine.podman("start", facts["InfraContainerID"])
            pid = engine.inspect("container", facts["InfraContainerID"])["State"]["Pid"]
            pod.address, pod.veth, pod.netns = (
                str(hosts[k]),
                f"{self.run_id}v{k}",
                f"{self.run_id}-{pod.name}",
            )
            netns._ip("netns", "attach", pod.netns, str(pid))
            netns._ip("link", "add", pod.veth, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
            netns._ip("link", "set", pod.veth, "master", self.bridge, "up")
            netns._ip("-n", pod.netns, "addr", "add", f"{pod.address}/{self.subnet.prefixlen}", "dev", "eth0")
            netns._ip("-n", pod.netns, "link", "set", "eth0", "up")
        entries = self.dns()
        for pod in self.pods:
            for container in pod.containers:
                engine.podman("init", container)
                hosts_path = Path(engine.inspect("container", container)["HostsPath"])
                with open(hosts_path, "a") as hosts_file:
                    hosts_file.write(
                        f"# cluster DNS, written by tests/integration/containers/kube_play.py\n{entries}"
                    )
        self.started = time.monotonic()
        for pod in self.pods:
            engine.podman("pod", "start", pod.name)

    def dns(self) -> str:
        """/etc/hosts lines answering every Service name as cluster DNS would (all pods counted Ready)."""
        lines = []
        for service in self.fleet.all("Service"):
            selector = service["spec"].get("selector", {})
            targets = [p for p in self.pods if m.labels_match(selector, m.pod_labels(p.workload))]
            forms = pods.service_forms(service["metadata"]["name"], self.namespace)
            lines += [f"{p.address}\t{' '.join(forms)}" for p in targets]
        return "\n".join(lines) + "\n"

    def pods_of(self, component: str) -> list[PlayedPod]:
        return [p for p in self.pods if p.component == component]

    def check(self) -> None:
        """Every container still runs (none of them may exit while the fleet is up)."""
        for pod in self.pods:
            for container in pod.containers:
                engine.Container(container).check_alive()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> dict[str, tuple[int, float]]:
        """Every pod stopped at once, each with its terminationGracePeriodSeconds (SIGTERM, SIGKILL after it):
        container -> (exit status, seconds the stop took)."""
        results: dict[str, tuple[int, float]] = {}

        def stop_one(pod: PlayedPod) -> None:
            started = time.monotonic()
            engine.podman("pod", "stop", "--time", str(int(pod.grace)), pod.name, timeout=pod.grace + 60)
            took = time.monotonic() - started
            for container in pod.containers:
                results[container] = (engine.inspect("container", container)["State"]["ExitCode"], took)

        threads = [threading.Thread(target=stop_one, args=(pod,)) for pod in self.pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def close(self) -> None:
        names = [p.name for p in self.pods]
        if names:
            engine.podman("pod", "rm", "--force", "--time", "0", *names, check=False, timeout=180)
        if self.volumes:
            engine.podman("volume", "rm", "--force", *self.volumes, check=False, timeout=120)
        for pod in self.pods:
            if pod.veth:
                netns._ip("link", "del", pod.veth, check=False)
            if pod.netns:
                netns._ip("netns", "del", pod.netns, check=False)
        netns._ip("link", "del", self.bridge, check=False)
        left = netns.leftovers(run_id=self.run_id, prefix=PREFIX)
        if left:
            raise AssertionError(f"kube play teardown left {left}")


def container_facts(name: str) -> dict:
    """What the engine made of a container's spec (podman inspect), reduced to what the test compares."""
    facts = engine.inspect("container", name)
    host = facts["HostConfig"]
    with open(f"/proc/{facts['State']['Pid']}/status") as status:
        proc = dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)
    return {
        "user": facts["Config"]["User"],
        "read_only": host["ReadonlyRootfs"],
        "cap_eff": int(proc["CapEff"], 16),
        "no_new_privs": proc["NoNewPrivs"] == "1",
        "uid": proc["Uid"].split()[0],
        "groups": proc["Groups"].split(),
        "seccomp": proc["Seccomp"] == "2",
        "memory": host["Memory"],
        "cpu_quota": host["CpuQuota"],
        "cpu_period": host.get("CpuPeriod") or 100_000,
        "memory_reservation": host["MemoryReservation"],
        "env": dict(e.split("=", 1) for e in facts["Config"]["Env"]),
        "args": facts["Args"],
        "hostname": facts["Config"]["Hostname"],
        "stop_timeout": facts["Config"]["StopTimeout"],
        "healthcheck": facts["Config"].get("Healthcheck"),
        "mounts": sorted(mount["Destination"] for mount in facts["Mounts"]),
    }

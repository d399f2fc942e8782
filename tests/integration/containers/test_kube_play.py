"""The rendered small-cpu overlay in a real engine: `podman kube play` runs its workloads from the images
scripts/build_images.sh built (tagged with the names the overlay gives them), with the adaptations kube_play.py lists
for what podman 4.3 refuses or ignores (its docstring says exactly which kinds and fields those are).

The engine must create what the manifests say (user, read-only root, no capabilities, no_new_privs, limits,
hostname, the ConfigMap's environment, the actors' ordinals), the fleet must train through the Service names (both
shards written and sampled, the weights version advancing, every actor and the evaluator acting with published
weights, every metrics port answering), and every pod must stop with status 0 within its
terminationGracePeriodSeconds after SIGTERM.
"""

from __future__ import annotations

import time

import pytest

from apexrl.common.grpc_util import wait_for_health
from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.integration.containers import engine
from tests.integration.containers.kube_play import ADAPTATIONS, KubePlay, container_facts
from tests.integration.deploy import pods
from tests.support.netns import netns_unavailable
from tests.unit.deploy import manifests as m

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(m.kubectl_missing() is not None, reason=m.kubectl_missing() or ""),
]

OVERLAY = "overlays/small-cpu"
ROLE_METRICS = {
    "replay": "apexrl_replay_",
    "learner": "apexrl_learner_",
    "actor": "apexrl_actor_",
    "evaluator": "apexrl_actor_",
}


def tag_as_the_overlay_names_them(objects: list[dict], images: engine.Images) -> list[str]:
    """The overlay's image references (registry.example.com/apexrl/...) point at the images just built: kube play
    uses a local image of that name and pulls nothing (imagePullPolicy IfNotPresent for a version tag). Returns
    the names, to untag afterwards."""
    built = {"apexrl-replay": images.replay, "apexrl-train": images.train}
    names = sorted({c.spec["image"] for c in m.Fleet(objects).containers()})
    for name in names:
        engine.podman("tag", built[name.rsplit("/", 1)[-1].split(":")[0]], name)
    return names


def check_engine_honoured_the_spec(play: KubePlay) -> list[str]:
    """Compare each running container with its spec; return the table rows printed by the test."""
    rows = []
    for pod in play.pods:
        spec = m.pod_spec(pod.workload)
        container = spec["containers"][0]
        sc = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        facts = container_facts(pod.containers[0])
        assert facts["user"] == f"{sc['runAsUser']}:{sc['runAsGroup']}" and facts["uid"] == str(
            sc["runAsUser"]
        )
        assert facts["read_only"] is sc["readOnlyRootFilesystem"] is True
        assert facts["cap_eff"] == 0 and facts["no_new_privs"], facts
        assert facts["seccomp"], "seccompProfile RuntimeDefault: podman's default filter must apply"
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert facts["memory"] == m.quantity(limits["memory"]), (pod.name, facts["memory"])
        assert facts["memory_reservation"] == m.quantity(requests["memory"]), (pod.name, facts)
        assert facts["cpu_quota"] / facts["cpu_period"] == pytest.approx(m.quantity(limits["cpu"])), facts
        assert facts["hostname"] in (pod.name, pod.name.rsplit("-pod-", 1)[0]), facts["hostname"]
        config_map = play.fleet.config_map_data(container["envFrom"][0]["configMapRef"]["name"])
        assert all(facts["env"].get(k) == v for k, v in config_map.items()), "envFrom ConfigMap not applied"
        if pod.component == "actor":
            assert facts["env"]["ACTOR_INDEX"] == str(pod.ordinal), "the pod-index label's fieldRef"
        assert not any("$(" in arg for arg in facts["args"]), facts["args"]
        expected_mounts = sorted(v["mountPath"] for v in container.get("volumeMounts", []))
        assert facts["mounts"] == expected_mounts, (pod.name, facts["mounts"])
        rows.append(
            f"{pod.name:24} {pod.address:14} user {facts['user']} groups {','.join(facts['groups']) or '-'} "
            f"(fsGroup {spec['securityContext'].get('fsGroup')}) ro-root caps 0 nnp seccomp "
            f"mem {facts['memory'] // 2**20} MiB cpu {facts['cpu_quota'] / facts['cpu_period']:g} "
            f"stop-timeout {facts['stop_timeout']} s (spec {pod.grace:.0f}) "
            f"healthcheck {'none' if not facts['healthcheck'] else ' '.join(facts['healthcheck']['Test'][1:4])}"
        )
    return rows


def test_the_small_cpu_overlay_runs_under_podman_kube_play(images, tmp_path):
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    objects = m.render(m.K8S / OVERLAY)
    tags = tag_as_the_overlay_names_them(objects, images)
    try:
        run_the_overlay(objects, tmp_path)
    finally:
        for tag in tags:
            engine.podman("untag", tag, tag, check=False)  # `podman untag IMAGE NAME`: the extra name only


def run_the_overlay(objects: list[dict], tmp_path) -> None:
    with KubePlay(objects, tmp_path) as play:
        play.start()
        print(
            f"\n{OVERLAY} under podman kube play: {len(play.pods)} pods "
            f"({', '.join(p.name for p in play.pods)}); not played: {play.skipped}"
        )
        print("adaptations:\n  " + "\n  ".join(ADAPTATIONS))

        shards, learner = play.pods_of("replay"), play.pods_of("learner")[0]
        for shard in shards:
            engine.wait_until(
                lambda s=shard: wait_for_health(f"{s.address}:{s.port('grpc')}", timeout=2) or True,
                f"{shard.name} reports SERVING (its readiness probe)",
                120,
                check=play.check,
            )
        engine.wait_until(
            lambda: wait_for_health(f"{learner.address}:{learner.port('grpc')}", timeout=2) or True,
            "the learner reports SERVING",
            180,
            check=play.check,
        )
        print(f"[{play.elapsed():5.1f}s] shards and learner SERVING")
        print("what the engine made of the specs:\n  " + "\n  ".join(check_engine_honoured_the_spec(play)))

        clients = {s.name: ReplayClient(f"{s.address}:{s.port('grpc')}", timeout=3) for s in shards}
        params = ParameterClient(f"{learner.address}:{learner.port('grpc')}", timeout=3)
        try:
            engine.wait_until(
                lambda: all(
                    c.info(timeout=3).inserted_total > 0 and c.info(timeout=3).sampled_total > 0
                    for c in clients.values()
                ),
                "both shards written (actors, through the headless Service name) and sampled (the learner)",
                240,
                check=play.check,
            )
            first = engine.wait_until(params.version, "the learner publishes weights", 120, check=play.check)
            version = engine.wait_until(
                lambda: (v := params.version()) > first and v,
                f"the weights version grows past {first}",
                120,
                check=play.check,
            )
            print(
                f"[{play.elapsed():5.1f}s] weights version {first} -> {version}; shards (inserted, sampled): "
                f"{ {n: (i.inserted_total, i.sampled_total) for n, i in ((n, c.info(timeout=3)) for n, c in clients.items())} }"
            )
            actors = play.pods_of("actor") + play.pods_of("evaluator")
            engine.wait_until(
                lambda: all(
                    pods.scrape(p.address, p.port("metrics")).get("apexrl_actor_weight_version", 0) > 0
                    for p in actors
                ),
                "every actor and the evaluator act with published weights",
                120,
                check=play.check,
            )
            for pod in play.pods:
                values = pods.scrape(pod.address, pod.port("metrics"))
                assert any(k.startswith(ROLE_METRICS[pod.component]) for k in values), pod.name
        finally:
            params.close()
            for client in clients.values():
                client.close()

        started = time.monotonic()
        stopped = play.stop()
        print(
            f"[{play.elapsed():5.1f}s] SIGTERM to every pod: (exit status, seconds) "
            f"{ {name: (code, round(took, 1)) for name, (code, took) in stopped.items()} } "
            f"({time.monotonic() - started:.1f} s in all)"
        )
        for pod in play.pods:
            for container in pod.containers:
                code, took = stopped[container]
                assert code == 0, f"{container} exited {code}:\n{engine.Container(container).logs()}"
                assert took < pod.grace, f"{container} needed {took:.1f} s of its {pod.grace:.0f} s"
                logs = engine.Container(container).logs(400)
                assert "Traceback" not in logs, f"{container}:\n{logs[-4000:]}"

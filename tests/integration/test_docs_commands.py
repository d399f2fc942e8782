"""Every shell block of the README, docs/ and monitoring/README.md either runs here as written, against real
processes, or is listed in NOT_RUN with the reason it cannot (a cluster, other machines, root on a real host, a
download). A block added to the documentation fails this test until it is put in one list or the other.

A block that runs does so in a sandbox folder that links the repository's .venv and copies examples/ and
monitoring/ (the documented commands start at the repository root) and inside a fresh network namespace, so that its fixed ports
(7000, 9090, ...) meet nothing else on this machine and nothing leaves loopback (tests/support/doc_runner.py). A
long-running command (an `apexrl` role, `apexrl launch`, Prometheus) runs until it reports ready and is then stopped
with SIGTERM, which it must survive cleanly; any other command must exit 0. The only differences from the
documents are the RUNS' `replace` and `drop` entries, each with its reason, and each checked to still match.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.doc_blocks import Block, shell_blocks

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/*.md", "monitoring/README.md", "k8s/README.md")
LINKS = (".venv",)  # linked into the sandbox
COPIES = ("examples", "monitoring")  # copied (commands write runs/ beside what they read)


@dataclass(frozen=True)
class Run:
    """How documented blocks run here, in order, in one sandbox."""

    blocks: tuple[str, ...]  # Block.key of each
    together: bool = False  # services stay up together (one fleet), else stopped once ready
    replace: tuple[tuple[str, str, str], ...] = ()  # (text, replacement, why): the only edits made
    drop: tuple[tuple[str, str], ...] = ()  # (start of a command, why): commands left out
    checks: tuple[dict, ...] = ()  # doc_runner checks, once every command ran
    slow: bool = False


TIMESTAMP = (
    "TIMESTAMP stands for the run's start time: the glob finds the run the launch just made (stopped once "
    "it ran, the learner's checkpoint at exit is there to play and export)"
)
INSTALLS = "installs packages from the network; scripts/setup.sh installed every extra into the linked .venv"
METRICS = "http://127.0.0.1:{port}/metrics"

RUNS: dict[str, Run] = {
    "two commands, then the trained policy": Run(
        (
            "README.md: bash scripts/setup.sh && .venv/bin/apexrl launch",
            "README.md: apexrl export runs/CartPole-v1-TIMESTAMP --format torchscript --out cart",
        ),
        replace=(
            ("bash scripts/setup.sh && ", "", "setup.sh " + INSTALLS.split(";")[0]),
            ("runs/CartPole-v1-TIMESTAMP", "runs/CartPole-v1-*", TIMESTAMP),
        ),
        drop=(
            (
                "apexrl evaluate runs/CartPole-v1-TIMESTAMP --episodes 3 --render",
                "opens a window: needs a display",
            ),
        ),
    ),
    "your own environment": Run(
        ("README.md: cd examples/custom_env",),
        replace=(("runs/Corridor-v0-TIMESTAMP", "runs/Corridor-v0-*", TIMESTAMP),),
        slow=True,
    ),
    "roles by hand": Run(
        ("README.md: apexrl replay --host 0.0.0.0 --port 7000 --metrics-port 9000 --capacity ",),
        together=True,
        replace=(("HOST:", "127.0.0.1:", "HOST stands for the reader's machine"),),
        checks=(
            {
                "kind": "counter_above",
                "url": METRICS.format(port=9200),
                "name": "apexrl_learner_updates_total",
                "above": 0,
            },  # the fleet trains, and every role is on the metrics port the README gives
            {
                "kind": "counter_above",
                "url": METRICS.format(port=9303),
                "name": "apexrl_actor_env_steps_total",
                "above": 0,
            },
            {
                "kind": "counter_above",
                "url": METRICS.format(port=9400),
                "name": "apexrl_actor_episodes_total",
                "above": 0,
            },
            {
                "kind": "counter_above",
                "url": METRICS.format(port=9001),
                "name": "apexrl_replay_inserted_rows_total",
                "above": 0,
            },
            {
                "kind": "counter_above",
                "url": METRICS.format(port=9100),
                "name": "apexrl_params_current_version",
                "above": -1,
            },
        ),
    ),
    "a fleet file's machine": Run(("README.md: apexrl launch --config examples/fleet.toml --host-name m1",)),
    "TLS": Run(
        (
            "README.md: openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -da",
            "README.md: apexrl launch --tls-cert node.pem --tls-key node-key.pem --tls-ca ca.pem",
        )
    ),
    "Prometheus recipe": Run(
        ("monitoring/README.md: apexrl launch --run-dir runs/demo --target-return 1000",),
        together=True,
        checks=(
            {
                "kind": "prometheus_scrapes",
                "url": "http://127.0.0.1:9090",
                "targets_file": "runs/demo/prometheus/targets.json",
            },
        ),
    ),
    "pixels": Run(("README.md: pip install -e '.[atari]'",), drop=(("pip install", INSTALLS),), slow=True),
    "continuous control": Run(
        ("README.md: apexrl launch --env Pendulum-v1",), drop=(("pip install", INSTALLS),), slow=True
    ),
}

K8S = (
    "needs a container registry and a Kubernetes cluster; tests/integration/deploy/ renders the manifests and "
    "runs them as pods in network namespaces"
)
NOT_RUN: dict[str, str] = {
    "README.md: bash scripts/test.sh": "runs this test suite (and setup.sh's installs): CI runs it",
    "README.md: apexrl launch --algorithm r2d2 --env CartPoleNoVel-v1": "a training run of minutes: "
    "tests/integration/launcher/test_r2d2_launch.py runs it for 40 s and plays its kept policy",
    "README.md: .venv/bin/python bench/replay_bench.py": "benchmarks of minutes each; tests/integration/"
    "test_bench_smoke.py runs their quick modes",
    "docs/deploy-kubernetes.md: REGISTRY=registry.example.com/apexrl": "docker builds: the image recipe is checked "
    "by tests/integration/deploy/test_image_recipe.py",
    "docs/deploy-kubernetes.md: BASE=python:3.11-slim-bookworm": "docker builds from a registry's base image "
    "(network)",
    "docs/deploy-kubernetes.md: apt-get install -y podman runc catatonit mmdebstrap": "installs packages, then "
    "builds both images (minutes): tests/integration/containers/ builds and runs them",
    "docs/deploy-kubernetes.md: for role in actor evaluator learner operator; do": K8S,
    "docs/deploy-kubernetes.md: kubectl -n apexrl port-forward pod/apexrl-replay-0 7000 &": K8S
    + " (and grpcurl)",
    "docs/deploy-kubernetes.md: docker login registry.example.com": K8S,
    "docs/deploy-kubernetes.md: cd k8s/overlays/small-cpu": "needs the standalone kustomize binary and a registry",
    "docs/deploy-kubernetes.md: apexrl signature --env ENV --algorithm r2d2 --part signature": "ENV stands for "
    "the user's environment: tests/unit/actor/test_replay_signature.py runs these parts for CartPoleNoVel-v1 and "
    "compares them with what apexrl launch gives its shards",
    "docs/deploy-kubernetes.md: kubectl kustomize k8s/overlays/small-cpu | less": K8S,
    "docs/deploy-kubernetes.md: kubectl -n apexrl scale statefulset apexrl-replay --replicas=4": K8S,
    "docs/deploy-kubernetes.md: cd k8s/overlays/small-cpu && kustomize edit set replicas apexrl-actor=16": K8S,
    "docs/deploy-kubernetes.md: kubectl -n apexrl logs -f deployment/apexrl-learner": K8S,
    "docs/deploy-kubernetes.md: kubectl create namespace apexrl": K8S + " (and cert-manager)",
    "docs/deploy-kubernetes.md: NS=apexrl": K8S + " (it ends by creating the Secret)",
    "docs/deploy-kubernetes.md: kubectl -n apexrl logs apexrl-replay-0 | grep serving": K8S
    + " (and grpcurl)",
    "docs/deploy-machines.md: apexrl launch --config fleet.toml --host-name NAME": "a template (the reader's file "
    "and machine name)",
    "docs/deploy-machines.md: git clone https://YOUR-GIT-HOST/apexrl.git /opt/apexrl-src": "clones and "
    + INSTALLS,
    "docs/deploy-machines.md: for h in m1 m2 m3; do scp fleet.toml root@$h:/etc/apexrl/fleet.toml; don": "copies to other machines over ssh",
    "docs/deploy-machines.md: ufw allow from 10.0.0.0/24 to any port 7000:7001 proto tcp": "changes a real "
    "machine's firewall",
    "docs/deploy-machines.md: m1$ apexrl launch --config /etc/apexrl/fleet.toml --host-name m1": "three machines: tests/integration/launcher/test_three_machines.py runs that fleet in network namespaces",
    "docs/deploy-machines.md: m3$ kill -TERM <launcher pid>": "stops the three machines' launchers above",
    "docs/deploy-machines.md: install -D -m 0644 /opt/apexrl-src/examples/systemd/apexrl.sysusers.conf": "installs a systemd unit on a real host; tests/integration/launcher/test_deploy_examples.py checks the unit",
    "docs/deploy-machines.md: sudo .venv/bin/python -m pytest tests/integration/launcher/test_three_ma": "a test of this suite",
    "docs/deploy-machines.md: ip link add apexbr0 type bridge && ip link set apexbr0 up": "changes the host's network as root for two minutes; test_three_machines.py runs the same fleet file in "
    "network namespaces it cleans up",
}


def blocks() -> dict[str, Block]:
    found = shell_blocks(REPO, DOCUMENTS)
    by_key = {block.key: block for block in found}
    assert len(by_key) == len(found), "two shell blocks of one file start with the same command"
    return by_key


def test_every_shell_block_is_run_or_listed_with_the_reason_it_is_not():
    documented = set(blocks())
    run = {key for plan in RUNS.values() for key in plan.blocks}
    assert not run & set(NOT_RUN), run & set(NOT_RUN)
    unlisted = documented - run - set(NOT_RUN)
    assert not unlisted, f"shell blocks neither run nor listed in NOT_RUN: {sorted(unlisted)}"
    stale = (run | set(NOT_RUN)) - documented
    assert not stale, f"listed blocks that no document has any more: {sorted(stale)}"
    assert all(reason.strip() for reason in NOT_RUN.values())


def test_install_lines_install_the_clone_not_a_published_package():
    """apexrl is used from its clone (scripts/setup.sh): `pip install 'apexrl[atari]'` would look for a package of
    that name on PyPI. Every documented install of apexrl names a path (`pip install -e '.[atari]'`)."""
    published = re.compile(r"pip install[^`\n]*?(?<![\w/.-])apexrl\[")
    found = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for pattern in (*DOCUMENTS, "examples/**/*.md")
        for path in REPO.glob(pattern)
        for line in path.read_text().splitlines()
        if published.search(line)
    ]
    assert not found, found


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_edit_still_matches_its_block(name):
    plan = RUNS[name]
    commands = [c for key in plan.blocks for c in blocks()[key].commands()]
    for text, _, why in plan.replace:
        assert why and any(text in c for c in commands), f"{name}: nothing to replace for {text!r}"
    for start, why in plan.drop:
        assert why and any(c.startswith(start) for c in commands), f"{name}: no command starts with {start!r}"


def commands_of(plan: Run) -> list[str]:
    """The plan's commands as they run: its blocks' commands, with its drops left out and its replacements made."""
    result = []
    for key in plan.blocks:
        for command in blocks()[key].commands():
            if any(command.startswith(start) for start, _ in plan.drop):
                continue
            for text, replacement, _ in plan.replace:
                command = command.replace(text, replacement)
            result.append(command)
    return result


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> list[str] | None:
    """The command prefix that runs a program in a fresh network namespace, or None when none can be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    done = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return prefix if done.returncode == 0 else None


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if p.slow else []) for n, p in sorted(RUNS.items())]
)
def test_documented_commands_run_as_written(name, tmp_path):
    prefix = namespace_prefix()
    if prefix is None:
        pytest.skip(
            "needs a network namespace (unshare --net, or user namespaces): the documented fixed ports must "
            "meet no other program of this machine"
        )
    plan = RUNS[name]
    spec = {
        "repo": str(REPO),
        "sandbox": str(tmp_path / "sandbox"),
        "links": list(LINKS),
        "copies": list(COPIES),
        "commands": commands_of(plan),
        "together": plan.together,
        "checks": list(plan.checks),
    }
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "tests.support.doc_runner", "--network-namespace"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=560,
    )
    assert done.returncode == 0, f"{name}:\n{done.stdout}{done.stderr[-3000:]}"

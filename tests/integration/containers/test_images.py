"""The images, built for real: scripts/build_images.sh builds both targets with podman from the repository's
Dockerfile (only PYTHON_IMAGE differs: a Debian bookworm base made from Debian's packages, pinned by digest), torch
the CPU wheel scripts/setup.sh installs. Then what a platform team checks of an image: its size against a budget
(and what fills it), no torch or gymnasium in the replay image, the OCI labels naming the commit and the pinned
base, a numeric non-root default user, `apexrl --version` inside, and a small build context.

The build is once per session (conftest.py); with its layers cached (an earlier run on this machine) it takes
seconds, from scratch about 4 minutes on 2 cores (base 35 s, replay 30 s, train 2.5 min: torch's bytecode).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.integration.containers import engine
from tests.unit.deploy import dockerfile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MB = 1e6  # podman reports sizes in bytes and prints decimal MB
# Budgets, with room over the measured sizes (replay 320 MB: base 179 + environment 150; train 1,457 MB: base 179
# + environment 1,346, torch alone 790). A dependency that doubles an image fails here, not in a cluster's pulls.
REPLAY_BUDGET_MB = 380
REPLAY_ENVIRONMENT_BUDGET_MB = 200
TRAIN_BUDGET_MB = 1700
BASE_BUDGET_MB = 200
CONTEXT_BUDGET_BYTES = 2 * 2**20


def image_size(image: str) -> int:
    return engine.inspect("image", image)["Size"]


def site_packages(image: str, top: int = 6) -> list[tuple[int, str]]:
    """The largest entries of the image's environment, in MB (du inside the image)."""
    script = f"du -sk /opt/apexrl/lib/python3*/site-packages/* | sort -n | tail -n {top}"
    result = engine.run_once(image, "-c", script, entrypoint="/bin/sh")
    assert result.returncode == 0, result.stderr
    rows = [line.split(None, 1) for line in result.stdout.splitlines()]
    return [(int(kb) * 1024 // 10**6, Path(path).name) for kb, path in reversed(rows)]


def environment_size(image: str) -> int:
    result = engine.run_once(image, "-c", "du -sk /opt/apexrl", entrypoint="/bin/sh")
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[0]) * 1024


def test_both_images_build_within_their_size_budgets(images):
    base = image_size("localhost/apexrl-base:bookworm-python3.11")
    sizes = {name: image_size(image) for name, image in (("replay", images.replay), ("train", images.train))}
    report = [
        f"build: {images.seconds:.0f} s (scripts/build_images.sh, both targets)",
        f"base localhost/apexrl-base:bookworm-python3.11: {base / MB:.0f} MB",
    ]
    for name, image in (("replay", images.replay), ("train", images.train)):
        env = environment_size(image)
        largest = ", ".join(f"{package} {mb}" for mb, package in site_packages(image))
        report.append(
            f"{image}: {sizes[name] / MB:.0f} MB = base {base / MB:.0f} + /opt/apexrl {env / MB:.0f} MB; "
            f"largest (MB): {largest}"
        )
    print("\n" + "\n".join(report))
    assert base <= BASE_BUDGET_MB * MB
    assert sizes["replay"] <= REPLAY_BUDGET_MB * MB, report
    assert environment_size(images.replay) <= REPLAY_ENVIRONMENT_BUDGET_MB * MB, report
    assert sizes["train"] <= TRAIN_BUDGET_MB * MB, report


def test_the_replay_image_carries_no_torch_or_gymnasium(images):
    probe = (
        "import importlib.util as u, importlib.metadata as md, json; "
        "print(json.dumps({'found': [n for n in ('torch', 'gymnasium', 'matplotlib') if u.find_spec(n)], "
        "'dists': sorted(d.metadata['Name'].lower() for d in md.distributions())}))"
    )
    result = engine.run_once(images.replay, "-c", probe, entrypoint="/opt/apexrl/bin/python")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["found"] == [], found
    assert not {"torch", "gymnasium", "matplotlib", "nvidia-cublas-cu12"} & set(found["dists"]), found[
        "dists"
    ]
    assert {"apexrl", "grpcio", "numpy"} <= set(found["dists"])


def test_the_train_image_holds_the_cpu_torch_build(images):
    probe = "import torch, gymnasium; print(torch.__version__, torch.version.cuda)"
    result = engine.run_once(images.train, "-c", probe, entrypoint="/opt/apexrl/bin/python")
    assert result.returncode == 0, result.stderr
    version, cuda = result.stdout.split()
    assert version == "2.13.0+cpu" and cuda == "None", result.stdout


def test_images_carry_labels_a_non_root_user_and_answer_version(images, version):
    base = engine.inspect("image", "localhost/apexrl-base:bookworm-python3.11")
    revision = (
        subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=engine.REPO, capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    for target, image in (("replay", images.replay), ("train", images.train)):
        facts = engine.inspect("image", image)
        config, labels = facts["Config"], facts["Config"]["Labels"]
        assert config["User"] == "10001:10001" and config["Entrypoint"] == ["apexrl"], config
        assert labels["org.opencontainers.image.title"] == f"apexrl-{target}"
        assert labels["org.opencontainers.image.version"] == version
        assert labels["org.opencontainers.image.revision"] == revision
        # The commit's time (unknown outside a git checkout): unchanged sources build to cached layers.
        assert labels["org.opencontainers.image.created"].endswith("Z") or revision == "unknown", labels
        assert "@" not in labels["org.opencontainers.image.source"].split("://")[-1], "credentials in the URL"
        # The base is pinned: its name carries the digest of exactly the base image used.
        assert labels["org.opencontainers.image.base.name"] == f"localhost/apexrl-base@{base['Digest']}", (
            labels
        )
        # The default user and entry point, under the pod-like settings: `apexrl --version` (no arguments given but
        # the flag) prints the package's version.
        answer = engine.run_once(image, "--version")
        assert answer.returncode == 0 and answer.stdout.strip() == f"apexrl {version}", answer
        for role in ("replay", *(("learner", "actor", "launch") if target == "train" else ())):
            result = engine.run_once(image, role, "--help")
            assert result.returncode == 0 and "usage: apexrl" in result.stdout, (role, result.stderr[-2000:])
        print(
            f"{image}: user {config['User']}, base {labels['org.opencontainers.image.base.name']}, "
            f"revision {labels['org.opencontainers.image.revision'][:12]}, `apexrl --version`: {answer.stdout.strip()}"
        )


def test_the_build_context_is_small(images, tmp_path):
    """What podman sends as the build context, measured by podman itself: a throwaway build that COPYs the whole
    context (after .dockerignore) and measures it."""
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text(
        textwrap.dedent("""\
        FROM localhost/apexrl-base:bookworm-python3.11
        COPY . /context
        RUN cd /context && echo "context $(du -sb . | cut -f1) bytes $(find . -type f | wc -l) files" \\
            && echo "top: $(ls -A | tr '\\n' ' ')"
    """)
    )
    # The same ignore file as the real build (podman reads CONTAINERFILE.dockerignore before the context's).
    (tmp_path / "Containerfile.dockerignore").write_text((engine.REPO / ".dockerignore").read_text())
    tag = f"localhost/apexrl-context-probe:{os.getpid()}"
    try:
        result = engine.podman(
            "build",
            "--network",
            "none",
            "--no-cache",
            "--file",
            str(containerfile),
            "--tag",
            tag,
            str(engine.REPO),
            timeout=300,
        )
    finally:
        engine.podman("rmi", "--force", tag, check=False)
    line = next(x for x in result.stdout.splitlines() if x.startswith("context "))
    size, files = int(line.split()[1]), int(line.split()[3])
    top = set(next(x for x in result.stdout.splitlines() if x.startswith("top: ")).split()[1:])
    print(
        f"\nbuild context after .dockerignore: {size / 2**20:.2f} MiB, {files} files: {' '.join(sorted(top))}"
    )
    assert size <= CONTEXT_BUDGET_BYTES, line
    assert not {".git", ".venv", "tests", "bench", "docs", "k8s", "examples"} & top, top
    copied = {
        src.rstrip("/").split("/")[0]
        for _s, _i, flags, srcs, _d in dockerfile.parse().copies()
        if "from" not in flags
        for src in srcs
    }
    assert copied <= top, f"the Dockerfile COPYs {sorted(copied - top)}, which the context lacks"

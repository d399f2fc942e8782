"""The Dockerfile, read without a container engine (none runs here): its targets, user, entry point and labels,
that every COPY'd path exists and reaches the build context, and that every install step is docker/install.sh.
tests/integration/deploy/test_image_recipe.py runs that script from the same COPY'd context."""

from __future__ import annotations

import re

import pytest

from tests.unit.deploy import dockerfile as d

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

TARGETS = {"replay": "replay", "train": "train"}  # image target -> install.sh target
OCI_LABELS = ("title", "description", "version", "revision", "created", "source", "licenses")


@pytest.fixture(scope="module")
def recipe() -> d.Dockerfile:
    return d.parse()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((d.REPO / "pyproject.toml").read_text())


def install_runs(recipe: d.Dockerfile, target: str) -> list[list[str]]:
    """The docker/install.sh invocations along a target's chain of stages (each RUN's words)."""
    runs = []
    for stage in recipe.chain(target):
        for i in stage.all("RUN"):
            words = i.args.split()
            if "docker/install.sh" in words:
                runs.append(words[words.index("docker/install.sh") + 1 :])
    return runs


def test_targets_exist_and_each_installs_into_a_stage_of_its_own(recipe):
    names = [s.name for s in recipe.stages]
    assert len(names) == len(set(names)), f"duplicate stage names: {names}"
    for target, install_target in TARGETS.items():
        copies = [
            (flags, srcs, dest)
            for stage in recipe.chain(target)
            for (s, _i, flags, srcs, dest) in recipe.copies()
            if s is stage and "from" in flags
        ]
        assert len(copies) == 1, f"target {target} should take its environment from one build stage: {copies}"
        flags, srcs, dest = copies[0]
        assert srcs == ["/opt/apexrl"] and dest == "/opt/apexrl"
        build = recipe.stage(flags["from"])
        assert install_runs(recipe, build.name) == [
            ["--dependencies", install_target, "/opt/apexrl", "/src"],
            [install_target, "/opt/apexrl", "/src"],
        ]
        # The dependencies (torch: minutes) are installed from pyproject.toml alone, before any source file is
        # copied: a change of the source rebuilds only the layer that installs apexrl over them.
        first_install = next(
            stage
            for stage in recipe.chain(build.name)
            if any("docker/install.sh" in i.args for i in stage.all("RUN"))
        )
        copied = [
            src
            for stage in recipe.chain(first_install.name)
            for (s, _i, _flags, srcs, _dest) in recipe.copies()
            if s is stage
            for src in srcs
        ]
        assert sorted(copied) == ["docker/install.sh", "pyproject.toml"], copied
        # The runtime image itself installs nothing: no pip, no compiler, no build context beyond the venv.
        assert install_runs(recipe, target) == []


def test_no_install_step_outside_docker_install_sh(recipe):
    for stage in recipe.stages:
        for i in stage.all("RUN"):
            assert not re.search(r"\bpip\b|\bapt-get\b|\bapk\b", i.args), (
                f"Dockerfile:{i.line}: install steps belong in docker/install.sh (the tests run it), not {i.args!r}"
            )


def test_targets_run_apexrl_as_a_fixed_non_root_user(recipe):
    for target in TARGETS:
        user = recipe.effective(target, "USER")
        assert user is not None, f"{target} sets no USER"
        assert re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", user.args), (
            f"{target}: USER {user.args!r} must be a numeric non-root uid (Kubernetes checks runAsNonRoot on it)"
        )
        entry = recipe.effective(target, "ENTRYPOINT")
        assert entry is not None and entry.flags_and_words()[1] == ["apexrl"], (
            f"{target}: ENTRYPOINT is not apexrl"
        )
        path = next(i for s in recipe.chain(target) for i in s.all("ENV") if i.args.startswith("PATH="))
        assert path.args.startswith("PATH=/opt/apexrl/bin:"), (
            "the installed environment must come first on PATH"
        )
    # The user is created with that uid, so tools that look the user up (and Python's home) find it.
    run = " ".join(i.args for s in recipe.chain("replay") for i in s.all("RUN"))
    uid = d.image_uid("replay")
    assert f"--uid {uid}" in run and d.image_uid("train") == uid


def test_oci_labels_and_version(recipe, pyproject):
    for target in TARGETS:
        labels = recipe.labels(target)
        for key in OCI_LABELS:
            assert f"org.opencontainers.image.{key}" in labels, (
                f"{target} lacks org.opencontainers.image.{key}"
            )
        assert all(k.startswith("org.opencontainers.image.") for k in labels), labels
        assert target in labels["org.opencontainers.image.title"]
        assert recipe.args(target)["VERSION"] == pyproject["project"]["version"]
    assert (
        recipe.labels("replay")["org.opencontainers.image.licenses"]
        == pyproject["project"]["license"]["text"]
    )


def test_torch_build_arguments_agree_with_install_sh_and_setup_sh(recipe):
    args = recipe.args("build-train")
    install = (d.REPO / "docker" / "install.sh").read_text()
    setup = (d.REPO / "scripts" / "setup.sh").read_text()
    default = re.search(r"TORCH_SPEC:-([^}]+)}", install).group(1)
    assert args["TORCH_SPEC"] == default == re.search(r"APEXRL_TORCH:-([^}]+)}", setup).group(1)
    assert args["TORCH_INDEX_URL"] == re.search(r"TORCH_INDEX_URL-([^}]+)}", install).group(1)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu"), "the default train image is the CPU build"
    assert "TORCH_SPEC" not in recipe.args("build-replay"), "the replay image must not know about torch"


def test_every_copied_path_exists_is_in_the_context_and_covers_the_package(recipe, pyproject):
    patterns = d.ignore_patterns()
    sources = []
    for _stage, i, flags, srcs, _dest in recipe.copies():
        assert i.keyword == "COPY", f"Dockerfile:{i.line}: use COPY, not ADD"
        if "from" in flags:
            assert flags["from"] in {s.name for s in recipe.stages}, f"Dockerfile:{i.line}: unknown stage"
            continue
        for src in srcs:
            assert (d.REPO / src).exists(), f"Dockerfile:{i.line}: COPY {src}: no such path"
            assert not d.ignored(src.rstrip("/"), patterns), (
                f"Dockerfile:{i.line}: .dockerignore excludes {src}"
            )
            sources.append(src.rstrip("/"))
    # What `pip install .` reads: pyproject.toml, the readme it names, every package folder it maps.
    needed = [
        "pyproject.toml",
        pyproject["project"]["readme"],
        "docker/install.sh",
        *pyproject["tool"]["setuptools"]["package-dir"].values(),
    ]
    missing = [n for n in needed if n not in sources]
    assert not missing, f"the Dockerfile does not COPY {missing}"


def test_dockerignore_keeps_build_junk_out(tmp_path):
    patterns = d.ignore_patterns()
    for junk in (
        ".git/config",
        ".venv/bin/python",
        "common/__pycache__/x.cpython-311.pyc",
        "runs/a/b.csv",
        "apexrl.egg-info/PKG-INFO",
        "tests/conftest.py",
    ):
        assert d.ignored(junk, patterns), f".dockerignore lets {junk} into the context"
    sources = d.build_context(tmp_path)
    assert (tmp_path / "docker" / "install.sh").is_file() and (tmp_path / "pyproject.toml").is_file()
    assert not list(tmp_path.rglob("__pycache__")), "the context must not carry bytecode"
    assert "common/" in sources

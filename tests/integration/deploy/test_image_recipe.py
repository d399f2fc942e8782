"""The container image recipe, exercised without a container engine (none runs here): the build context the
Dockerfile's COPY lines take (less .dockerignore) is copied into a folder, and docker/install.sh, the image's
only install step, installs each target from it into a fresh prefix, as the build stages do into /opt/apexrl.
Then the entry points run from those prefixes: the replay install (no torch, no gymnasium) serves a real shard,
and the train install runs a learner and an actor against it.

One install per target for the whole module (the train one unpacks torch: about a minute), without bytecode
compilation (install.sh's PIP_ARGS=--no-compile; the image compiles it). torch comes from
pip's configuration (here: the CPU wheel on disk, as scripts/setup.sh installs it) unless APEXRL_TORCH_INDEX_URL
names an index, e.g. https://download.pytorch.org/whl/cpu, the image's default.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apexrl.common.grpc_util import wait_for_health
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import cartpole_batch
from tests.unit.deploy.dockerfile import build_context

# An install takes about a minute of CPU (the train one: unpacking torch); on a loaded machine, several of wall time.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

INSTALL_TIMEOUT = 900


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process in the image: nothing from this test's virtual environment leaks in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(Path(sys.prefix)))
    )
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def install(context: Path, target: str, prefix: Path) -> None:
    """As the image's build stages do: the dependencies from pyproject.toml alone, then apexrl over them."""
    started = time.monotonic()
    for phase in (["--dependencies"], []):
        result = subprocess.run(
            ["sh", str(context / "docker" / "install.sh"), *phase, target, str(prefix), str(context)],
            cwd=prefix.parent,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            env=clean_env(
                PYTHON=sys.executable,
                TORCH_INDEX_URL=os.environ.get("APEXRL_TORCH_INDEX_URL", ""),
                PIP_ARGS="--no-compile",
            ),
        )
        assert result.returncode == 0, (
            f"install.sh {' '.join(phase)} {target} failed:\n{result.stdout}\n{result.stderr[-4000:]}"
        )
    size = sum(f.stat().st_size for f in prefix.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"\ninstall.sh {target}: {time.monotonic() - started:.0f} s, {size / 2**20:.0f} MiB in {prefix}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Iterator[Path]:
    """The build context and both prefixes; removed at the end (the train prefix is over 1 GB)."""
    root = tmp_path_factory.mktemp("image")
    build_context(root / "context")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def replay_prefix(workdir) -> Path:
    prefix = workdir / "replay"
    install(workdir / "context", "replay", prefix)
    return prefix


@pytest.fixture(scope="module")
def train_prefix(workdir) -> Path:
    prefix = workdir / "train"
    install(workdir / "context", "train", prefix)
    return prefix


def run(prefix: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(prefix / "bin" / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=prefix,
        env=clean_env(),
    )


def start(prefix: Path, log: Path, *argv: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(prefix / "bin" / "apexrl"), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=prefix,
            env=clean_env(),
        )


def wait_for_file(path: Path, process: subprocess.Popen, log: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"exited {process.returncode} early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout:.0f} s:\n{log.read_text()}"
        time.sleep(0.05)
    return path.read_text().strip()


def stop(process: subprocess.Popen, timeout: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def test_replay_install_carries_no_torch_or_gymnasium(replay_prefix):
    probe = (
        "import importlib.util as u, importlib.metadata as md, json, apexrl.replay_server.server.main as m; "
        "print(json.dumps({'missing': [n for n in ('torch', 'gymnasium', 'matplotlib') if not u.find_spec(n)], "
        "'file': m.__file__, 'dists': sorted(d.metadata['Name'].lower() for d in md.distributions())}))"
    )
    result = run(replay_prefix, "python", "-c", probe)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["missing"] == ["torch", "gymnasium", "matplotlib"], found
    assert found["file"].startswith(str(replay_prefix)), (
        "apexrl must come from the prefix, not the source tree"
    )
    assert "apexrl" in found["dists"] and "grpcio" in found["dists"]
    assert not {"torch", "gymnasium", "matplotlib"} & set(found["dists"])


def test_replay_entry_point_answers_help(replay_prefix):
    result = run(replay_prefix, "apexrl", "--help")
    assert result.returncode == 0 and "replay" in result.stdout, result.stderr
    result = run(replay_prefix, "apexrl", "replay", "--help")
    assert result.returncode == 0 and "--capacity" in result.stdout, result.stderr


def test_replay_entry_point_serves_a_shard(replay_prefix, tmp_path):
    port_file, log = tmp_path / "replay.port", tmp_path / "replay.log"
    shard = start(
        replay_prefix,
        log,
        "replay",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--metrics-port",
        "-1",
        "--capacity",
        "1000",
        "--port-file",
        str(port_file),
    )
    try:
        address = f"127.0.0.1:{wait_for_file(port_file, shard, log)}"
        wait_for_health(address, timeout=20)
        with ReplayClient(address) as client:
            client.insert(cartpole_batch(100))
            client.flush(timeout=20)
            info = client.info(timeout=10)
        assert (info.size, info.capacity) == (100, 1000)
        assert stop(shard) == 0, log.read_text()
    finally:
        if shard.poll() is None:
            shard.kill()
            shard.wait()
    assert "Traceback" not in log.read_text()


def test_train_install_runs_every_role_entry_point(train_prefix):
    result = run(
        train_prefix,
        "python",
        "-c",
        "import torch, gymnasium; print(torch.__version__, torch.version.cuda is None)",
    )
    assert result.returncode == 0, result.stderr
    version, cpu_only = result.stdout.split()
    assert version.startswith("2.13.0") and cpu_only == "True", result.stdout
    for role, flag in (
        ("learner", "--replay"),
        ("actor", "--actor-index"),
        ("launch", "--config"),
        ("replay", "--capacity"),
    ):
        result = run(train_prefix, "apexrl", role, "--help")
        assert result.returncode == 0 and flag in result.stdout, f"apexrl {role} --help: {result.stderr}"


def test_train_install_trains_against_the_replay_install(replay_prefix, train_prefix, tmp_path):
    """A learner and an actor from the train install, a shard from the replay install, talking gRPC as pods do."""
    logs = {name: tmp_path / f"{name}.log" for name in ("replay", "learner", "actor")}
    processes: list[subprocess.Popen] = []
    try:
        shard = start(
            replay_prefix,
            logs["replay"],
            "replay",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--capacity",
            "5000",
            "--port-file",
            str(tmp_path / "replay.port"),
        )
        processes.append(shard)
        shard_address = f"127.0.0.1:{wait_for_file(tmp_path / 'replay.port', shard, logs['replay'])}"
        learner = start(
            train_prefix,
            logs["learner"],
            "learner",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--port-file",
            str(tmp_path / "learner.port"),
            "--replay",
            shard_address,
            "--run-dir",
            str(tmp_path / "run"),
            "--device",
            "cpu",
            "--min-replay-size",
            "200",
            "--batch-size",
            "32",
            "--hidden-sizes",
            "16",
            "--publish-every",
            "5",
            "--max-updates",
            "40",
            "--seed",
            "0",
        )
        processes.append(learner)
        params_address = f"127.0.0.1:{wait_for_file(tmp_path / 'learner.port', learner, logs['learner'])}"
        actor = start(
            train_prefix,
            logs["actor"],
            "actor",
            "--host",
            "127.0.0.1",
            "--metrics-port",
            "-1",
            "--replay",
            shard_address,
            "--params",
            params_address,
            "--batch-size",
            "16",
            "--pull-every",
            "20",
            "--seed",
            "0",
        )
        processes.append(actor)
        deadline = time.monotonic() + 240
        while learner.poll() is None:
            assert actor.poll() is None, (
                f"the actor exited ({actor.returncode}):\n{logs['actor'].read_text()}"
            )
            assert time.monotonic() < deadline, f"the learner did not finish:\n{logs['learner'].read_text()}"
            time.sleep(0.2)
        assert learner.returncode == 0, logs["learner"].read_text()
        assert (tmp_path / "run" / "checkpoints" / "checkpoint.pt").is_file()
        assert "learner stopped after 40 updates" in logs["learner"].read_text()
        assert stop(actor) == 0, logs["actor"].read_text()
        with ReplayClient(shard_address) as client:
            info = client.info(timeout=10)
        assert info.inserted_total >= 200 and info.sampled_total >= 32 * 40
        assert stop(shard) == 0, logs["replay"].read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for name, log in logs.items():
        assert "Traceback" not in log.read_text(), f"{name}:\n{log.read_text()}"
    print(f"shard: {info.inserted_total} rows inserted, {info.sampled_total} sampled; learner: 40 updates")

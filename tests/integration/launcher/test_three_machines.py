"""Three machines from one fleet file: network namespaces m1, m2, m3 on one bridge, each with its own address and an
/etc/hosts naming the others, each running `apexrl launch --config fleet.toml --host-name mN` in its own working
directory, as examples/fleets/three_machines.toml ships (only its [hosts] addresses replaced by the namespaces').

m1 serves the replay shards, m2 runs the learner (hosting the parameter service) and the evaluator, m3 the
exploring actors. The launchers start in reverse order, so each must wait for the other machines' services. The
fleet must train across the bridge: the learner's machine sees env steps (scraped from m3's actors) and its own
updates advance, and weight versions published on m2 reach the actors on m3. SIGTERM then stops the launchers,
users first (m3, m2, m1); each exits as documented, with no process left in its namespace. About 15 s on 2 cores.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from apexrl.launcher.fleet_file import load_config
from apexrl.launcher.topology import roles
from tests.conftest import wait_until
from tests.support.netns import NamespaceNetwork

pytest_plugins = ("tests.support.fixtures",)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fleets" / "three_machines.toml"
MACHINES = ("m1", "m2", "m3")
MAX_SECONDS = 150  # each launcher stops itself after this, should the test not get to stop it
DEADLINE = 140  # seconds from the first start for the fleet to reach the thresholds below
MIN_UPDATES = 300  # learner updates (m2)
MIN_ENV_STEPS = 5000  # exploring actors' env steps, as m2 scrapes them from m3
MIN_VERSION = 20  # weight version seen on both sides


@dataclass
class Machine:
    name: str
    home: Path  # its working directory: run directories land in home/runs/
    process: subprocess.Popen

    @property
    def out(self) -> Path:
        return self.home / "launch.out"

    def stderr_tail(self) -> str:
        return (self.home / "launch.err").read_text(errors="replace")[-3000:]

    def run_dir(self) -> Path | None:
        found = sorted(self.home.glob("runs/*/config.json"))
        return found[0].parent if found else None

    def result(self) -> dict:
        """The launcher's final JSON line."""
        lines = self.out.read_text().strip().splitlines()
        assert lines, f"{self.name} printed nothing; stderr:\n{self.stderr_tail()}"
        return json.loads(lines[-1])


def fleet_file_for(network: NamespaceNetwork, path: Path) -> Path:
    """The shipped example with the [hosts] addresses replaced by the namespaces' addresses: nothing else changes."""
    text = EXAMPLE.read_text()
    shipped = load_config(EXAMPLE).hosts
    assert sorted(shipped) == list(MACHINES)
    for host, placeholder in shipped.items():
        assert text.count(f'"{placeholder}"') == 1, placeholder
        text = text.replace(f'"{placeholder}"', f'"{network.address(host)}"')
    path.write_text(text)
    assert dict(load_config(path).hosts) == network.addresses
    return path


def core_only(tmp_path: Path) -> Path:
    """A directory whose sitecustomize makes the training-only packages unimportable, in every process that has it
    on PYTHONPATH (the launcher and the roles it starts)."""
    directory = tmp_path / "core-only"
    directory.mkdir(exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        "import sys\nfor name in ('torch', 'gymnasium', 'matplotlib'):\n    sys.modules[name] = None\n"
    )
    return directory


def last_progress(run_dir: Path | None) -> dict[str, str]:
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except (TypeError, FileNotFoundError):
        return {}
    return rows[-1] if rows else {}


def number(row: dict[str, str], key: str) -> int:
    return int(float(row.get(key) or 0))


def actor_versions(run_dir: Path | None) -> list[int]:
    """Weight versions the actors' finished episodes ended with (their episode CSVs on m3)."""
    versions = []
    for path in sorted(run_dir.glob("episodes/actor-*.csv")) if run_dir else []:
        with open(path, newline="") as f:
            versions += [int(row["weight_version"]) for row in csv.DictReader(f) if row.get("weight_version")]
    return versions


def scrape_inside(network: NamespaceNetwork, machine: str, urls: list[str]) -> dict[str, dict[str, float]]:
    """Prometheus samples of `urls`, fetched from inside `machine` (by the other machines' names)."""
    code = textwrap.dedent(f"""
        import json, urllib.request
        from prometheus_client.parser import text_string_to_metric_families
        out = {{}}
        for url in {urls!r}:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            out[url] = {{s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}}
        print(json.dumps(out))
    """)
    done = network.run(machine, [sys.executable, "-c", code], timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


# Role mode with least privilege (issue 31 item 2): each machine holds the tokens of the roles it runs and, for the
# services it serves, only the SHA-256 of its callers' tokens: no machine holds a credential of a role it does not
# run, and the shards' machine holds none at all.
TOKENS = {"learner": "t-learner-2b7e", "actor": "t-actor-91c0", "evaluator": "t-evaluator-5d13"}
MACHINE_TOKENS = {
    "m1": {"learner.sha256", "actor.sha256", "evaluator.sha256"},  # the shards verify every caller
    "m2": {"learner", "evaluator", "actor.sha256"},  # the learner's parameter service verifies the actors
    "m3": {"actor"},
}


def role_tokens(home: Path, machine: str) -> Path:
    """`machine`'s token directory (MACHINE_TOKENS), owner-only."""
    directory = home / "tokens"
    directory.mkdir(mode=0o700)
    for name in MACHINE_TOKENS[machine]:
        role = name.removesuffix(".sha256")
        text = hashlib.sha256(TOKENS[role].encode()).hexdigest() if name.endswith(".sha256") else TOKENS[role]
        path = directory / name
        path.write_text(text)
        path.chmod(0o600)
    return directory


@pytest.mark.timeout(DEADLINE + 180)
@pytest.mark.parametrize("access", ["open", "roles"])
def test_a_fleet_file_trains_across_three_machines(netns_network, tmp_path, access):
    network = netns_network(MACHINES)
    fleet = fleet_file_for(network, tmp_path / "fleet.toml")
    config = load_config(fleet)
    placement = {role.name: role.host for role in roles(config)}
    assert {h for n, h in placement.items() if n.startswith("shard")} == {"m1"}
    assert placement["learner"] == "m2" and {h for n, h in placement.items() if n.startswith("actor")} == {
        "m3"
    }

    machines: dict[str, Machine] = {}
    start = time.monotonic()
    try:
        for name in reversed(MACHINES):  # actors first: each launcher waits for the services it needs
            home = tmp_path / name
            home.mkdir()
            argv = [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "launch",
                "--config",
                str(fleet),
                "--host-name",
                name,
                "--max-seconds",
                str(MAX_SECONDS),
                "--progress-seconds",
                "1",
                "--target-return",
                "1000000",
            ]  # the test stops the fleet: solving first would end it early
            if access == "roles":
                argv += ["--role-tokens", str(role_tokens(home, name))]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if name == "m1":
                # m1 listens on its own address only (m2 and m3 on every interface, as the file says), and (open)
                # runs as a shards-only install would: torch, gymnasium and matplotlib cannot be imported there. In
                # role mode it must pin the shards' columns (an actor may not fix them), which needs gymnasium.
                argv += ["--bind", network.address(name)]
                if access == "open":
                    env["PYTHONPATH"] = os.pathsep.join(
                        filter(None, [str(core_only(tmp_path)), env.get("PYTHONPATH")])
                    )
            with open(home / "launch.out", "w") as out, open(home / "launch.err", "w") as err:
                process = network.popen(
                    name, argv, cwd=home, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
                )
            machines[name] = Machine(name, home, process)

        # Train until the learner's machine sees updates and env steps, and the actors play with new weights.
        progress: dict[str, str] = {}
        versions: list[int] = []
        while True:
            for machine in machines.values():
                assert machine.process.poll() is None, (
                    f"{machine.name}'s launcher exited early ({machine.process.returncode}):\n{machine.stderr_tail()}"
                )
            progress = last_progress(machines["m2"].run_dir())
            versions = actor_versions(machines["m3"].run_dir())
            if (
                number(progress, "updates") >= MIN_UPDATES
                and number(progress, "env_steps") >= MIN_ENV_STEPS
                and number(progress, "weight_version") >= MIN_VERSION
                and max(versions, default=0) >= MIN_VERSION
            ):
                break
            assert time.monotonic() - start < DEADLINE, (
                f"no training across machines within {DEADLINE}s: m2 progress {progress}, actor weight versions "
                f"{sorted(set(versions))[-5:]}; m2 stderr:\n{machines['m2'].stderr_tail()}"
            )
            time.sleep(0.5)
        trained_at = time.monotonic() - start

        # From m1, by host name across the bridge: m3's actors hold weights m2's learner published (scraped in this
        # order, so no actor can be ahead of the learner's reading).
        actor_urls = [f"http://m3:{r.metrics_port}/metrics" for r in roles(config) if r.kind == "actor"]
        learner_url = f"http://m2:{config.learner.metrics_port}/metrics"
        # Every actor reaches MIN_VERSION in its own time (one held back by a shard's rate limiter pulls later):
        # scrape until all have, within the deadline, never behind a fixed wait.
        while True:
            seen = scrape_inside(network, "m1", [*actor_urls, learner_url])
            learner_version = seen[learner_url]["apexrl_learner_weight_version"]
            actor_weights = [seen[url]["apexrl_actor_weight_version"] for url in actor_urls]
            assert all(v <= learner_version for v in actor_weights), (actor_weights, learner_version)
            if all(v >= MIN_VERSION for v in actor_weights):
                break
            assert time.monotonic() - start < DEADLINE, (
                f"actors' weight versions {actor_weights} stay below "
                f"{MIN_VERSION} (learner: {learner_version})"
            )
            time.sleep(0.5)
        # m1 was told to listen on its own address only: its shards are not on its loopback.
        shard_port = config.shards[0].port
        probe = network.run(
            "m1",
            [
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {shard_port}), timeout=5)",
            ],
            timeout=30,
        )
        assert "ConnectionRefusedError" in probe.stderr, probe

        # SIGTERM, users of services first; each launcher stops its roles and prints its summary.
        results = {}
        for name in reversed(MACHINES):
            machine = machines[name]
            machine.process.send_signal(signal.SIGTERM)
            code = machine.process.wait(60)
            results[name] = result = machine.result()
            assert result["reason"] == "signal" and result["restarts"] == 0, (
                name,
                result,
                machine.stderr_tail(),
            )
            # Only m2 checks the target return: unsolved, a stop is status 1 there ("not solved"), 0 elsewhere.
            assert code == (1 if name == "m2" and not result["solved"] else 0), (
                name,
                code,
                machine.stderr_tail(),
            )
            # A role's own children (the learner's sampler process, multiprocessing's resource tracker) may still be
            # ending for a moment after the launcher reaped the roles: wait for the namespace to empty, but not long.
            wait_until(
                lambda ns=name: network.pids(ns) == [],
                f"no process left in {name} after its launcher exited",
                timeout=30,
            )
            assert "killing" not in machine.stderr_tail(), (
                machine.stderr_tail()
            )  # each role ended within grace
            for log in machine.run_dir().glob("logs/*.log"):
                assert "Traceback" not in log.read_text(errors="replace"), (
                    f"{name} {log.name}:\n{log.read_text()}"
                )
    finally:
        for machine in machines.values():
            if machine.process.poll() is None:
                machine.process.kill()
                machine.process.wait(10)

    learner_side = results["m2"]
    assert learner_side["updates"] >= MIN_UPDATES and learner_side["env_steps"] >= MIN_ENV_STEPS
    m2_dir, m3_dir = machines["m2"].run_dir(), machines["m3"].run_dir()
    assert {p.stem for p in (m3_dir / "episodes").glob("*.csv")} == {
        f"actor-{i}" for i in range(config.num_actors)
    }
    assert [p.stem for p in (m2_dir / "episodes").glob("*.csv")] == ["evaluator"]
    assert not list(m2_dir.glob("episodes/actor-*.csv"))  # m2 learnt of m3's steps over the network only
    print(
        f"\nthree machines: trained in {trained_at:.0f}s; learner side (m2): {learner_side['env_steps']:,} env "
        f"steps, {learner_side['updates']:,} updates, weights v{number(last_progress(m2_dir), 'weight_version')}; "
        f"actors on m3 at weights v{min(actor_weights):.0f}..v{max(actor_weights):.0f} "
        f"(learner v{learner_version:.0f} at that moment); summaries {json.dumps(results)}"
    )

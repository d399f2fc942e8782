"""A real Prometheus server (Debian's `prometheus` package) scraping a real local fleet on loopback, the fleet over
mutual TLS (so that every process exports its certificates' expiry, which the certificate alerts read): `apexrl
launch` writes its file-SD targets file, Prometheus (1 s scrapes, the project's rules loaded) scrapes every process, the
key series move, every rule evaluates without error, and EVERY PromQL expression of the dashboards and the rules
returns data; every series scraped is in docs/metrics.md. The run directory also holds the TensorBoard curves of
the learner and of the launcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.certs import make_certs
from tests.unit.monitoring.expressions import RULES, all_expressions, rules

PROMETHEUS = shutil.which("prometheus")
EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "prometheus.yml"
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# The whole test, fleet start to clean stop, stays within this (the fleet's own limit is a safety net).
BUDGET_SECONDS = 90

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is missing: install Debian's prometheus "
        "package (scripts/setup.sh does, as root)",
    ),
]


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def poll(self, condition, what: str, *, alive=None, every: float = 0.25):
        """condition()'s first truthy value; fails naming `what` when the deadline passes (never a fixed sleep)."""
        while True:
            if alive is not None:
                alive()
            value = condition()
            if value:
                return value
            assert self.left() > 0, f"timed out waiting until {what}"
            time.sleep(every)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """`prometheus` on 127.0.0.1 with the example configuration, pointed at `targets` and the project's rules."""

    def __init__(self, tmp_path: Path, targets: Path) -> None:
        config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
        config["rule_files"] = [str(RULES)]
        config["scrape_configs"][0]["file_sd_configs"] = [{"files": [str(targets)]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = tmp_path / "prometheus.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address={self.url[7:]}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> None:
        assert self.process.poll() is None, f"prometheus exited: {self.log_path.read_text()[-3000:]}"

    def get(self, path: str, **params) -> dict:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def total(self, expr: str) -> float:
        result = self.query(f"sum({expr})")
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)


def running_roles(run_dir: Path) -> list[str]:
    """Roles whose exact command line (config.json records them) is still a running process."""
    commands = {
        r["name"]: "\0".join(r["command"]).encode() + b"\0"
        for r in json.loads((run_dir / "config.json").read_text())["roles"]
        if r["command"]
    }
    running = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            running += [name for name, command in commands.items() if cmdline == command]
    return running


def scalar_tags(logdir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not logdir.is_dir():
        return set()
    events = EventAccumulator(str(logdir))
    events.Reload()
    return set(events.Tags()["scalars"])


# Each dashboard against the fleet it is for: the fleet dashboard on CartPole (Ape-X DQN), the continuous-control
# one on Pendulum (Ape-X DPG); the rules hold for both.
FLEETS = [
    ("CartPole-v1", "apexrl-fleet.json", set()),
    ("Pendulum-v1", "apexrl-dpg.json", {"learner/policy_loss"}),
]


@pytest.mark.timeout(BUDGET_SECONDS + 60)
@pytest.mark.parametrize(("env_id", "dashboard", "learner_curves"), FLEETS, ids=[f[0] for f in FLEETS])
def test_prometheus_scrapes_every_process_and_every_dashboard_and_rule_expression_returns_data(
    tmp_path, env_id, dashboard, learner_curves
):
    deadline = Deadline(BUDGET_SECONDS)
    run_dir = tmp_path / "run"
    certs = make_certs(tmp_path / "certs")
    out, err = tmp_path / "launch.out", tmp_path / "launch.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        launch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.launcher",
                "launch",
                "--env",
                env_id,
                "--num-shards",
                "2",
                "--num-actors",
                "2",
                "--seed",
                "0",
                "--min-replay-size",
                "200",
                "--target-return",
                "1000",
                "--max-seconds",
                "150",
                "--progress-seconds",
                "2",
                "--run-dir",
                str(run_dir),
                "--tls-cert",
                certs.cert,
                "--tls-key",
                certs.key,
                "--tls-ca",
                certs.ca,
            ],
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    prometheus = None

    def fleet_alive() -> None:
        assert launch.poll() is None, f"the launcher exited early: {err.read_text()[-3000:]}"

    try:
        targets_file = run_dir / "prometheus" / "targets.json"
        deadline.poll(targets_file.exists, "the launcher wrote its targets file", alive=fleet_alive)
        groups = json.loads(targets_file.read_text())
        assert sorted(g["labels"]["role"] for g in groups) == [
            "actor-0",
            "actor-1",
            "evaluator",
            "learner",
            "shard-0",
            "shard-1",
        ]
        assert "file_sd_configs" in err.read_text()  # the launcher said how to point Prometheus at it

        prometheus = Prometheus(tmp_path, targets_file)
        deadline.poll(prometheus.ready, "prometheus is ready", alive=prometheus.alive)

        # Every process is scraped, under the labels of the targets file.
        def all_up():
            active = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
            return len(active) == len(groups) and all(t["health"] == "up" for t in active) and active

        active = deadline.poll(all_up, "every target is scraped and up", alive=prometheus.alive)
        assert sorted((t["labels"]["job"], t["labels"]["role"], t["scrapeUrl"]) for t in active) == sorted(
            (g["labels"]["job"], g["labels"]["role"], f"http://{g['targets'][0]}/metrics") for g in groups
        )
        up = prometheus.query('up{job=~"apexrl-.+"}')
        assert len(up) == len(groups) and all(sample["value"][1] == "1" for sample in up)

        # The key series move: environment steps, inserts, learner updates.
        for series in (
            'apexrl_actor_env_steps_total{job="apexrl-actor"}',
            'apexrl_replay_inserted_rows_total{job="apexrl-replay"}',
            'apexrl_learner_updates_total{job="apexrl-learner"}',
        ):
            first = prometheus.total(series)
            deadline.poll(
                lambda s=series, f=first: prometheus.total(s) > f, f"{series} increases", alive=fleet_alive
            )

        # Every expression of the dashboards and the rules returns data (alerts: without their comparison).
        expressions = [
            e
            for e in all_expressions()
            if not e.where.startswith("dashboard ") or e.where.startswith(f"dashboard {dashboard} ")
        ]
        assert any(e.where.startswith(f"dashboard {dashboard} ") for e in expressions)
        pending = {e.where: e for e in expressions}

        def all_answer():
            for where, expression in list(pending.items()):
                if prometheus.query(expression.query):
                    del pending[where]
            return not pending

        try:
            deadline.poll(all_answer, "every expression returns data", alive=fleet_alive, every=1.0)
        except AssertionError:
            raise AssertionError(
                f"no data for {len(pending)} of {len(expressions)} expressions: "
                + "; ".join(f"{w}: {e.query}" for w, e in pending.items())
            ) from None
        print(
            f"\n{len(expressions)} of {len(expressions)} expressions returned data "
            f"({sum(e.where.startswith('dashboard') for e in expressions)} dashboard, "
            f"{sum(not e.where.startswith('dashboard') for e in expressions)} rule); "
            f"targets scraped: {', '.join(sorted(t['labels']['role'] for t in active))}"
        )

        # Every rule evaluates without error, and the recorded series exist.
        def rules_healthy():
            groups_ = prometheus.get("/api/v1/rules")["data"]["groups"]
            loaded = [r for g in groups_ for r in g["rules"]]
            return len(loaded) == len(rules()) and all(r["health"] == "ok" for r in loaded) and loaded

        loaded = deadline.poll(rules_healthy, "every rule evaluated without error", alive=prometheus.alive)
        assert not [r["lastError"] for r in loaded if r.get("lastError")]
        # A recorded series appears at the rule group's next evaluation after its expression has data.
        for rule in rules():
            if "record" in rule:
                deadline.poll(
                    lambda r=rule["record"]: prometheus.query(r),
                    f"recorded series {rule['record']}",
                    alive=prometheus.alive,
                )

        # Every apexrl series the fleet exports is in the generated metrics reference.
        reference = METRICS_DOC.read_text()
        scraped = {
            name
            for name in prometheus.get("/api/v1/label/__name__/values")["data"]
            if name.startswith("apexrl_") and not name.endswith("_created")
        }
        assert len(scraped) >= 40 and not {n for n in scraped if f"`{n}`" not in reference}

        # TensorBoard curves, flushed while the fleet runs.
        tensorboard = run_dir / "tensorboard"
        deadline.poll(
            lambda: (
                {"learner/loss", "learner/mean_q", "learner/updates_per_second", *learner_curves}
                <= scalar_tags(tensorboard / "learner")
            ),
            "the learner's curves are on disk",
            alive=fleet_alive,
            every=1.0,
        )
        deadline.poll(
            lambda: (
                {"return/evaluation_mean_100", "return/exploration_mean_100"}
                <= scalar_tags(tensorboard / "episodes")
            ),
            "the launcher's return curves are on disk",
            alive=fleet_alive,
            every=1.0,
        )
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGTERM)
        try:
            launch.wait(30)
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.wait(10)
            if prometheus is not None:
                prometheus_status = prometheus.stop()
    assert prometheus_status == 0, prometheus.log_path.read_text()[-3000:]
    result = json.loads(out.read_text().strip().splitlines()[-1])
    assert result["reason"] == "signal" and result["updates"] > 0 and result["env_steps"] > 0, result
    assert running_roles(run_dir) == []
    assert deadline.left() > -30, "the test overran its budget"

"""Flow control and memory in a real fleet: fast actors against a learner that stops (SIGSTOP: the slowest possible
learner), then against a shard that stops. Every queue between the processes is bounded and exported as a metric;
this test scrapes those metrics and every process's resident memory while the fleet runs, and asserts that no
queue passes its bound and no process's memory grows past its ceiling, and that the fleet recovers after each stop.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.integration.launcher.test_main import launch  # noqa: F401 (the fixture; its cleanup continues stopped roles)

MIB = 1 << 20
# Resident-memory ceilings per role (MiB), two to three times what each role holds here at steady state (measured
# on this fleet: shard ~62, actor ~65, evaluator ~64, learner ~332 with torch, launcher ~93): a queue that grew
# without bound while a peer is stopped would pass them (an actor's output alone is ~1 MB of batches a second).
CEILING_MIB = {"replay": 160, "actor": 160, "evaluator": 160, "learner": 700, "launcher": 250}
# Growth allowed between the end of the warm-up and the end of the test, per process (allocator noise, caches).
GROWTH_MIB = 64
ACTORS = 4
SHARDS = 2
ACTOR_BACKLOG_BOUND = 8  # ReplayClient max_in_flight in the actor (actor/apex_actor.py)
STOP_SECONDS = 10.0


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def scrape(port: int, timeout: float = 2.0) -> dict[tuple[str, tuple], float]:
    """Every sample of a role's /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: dict, name: str) -> float:
    return sum(value for (n, _), value in samples.items() if n == name)


@dataclass
class Watch:
    """Peak resident memory per process and peak queue depths, sampled while the fleet runs."""

    pids: dict[str, int]
    kinds: dict[str, str]
    metrics_ports: dict[str, int]
    peak_rss: dict[str, int] = field(default_factory=dict)
    baseline_rss: dict[str, int] = field(default_factory=dict)
    peak_queue: dict[str, float] = field(default_factory=dict)

    def sample(self, skip: frozenset[str] = frozenset()) -> None:
        for name, pid in self.pids.items():
            if (rss := rss_bytes(pid)) is not None:
                self.peak_rss[name] = max(self.peak_rss.get(name, 0), rss)
        for name, port in self.metrics_ports.items():
            if name in skip:
                continue  # a stopped process does not answer
            try:
                samples = scrape(port)
            except OSError:
                continue
            for key, value in self.queue_depths(name, samples).items():
                self.peak_queue[key] = max(self.peak_queue.get(key, 0.0), value)

    def queue_depths(self, name: str, samples: dict) -> dict[str, float]:
        kind = self.kinds[name]
        if kind == "actor":
            return {
                f"{name} backlog to {labels[0][1]}": value
                for (n, labels), value in samples.items()
                if n == "apexrl_actor_insert_backlog_batches"
            }
        if kind == "learner":
            return {
                "learner prefetch queue": metric(samples, "apexrl_learner_prefetch_queue_batches"),
                "learner priority updates outstanding": metric(
                    samples, "apexrl_learner_priority_updates_outstanding"
                ),
            }
        if kind == "replay":
            return {
                f"{name} insert queue": metric(samples, "apexrl_replay_insert_queue_batches"),
                f"{name} waiting inserts": metric(samples, "apexrl_replay_waiting_calls", call="insert"),
            }
        return {}

    def run_for(self, seconds: float, skip: frozenset[str] = frozenset()) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sample(skip)
            time.sleep(0.25)  # the sampling period of this watch, not a synchronisation


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stopped_learner_then_a_stopped_shard_keep_every_queue_and_every_process_memory_bounded(launch):  # noqa: F811
    run = launch(
        "--num-shards",
        str(SHARDS),
        "--num-actors",
        str(ACTORS),
        "--replay-capacity",
        "20000",
        "--min-replay-size",
        "500",
        "--max-seconds",
        "200",
    )
    pids = run.wait_running(
        running={
            "shard-0": "replay shard serving on",
            "shard-1": "replay shard serving on",
            "learner": "learner for CartPole-v1",
            **{f"actor-{i}": f"actor {i}/{ACTORS} on CartPole-v1" for i in range(ACTORS)},
        }
    )
    roles = {r["name"]: r for r in run.config()["roles"]}
    kinds = {name: roles[name]["kind"] for name in pids}
    watch = Watch(
        pids={**pids, "launcher": run.process.pid},
        kinds={**kinds, "launcher": "launcher"},
        metrics_ports={name: roles[name]["metrics_port"] for name in pids},
    )
    learner_port = roles["learner"]["metrics_port"]
    shard_ports = {name: roles[name]["metrics_port"] for name in pids if kinds[name] == "replay"}

    def updates() -> float:
        return metric(scrape(learner_port), "apexrl_learner_updates_total")

    def sampled(shard: str) -> float:
        return metric(scrape(shard_ports[shard]), "apexrl_replay_sampled_rows_total")

    # Warm-up: the fleet trains; memory at the end of it is each process's baseline.
    wait_until(lambda: updates() >= 200, "the learner trains", timeout=90)
    watch.run_for(3.0)
    watch.baseline_rss = {name: rss_bytes(pid) or 0 for name, pid in watch.pids.items()}

    # 1. The learner stops: the shards' rate limiters hold the actors' inserts back (samples per insert 8), the
    #    actors' backlogs fill to their bound and the actors wait instead of queueing more.
    os.kill(pids["learner"], signal.SIGSTOP)
    watch.run_for(STOP_SECONDS, skip=frozenset({"learner"}))
    held_back = max(watch.peak_queue.get(f"{s} waiting inserts", 0.0) for s in shard_ports)
    queues_while_learner_stopped = dict(watch.peak_queue)
    inserted_while_stopped = {
        s: total(scrape(p), "apexrl_replay_inserted_rows_total") for s, p in shard_ports.items()
    }
    watch.run_for(2.0, skip=frozenset({"learner"}))
    still_inserting = {
        s: total(scrape(p), "apexrl_replay_inserted_rows_total") - inserted_while_stopped[s]
        for s, p in shard_ports.items()
    }
    os.kill(pids["learner"], signal.SIGCONT)
    resumed_at = updates()
    wait_until(lambda: updates() > resumed_at + 100, "the learner trains again after SIGCONT", timeout=60)

    # 2. A shard stops: the actors' backlogs to it fill to their bound and they write to the other shard.
    before = sampled("shard-0")
    os.kill(pids["shard-0"], signal.SIGSTOP)
    watch.run_for(STOP_SECONDS, skip=frozenset({"shard-0"}))
    other_grew = sampled("shard-1")
    os.kill(pids["shard-0"], signal.SIGCONT)
    wait_until(
        lambda: sampled("shard-0") > before, "the learner samples the continued shard again", timeout=60
    )
    wait_until(lambda: sampled("shard-1") > other_grew, "and the other one", timeout=30)
    watch.run_for(2.0)

    run.process.send_signal(signal.SIGTERM)
    code, result, err = run.wait()
    run.assert_no_role_left()

    report = "\n".join(
        f"  {name}: baseline {watch.baseline_rss[name] / MIB:.0f} MiB, peak "
        f"{watch.peak_rss[name] / MIB:.0f} MiB"
        for name in sorted(watch.peak_rss)
    )
    print(f"resident memory per process:\n{report}\npeak queue depths: {watch.peak_queue}")
    # Back pressure reached the shards while the learner was stopped, and it held the writers.
    assert held_back >= 1, (queues_while_learner_stopped, inserted_while_stopped, still_inserting)
    assert sum(still_inserting.values()) < 2000, still_inserting  # a trickle at most (tolerance), not a flood
    for name, depth in watch.peak_queue.items():
        if "backlog" in name:
            assert depth <= ACTOR_BACKLOG_BOUND, (name, depth)
        elif "insert queue" in name:
            assert depth <= ACTORS + 1, (name, depth)  # one batch per open stream at most (evaluator: none)
        elif name == "learner prefetch queue":
            assert depth <= 4, depth
        elif name == "learner priority updates outstanding":
            assert depth <= 64 * SHARDS, depth
    assert any(
        depth == ACTOR_BACKLOG_BOUND
        for name, depth in watch.peak_queue.items()
        if "to 127.0.0.1" in name and name.endswith(str(roles["shard-0"]["port"]))
    ), watch.peak_queue  # the stopped shard's backlog filled
    for name, peak in watch.peak_rss.items():
        ceiling = CEILING_MIB[watch.kinds[name]] * MIB
        assert peak <= ceiling, (
            f"{name}: {peak / MIB:.0f} MiB over its ceiling {ceiling / MIB:.0f} MiB\n{report}"
        )
        assert peak - watch.baseline_rss[name] <= GROWTH_MIB * MIB, f"{name} grew\n{report}"
    assert result["updates"] > resumed_at

"""Cross-shard sampling stays exact while the fleet changes, with real shard processes.

The stated bound (learner/sharded_client.py): an allocation never uses totals older than `max_staleness` (plus one
Info round trip), and a shard that failed is asked again within `max_backoff`. So a shard that was empty, held
only zero priorities, restarted or joined late is sampled in proportion to its mass within
max_backoff + max_staleness of being ready. Each test waits out that bound once (the bound is what is tested),
then draws many batches and compares how many rows came from each shard with its share of the total priority by a
chi-square test at significance 1e-3 (fixed seeds: the outcome is reproducible, the threshold says how unlikely a
failure of a correct sampler would be).
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from scipy import stats

from apexrl.learner.sharded_client import ShardedReplayClient
from apexrl.replay_server.client.replay_client import ReplayClient
from tests.conftest import cartpole_batch, start_shard_process

STALENESS = 0.5
BACKOFF = 1.0
BOUND = STALENESS + BACKOFF + 0.5  # plus room for one Info round trip on a loaded machine
SIGNIFICANCE = 1e-3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fill(address: str, rows: int, priority: float, start: int = 0) -> None:
    with ReplayClient(address) as client:
        client.insert(cartpole_batch(rows, start), np.full(rows, priority))
        client.flush()


def draw(sampler: ShardedReplayClient, batches: int, batch_size: int = 64) -> np.ndarray:
    """Rows drawn from each shard over `batches` batches."""
    counts = np.zeros(len(sampler.shards), dtype=np.int64)
    for _ in range(batches):
        batch = sampler.sample(batch_size, beta=1.0)
        counts += np.bincount(batch.shard_ids, minlength=len(counts))
    return counts


def assert_proportional(counts: np.ndarray, masses: list[float]) -> None:
    expected = np.asarray(masses) / sum(masses) * counts.sum()
    p = stats.chisquare(counts, expected).pvalue
    print(
        f"\nCHI-SQUARE rows per shard {counts.tolist()}, expected {expected.round(1).tolist()}: p = {p:.3f}"
    )
    assert p > SIGNIFICANCE, (
        f"rows per shard {counts.tolist()} vs expected {expected.round().tolist()}: p = {p:.2e}"
    )


def sampler_for(addresses: list[str]) -> ShardedReplayClient:
    return ShardedReplayClient(addresses, timeout=5.0, seed=7, max_staleness=STALENESS, max_backoff=BACKOFF)


@pytest.fixture
def shard(tmp_path):
    """start(name, port=0) -> ShardProcess, alpha 1 so stored priorities equal raw ones; all killed after."""
    started = []

    def start(name: str, port: int = 0, *extra: str, host: str = "127.0.0.1"):
        proc = start_shard_process(
            tmp_path,
            name,
            "--alpha",
            "1.0",
            "--seed",
            str(len(started)),
            *(("--port", str(port)) if port else ()),
            *extra,
            host=host,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait(10)


@pytest.mark.timeout(120)
def test_an_empty_shard_is_sampled_in_proportion_once_it_fills(shard):
    a, b = shard("a"), shard("b")
    fill(a.address, 500, 1.0)
    with sampler_for([a.address, b.address]) as sampler:
        assert draw(sampler, 5)[1] == 0  # b is empty: never drawn, and not in N
        assert sampler.sample(8).fleet_size == 500
        fill(b.address, 500, 3.0)
        time.sleep(BOUND)
        batch = sampler.sample(64, beta=1.0)
        assert batch.fleet_size == 1000
        assert_proportional(draw(sampler, 200), [500 * 1.0, 500 * 3.0])


@pytest.mark.timeout(120)
def test_a_zero_priority_shard_is_sampled_once_its_priorities_rise(shard):
    a, b = shard("a"), shard("b")
    fill(a.address, 400, 2.0)
    fill(b.address, 400, 0.0)
    with sampler_for([a.address, b.address]) as sampler:
        counts = draw(sampler, 20)
        assert counts[1] == 0 and counts[0] == 20 * 64  # zero priority: never drawn while a has mass
        with ReplayClient(b.address) as client:
            info = client.info()
            keys = np.arange(400, dtype=np.uint64)
            assert (
                client.update_priorities(keys, np.full(400, 6.0), incarnation=info.incarnation).applied == 400
            )
        time.sleep(BOUND)
        assert_proportional(draw(sampler, 200), [400 * 2.0, 400 * 6.0])


@pytest.mark.timeout(120)
def test_reported_probabilities_and_weights_are_the_ones_sampled_with(shard):
    a, b = shard("a"), shard("b")
    fill(a.address, 300, 1.0)
    fill(b.address, 100, 4.0, start=300)
    with sampler_for([a.address, b.address]) as sampler:
        sampler.refresh()
        batch = sampler.sample(256, beta=0.5)
        total = 300 * 1.0 + 100 * 4.0
        priority = np.where(batch.shard_ids == 0, 1.0, 4.0)
        np.testing.assert_allclose(batch.probabilities, priority / total, rtol=1e-12)
        n = 400
        want = (n * batch.probabilities) ** -0.5 / (n * 1.0 / total) ** -0.5
        np.testing.assert_allclose(batch.weights, want, rtol=1e-6)
        assert batch.fleet_size == n and batch.weights.max() == pytest.approx(1.0)


@pytest.mark.timeout(120)
def test_while_a_shard_is_down_weights_and_fleet_size_count_only_the_live_ones(shard):
    a, b = shard("a"), shard("b")
    fill(a.address, 300, 1.0)
    fill(b.address, 300, 1.0, start=300)
    with sampler_for([a.address, b.address]) as sampler:
        assert sampler.sample(64).fleet_size == 600
        b.stop(signal_kill())
        batches = [sampler.sample(64, beta=1.0) for _ in range(5)]
        for batch in batches:
            assert set(batch.shard_ids.tolist()) == {0}
            assert batch.fleet_size == 300
            # uniform priorities on the live shard: every weight is the largest, 1.0
            np.testing.assert_allclose(batch.weights, 1.0, rtol=1e-6)


def signal_kill() -> int:
    import signal

    return signal.SIGKILL


@pytest.mark.timeout(150)
def test_a_restarted_shard_rejoins_and_old_keys_never_reach_its_new_rows(shard):
    port = free_port()
    a, b = shard("a"), shard("b", port)
    fill(a.address, 400, 1.0)
    fill(b.address, 400, 1.0, start=400)
    with sampler_for([a.address, b.address]) as sampler:
        old = sampler.sample(256)
        old_b = old.shard_ids == 1
        assert old_b.any()
        b.stop(signal_kill())
        b2 = shard("b2", port)  # same address, new incarnation, empty: keys count from 0 again
        fill(b2.address, 400, 5.0, start=10_000)
        # The old batch's priority updates carry b's old incarnation: all stale on b2 (a's rows take theirs).
        sampler.update_priorities(old, np.full(len(old.keys), 10.0))
        sampler.flush_updates(timeout=10)
        with ReplayClient(b2.address) as client:
            info = client.info()
            assert info.max_priority == 5.0 and info.updated_total == 0
            # The single-shard client too: an update needs the incarnation its keys came from.
            stale = client.update_priorities(
                old.keys[old_b], np.full(old_b.sum(), 1e6), incarnation=old.incarnations[1]
            )
            assert stale.applied == 0 and client.info().total_priority == pytest.approx(400 * 5.0)
        with ReplayClient(a.address) as client:
            mass_a = client.info().total_priority  # a's sampled rows took the 1e6 updates: its mass grew
        time.sleep(BOUND)
        assert_proportional(draw(sampler, 200), [mass_a, 400 * 5.0])


@pytest.mark.timeout(150)
def test_a_shard_that_joins_late_is_used_without_a_restart(shard):
    port = free_port()
    a = shard("a")
    fill(a.address, 400, 1.0)
    late = f"127.0.0.1:{port}"
    with sampler_for([a.address, late]) as sampler:
        batch = sampler.sample(64, beta=1.0)
        assert set(batch.shard_ids.tolist()) == {0} and batch.fleet_size == 400
        np.testing.assert_allclose(batch.weights, 1.0, rtol=1e-6)
        b = shard("b", port)
        fill(b.address, 400, 2.0, start=400)
        time.sleep(BOUND)
        assert sampler.sample(64).fleet_size == 800
        assert_proportional(draw(sampler, 200), [400 * 1.0, 400 * 2.0])


@pytest.mark.timeout(120)
def test_a_batch_larger_than_a_shards_maximum_is_split(shard):
    a = shard("a", 0, "--max-sample-batch-size", "64")
    b = shard("b", 0, "--max-sample-batch-size", "100")
    fill(a.address, 300, 1.0)
    fill(b.address, 300, 1.0, start=300)
    with sampler_for([a.address, b.address]) as sampler:
        batch = sampler.sample(1000, beta=1.0)
        assert len(batch.keys) == 1000 and set(batch.shard_ids.tolist()) == {0, 1}
        np.testing.assert_allclose(batch.probabilities, 1 / 600, rtol=1e-12)


class MutableName:
    """What a DNS name resolves to, changed by the test (a headless Service whose StatefulSet is scaled). The
    real name resolution through /etc/hosts is exercised with processes in tests/integration/test_elastic_shards.py."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)

    def __call__(self, name: str, port: int) -> list[str]:
        assert name == "apexrl-replay"
        return [a.rsplit(":", 1)[0] for a in self.addresses if int(a.rsplit(":", 1)[1]) == port]


@pytest.mark.timeout(150)
def test_shards_that_a_name_gains_join_with_their_mass_and_those_it_loses_leave_the_weights(shard):
    """Scaling a StatefulSet changes what its headless Service resolves to: a shard that appears is sampled in
    proportion to its mass within resolve_every + the staleness bound; one that disappears leaves the allocation,
    N and the weights' maximum at the next resolution, and its pending priority updates are dropped."""
    port = free_port()
    # Three shards on one port and three loopback addresses, as pods of a StatefulSet share their port.
    a, b, c = (shard(name, port, host=f"127.0.0.{i}") for i, name in ((2, "a"), (3, "b"), (4, "c")))
    fill(a.address, 300, 1.0)
    fill(b.address, 300, 3.0, start=300)
    fill(c.address, 300, 1.0, start=600)
    name = MutableName(a.address, b.address)
    resolve_every = 0.5
    with ShardedReplayClient(
        [f"dns:///apexrl-replay:{port}"],
        timeout=5.0,
        seed=7,
        max_staleness=STALENESS,
        max_backoff=BACKOFF,
        resolve_every=resolve_every,
        resolver=name,
    ) as sampler:
        assert sampler.addresses == [a.address, b.address]
        assert_proportional(draw(sampler, 100)[:2], [300 * 1.0, 300 * 3.0])
        name.addresses.append(c.address)  # scaled up
        time.sleep(resolve_every + BOUND)
        assert sampler.sample(64).fleet_size == 900 and sampler.addresses == [a.address, b.address, c.address]
        assert_proportional(draw(sampler, 200), [300 * 1.0, 300 * 3.0, 300 * 1.0])
        held = sampler.sample(128, beta=1.0)
        name.addresses.remove(b.address)  # scaled down: b is gone for the sampler (its process may live on)
        time.sleep(resolve_every)
        batches = [sampler.sample(64, beta=1.0) for _ in range(100)]
        b_id = 1
        for batch in batches:
            assert batch.fleet_size == 600 and b_id not in batch.shard_ids
            # uniform priorities over a and c: every weight is the largest
            np.testing.assert_allclose(batch.weights, 1.0, rtol=1e-6)
        dropped = sampler.updates_dropped
        sampler.update_priorities(held, np.full(len(held.keys), 9.0))
        assert sampler.updates_dropped == dropped + int((held.shard_ids == b_id).sum())
        counts = np.zeros(3, dtype=np.int64)
        for batch in batches:
            counts += np.bincount(batch.shard_ids, minlength=3)
        assert_proportional(counts[[0, 2]], [300.0, 300.0])
        name.addresses.append(
            b.address
        )  # back (a pod rescheduled under the same address): a fresh shard view
        time.sleep(resolve_every + BOUND)
        assert sampler.sample(64).fleet_size == 900

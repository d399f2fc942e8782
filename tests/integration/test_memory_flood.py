"""Bounded memory whatever a peer sends (issue 31, item 1; docs/security.md, "Memory under a flood"): real shard
and parameter service processes on loopback, flooded with concurrent large unary calls without a credential and
with an actor's token, keep their RSS growth (VmRSS from /proc, sampled every 10 ms) under the documented bound,
answer every flooding call with a refusal, answer their own roles' calls throughout, and give the memory back
afterwards.

The bounds (docs/security.md): a call refused for its credential is never read, so its body costs the server
nothing but what arrives before the refusal; a unary call that is let in is received in one of
max_reading_requests (4) slots, up to the largest request the server takes (the parameter service: 2 MiB, refused
by gRPC from the length prefix; a shard: Insert's max_message_bytes, so an actor's oversized Info is received
before it is refused), twice (gRPC's buffer and its Python copy).
"""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.parameter_server.client import ParameterClient
from apexrl.replay_server import ReplayClient
from tests.support.flood import MIB, PARAMS, REPLAY, TOKENS, flood, start_server, wait_rss_below

# What the reproduction sent: 3 rounds of 16 concurrent 60 MiB Sample calls (a shard went from 70 MB to
# 2,126 MB and stayed there), and 256 4 MiB GetVersion calls (a parameter service went from 68 MB to 1.6 GB).
SHARD_BODY, SHARD_CALLS, SHARD_ROUNDS = 60 * MIB, 16, 3
PARAMS_BODY, PARAMS_CALLS, PARAMS_ROUNDS = 4 * MIB, 64, 4
# A refused-unread or length-refused flood: what arrives before the refusal and gRPC's own buffers (measured:
# +23 to +136 MB; bench/README.md, `flood_bench.py`).
UNREAD_BOUND_MB = 300
# An actor's oversized Info on a shard: received in one of max_reading_requests (4) slots, twice (gRPC's buffer
# and its Python copy), up to Insert's 64 MiB; the calls waiting for a slot hold their flow-control window.
# The rest: gRPC's buffers and glibc's slack. Measured: 580-1,100 MB.
ACTOR_SHARD_BOUND_MB = 4 * 2 * 64 + 512
# After a flood the trimmer (common/memory.py, every second here) gives the memory back.
AFTER_BOUND_MB = 150
TRIM = ("--trim-memory-seconds", "1")


@pytest.fixture
def shard(tmp_path):
    server = start_server("replay", tmp_path, "--capacity", "1000", *TRIM)
    try:
        with ReplayClient(
            server.address, token=TOKENS["learner"], timeout=30
        ) as first:  # fixes the signature
            # 8 MiB: an Insert may be larger than max_request_bytes (4 MiB), every other request may not
            first.insert({"x": np.zeros((256, 8192), np.float32)})
            first.flush()
        yield server
    finally:
        server.stop()


@pytest.fixture
def params(tmp_path):
    server = start_server("params", tmp_path, *TRIM)
    try:
        yield server
    finally:
        server.stop()


def _check(result, refusal: str, bound_mb: float, honest_calls: int = 1) -> None:
    assert set(result.codes) == {refusal}, result.codes
    assert result.growth_mb < bound_mb, f"RSS grew {result.growth_mb:.0f} MB (bound {bound_mb:.0f} MB)"
    assert not result.honest_errors, result.honest_errors[:3]
    assert len(result.honest_latencies) >= honest_calls, (
        "the server's own role got no answer during the flood"
    )


@pytest.mark.parametrize(
    ("token", "method", "refusal", "bound_mb", "calls"),
    [
        (None, "Sample", "UNAUTHENTICATED", UNREAD_BOUND_MB, SHARD_CALLS),
        (TOKENS["actor"], "Sample", "PERMISSION_DENIED", UNREAD_BOUND_MB, SHARD_CALLS),
        (TOKENS["actor"], "Info", "RESOURCE_EXHAUSTED", ACTOR_SHARD_BOUND_MB, SHARD_CALLS),
    ],
    ids=["no-credential", "actor-sample", "actor-info"],
)
def test_a_flood_of_large_calls_leaves_a_shard_bounded_and_serving_the_learner(
    shard, token, method, refusal, bound_mb, calls
):
    with ReplayClient(shard.address, token=TOKENS["learner"], timeout=30) as learner:
        result = flood(
            shard,
            f"{REPLAY}/{method}",
            body_bytes=SHARD_BODY,
            concurrent=calls,
            rounds=SHARD_ROUNDS,
            token=token,
            honest=lambda: learner.sample(4),
        )
        _check(result, refusal, bound_mb)
        after = wait_rss_below(shard.pid, result.start_mb + AFTER_BOUND_MB, timeout=20)
        assert after < result.start_mb + AFTER_BOUND_MB, f"{after:.0f} MB after the flood"
        assert len(learner.sample(4).keys) == 4


@pytest.mark.parametrize(
    ("token", "refusal"),
    [(None, "UNAUTHENTICATED"), (TOKENS["actor"], "RESOURCE_EXHAUSTED")],
    ids=["no-credential", "actor"],
)
def test_a_flood_of_large_calls_leaves_the_parameter_service_bounded_and_serving_actors(
    params, token, refusal
):
    with ParameterClient(params.address, token=TOKENS["actor"]) as actor:
        result = flood(
            params,
            f"{PARAMS}/GetVersion",
            body_bytes=PARAMS_BODY,
            concurrent=PARAMS_CALLS,
            rounds=PARAMS_ROUNDS,
            token=token,
            honest=actor.version,
        )
        _check(result, refusal, UNREAD_BOUND_MB)
        after = wait_rss_below(params.pid, result.start_mb + AFTER_BOUND_MB, timeout=20)
        assert after < result.start_mb + AFTER_BOUND_MB, f"{after:.0f} MB after the flood"
        assert actor.version() == 0

"""common/refusals.py: refusals counted by method and code, audit lines rate-limited per key with the count held
back (issue 31, item 4)."""

from __future__ import annotations

from apexrl.common.refusals import (
    MAX_AUDIT_KEYS,
    RateLimitedAudit,
    RefusalCollector,
    count_refusal,
    peer_host,
)


def test_one_line_a_window_per_key_and_the_next_says_how_many_were_held_back():
    now, lines = [0.0], []
    audit = RateLimitedAudit(
        lambda message, *args: lines.append(message % args), window=10.0, clock=lambda: now[0]
    )
    for _ in range(500):  # a flood from one peer
        audit(("ipv4:10.0.0.9", "Sample", "UNAUTHENTICATED"), "refused %s", "Sample")
        now[0] += 0.01  # 5 s in all
    audit(
        ("ipv4:10.0.0.7", "Sample", "UNAUTHENTICATED"), "refused %s", "Sample"
    )  # another peer: its own line
    now[0] = 12.0
    audit(("ipv4:10.0.0.9", "Sample", "UNAUTHENTICATED"), "refused %s", "Sample")
    assert lines == [
        "refused Sample",
        "refused Sample",
        "refused Sample (and 499 more like it in the last 10 s)",
    ]


def test_the_keys_remembered_are_bounded():
    audit = RateLimitedAudit(lambda *args: None, clock=lambda: 0.0)
    for i in range(MAX_AUDIT_KEYS + 100):
        audit((f"ipv4:10.0.{i // 256}.{i % 256}",), "refused")
    assert len(audit._keys) == MAX_AUDIT_KEYS


def test_refusals_are_counted_by_method_and_code_and_exported():
    count_refusal("ReplayService/Checkpoint", "PERMISSION_DENIED")
    count_refusal("ReplayService/Checkpoint", "PERMISSION_DENIED")
    (family,) = RefusalCollector().collect()
    samples = {tuple(s.labels.values()): s.value for s in family.samples if s.name.endswith("_total")}
    assert samples[("ReplayService/Checkpoint", "PERMISSION_DENIED")] >= 2
    assert (
        peer_host("ipv4:127.0.0.1:55946") == "ipv4:127.0.0.1" and peer_host("ipv6:[::1]:443") == "ipv6:[::1]"
    )

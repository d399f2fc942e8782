"""Memory under a flood (issue 31, item 1): a real shard and a real parameter service, each a process on loopback
with role tokens, flooded with concurrent large unary calls (no credential, then an actor's token) while a caller
of the server's own role (the learner's Sample, an actor's GetVersion) keeps calling. Prints, per flood, the
server's RSS before, at its peak (VmRSS sampled every 10 ms) and once the memory was given back, the refused
calls per second, and the honest calls' latency during the flood. Results: bench/README.md, `flood_bench.py`.

    .venv/bin/python bench/flood_bench.py [--trim-memory-seconds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, run from anywhere

from apexrl.parameter_server.client import ParameterClient  # noqa: E402
from apexrl.replay_server import ReplayClient  # noqa: E402
from tests.support.flood import MIB, PARAMS, REPLAY, TOKENS, flood, start_server, wait_rss_below  # noqa: E402

FLOODS = [  # (server, method, body MiB, calls at once, rounds, credential)
    ("replay", "Sample", 60, 16, 3, None),
    ("replay", "Sample", 60, 16, 3, "actor"),
    ("replay", "Info", 60, 16, 3, "actor"),
    ("params", "GetVersion", 4, 64, 4, None),
    ("params", "GetVersion", 4, 64, 4, "actor"),
]


def _honest(kind: str, address: str):
    """(client, the call the flood's honest thread repeats)."""
    if kind == "replay":
        with ReplayClient(address, token=TOKENS["learner"], timeout=30) as first:  # fixes the signature
            first.insert({"x": np.zeros((64, 4), np.float32)})
            first.flush()
        learner = ReplayClient(address, token=TOKENS["learner"], timeout=30)
        return learner, lambda: learner.sample(4)
    actor = ParameterClient(address, token=TOKENS["actor"])
    return actor, actor.version


def run(kind: str, method: str, mib: int, calls: int, rounds: int, credential: str | None, trim: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        extra = ("--capacity", "1000") if kind == "replay" else ()
        server = start_server(kind, Path(directory), *extra, "--trim-memory-seconds", trim)
        try:
            client, honest = _honest(kind, server.address)
            with client:
                result = flood(
                    server,
                    f"{REPLAY if kind == 'replay' else PARAMS}/{method}",
                    body_bytes=mib * MIB,
                    concurrent=calls,
                    rounds=rounds,
                    token=None if credential is None else TOKENS[credential],
                    honest=honest,
                )
            after = wait_rss_below(server.pid, result.start_mb + 50, timeout=3 * max(1.0, float(trim)) + 5)
        finally:
            server.stop()
    codes = ",".join(f"{code} {n}" for code, n in sorted(result.codes.items()))
    print(
        f"| {kind} {method} | {credential or 'none'} | {rounds} x {calls} x {mib} MiB | {codes} | "
        f"{result.start_mb:.0f} | {result.peak_mb:.0f} | {after:.0f} | {result.refused_per_second:.0f} | "
        f"{len(result.honest_latencies)} ({len(result.honest_errors)} failed) | "
        f"{result.honest_ms(0.5):.1f} / {result.honest_ms(0.99):.1f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trim-memory-seconds", default="5", help="the servers' setting (0: no trimming)")
    args = parser.parse_args()
    print(
        "| flood | credential | calls | answers | RSS before MB | peak MB | after MB | refused/s | honest calls | "
        "honest p50 / p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, method, mib, calls, rounds, credential in FLOODS:
        run(kind, method, mib, calls, rounds, credential, args.trim_memory_seconds)


if __name__ == "__main__":
    main()

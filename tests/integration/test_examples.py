"""The README's custom-actor example runs against a real shard and a real parameter service."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from apexrl.actor import ReplayClient
from apexrl.parameter_server.service import create_parameter_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_actor.py"


def test_custom_actor_example_fills_a_shard_and_pulls_weights(shard):
    server, port, store, _ = create_parameter_server("127.0.0.1:0")
    try:
        store.publish({"w": np.zeros(3, np.float32)})
        out = subprocess.run(
            [sys.executable, str(EXAMPLE), "--replay", shard.address, "--params", f"127.0.0.1:{port}",
             "--steps", "640", "--batch-size", "64"],
            capture_output=True, text=True, timeout=120, check=True,
        )
    finally:
        server.stop(0)
    assert "shard holds 640 rows; weights version 1" in out.stdout
    with ReplayClient(shard.address) as client:
        batch = client.sample(32)
    assert set(batch.columns) == {"obs", "action", "reward", "discount", "next_obs"}
    assert set(np.unique(batch.columns["action"])) <= {0, 1}

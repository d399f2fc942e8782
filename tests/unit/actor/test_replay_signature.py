"""`replay_signature` names exactly the columns the built-in actor writes (what the launcher pins with
--signature): checked against columns made the actor's way from real environments' observations and actions."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.algorithms.nstep import Transition, item_columns, replay_signature, stored_action, stored_obs
from apexrl.common.compression import compress_image_columns
from apexrl.common.environments import env_spaces, make_env
from apexrl.common.signature import ROW_VERSION_COLUMN, Signature


def written_columns(env_id: str, compression: str) -> dict:
    env = make_env(env_id)
    try:
        obs, _ = env.reset(seed=0)
        action = env.action_space.sample()
        next_obs, reward, *_ = env.step(action)
    finally:
        env.close()
    transitions = [
        Transition(stored_obs(obs), stored_action(action), float(reward), 0.99, stored_obs(next_obs))
    ] * 3
    columns = item_columns(transitions)
    columns[ROW_VERSION_COLUMN] = np.zeros(3, dtype=np.int64)
    return compress_image_columns(columns, compression)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MinAtar/Breakout-v1"])
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_the_pinned_signature_is_what_the_actor_writes(env_id, compression):
    if env_id.startswith("MinAtar"):
        pytest.importorskip("minatar")
    columns = written_columns(env_id, compression)
    pinned = replay_signature(env_spaces(env_id), compression)
    assert pinned == Signature.from_batch(columns)
    assert pinned.check_batch(columns) == 3


def test_pixels_are_pinned_compressed_and_vectors_raw():
    pytest.importorskip("minatar")
    assert str(replay_signature(env_spaces("CartPole-v1"), "zstd")).startswith(
        "obs:float32[4],action:int64[]"
    )
    assert str(replay_signature(env_spaces("MinAtar/Breakout-v1"), "lz4")).startswith("obs:bool[10,10,4]@lz4")


def test_apexrl_signature_prints_what_a_shard_takes_as_signature():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "signature", "--env", "Pendulum-v1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Signature.parse(done.stdout.strip()) == replay_signature(env_spaces("Pendulum-v1"), "zstd")
    bad = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "signature", "--env", "NoSuchEnv-v0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    mismatched = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "signature", "--env", "Pendulum-v1", "--algorithm", "dqn"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert mismatched.returncode == 2 and "--algorithm: algorithm dqn needs a Discrete" in mismatched.stderr


def test_apexrl_signature_prints_a_sequence_shards_window_and_fields_as_the_launcher_gives_them():
    """`--part item-signature` and `--part max-sequence-length` (k8s/overlays/recurrent-cpu's values) are what
    `apexrl launch --algorithm r2d2` starts its shards with; a transition algorithm has neither (one line, exit 2)."""
    import subprocess
    import sys

    from apexrl.launcher.commands import sequence_table, with_algorithm
    from apexrl.launcher.topology import local_fleet

    def printed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "apexrl.launcher", "signature", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    table = sequence_table(with_algorithm(local_fleet(env="CartPoleNoVel-v1", algorithm="r2d2")), {})
    r2d2 = ("--env", "CartPoleNoVel-v1", "--algorithm", "r2d2", "--part")
    assert printed(*r2d2, "item-signature").stdout.strip() == str(table["item_signature"])
    assert int(printed(*r2d2, "max-sequence-length").stdout) == table["max_sequence_length"]
    transitions = printed("--env", "CartPole-v1", "--part", "item-signature")
    assert transitions.returncode == 2 and len(transitions.stderr.strip().splitlines()) == 1
    assert "dqn writes transitions" in transitions.stderr


def test_the_launcher_pins_what_the_algorithms_writing_half_says():
    """The launcher asks the run's algorithm for the signature (its writing half), not a module of the actor."""
    from apexrl.algorithms.registry import for_spaces
    from apexrl.common.env_settings import EnvChoice
    from apexrl.launcher.commands import built_in_signature

    for env_id, algorithm in (
        ("CartPole-v1", "auto"),
        ("Pendulum-v1", "dpg"),
        ("MinAtar/Breakout-v1", "dqn"),
    ):
        spaces = env_spaces(env_id)
        writing = for_spaces(algorithm, spaces).writing()
        assert built_in_signature(EnvChoice(env_id), "zstd", algorithm) == writing.replay_signature(
            spaces, "zstd"
        )

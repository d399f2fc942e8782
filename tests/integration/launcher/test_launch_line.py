"""What `apexrl launch` tells a newcomer it chose: the first line of a launch names the algorithm, why, and its
options; `--device` is a launch flag checked like every other; `launch --help` points to each role's settings and
how to pass them."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import apexrl
from tests.integration.launcher.test_cli import help_output


def launch_line(tmp_path, caplog, **settings) -> tuple[str, list[str]]:
    """The first line of a local fleet's launch, stopped at once (its shard is stopped while it starts)."""
    caplog.set_level(logging.INFO, logger="apexrl.launch")
    config = apexrl.local_fleet(num_shards=1, num_actors=1, run_dir=str(tmp_path / "run"), **settings)
    with apexrl.launch(config) as run:
        pass
    assert run.wait(60).reason in ("stopped", "startup_failed")
    lines = [r.getMessage() for r in caplog.records if r.name == "apexrl.launch"]
    return next(line for line in lines if line.startswith("launching ")), lines


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "chosen"),
    [
        ("CartPole-v1", "dqn (auto: Discrete actions); target return 475.0"),
        (
            "Pendulum-v1",
            "dpg (auto: Box actions), TD3 options: twin_critics on, policy_delay 2, target_noise 0.2, "
            "target_noise_clip 0.5; target return -150.0",
        ),
    ],
)
def test_the_launch_line_says_which_algorithm_and_options_it_chose_and_why(tmp_path, caplog, env, chosen):
    line, lines = launch_line(tmp_path, caplog, env=env)
    assert line.startswith(f"launching {env} on local with {chosen}, at most 1200s; run directory "), lines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device", "gpu"],
            "--device ('gpu') must be auto, cpu, cuda, mps, xpu, or one of those with an index",
        ),
        (["--learner-arg=--device=cuda:x"], "learner: --device: device ('cuda:x') must be auto, cpu, cuda"),
    ],
)
def test_a_device_torch_does_not_name_is_one_line_and_exit_2(tmp_path, argv, message):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "launch",
            "--num-actors",
            "1",
            "--run-dir",
            str(run_dir),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("apexrl launch: error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not run_dir.exists()


def test_launch_help_points_to_each_roles_settings_and_how_to_pass_them():
    text = help_output("launch")
    for role in ("replay", "learner", "actor"):
        assert f"`apexrl {role} --help`" in text, role
    assert "--learner-arg='--policy-delay 1 --target-noise 0.1'" in text
    assert "with --replay-arg, --learner-arg, --actor-arg or --evaluator-arg" in text
    assert "--device DEVICE torch device of the learner: auto (cuda when torch sees a GPU, else cpu)" in text

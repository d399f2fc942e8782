"""What a launch chose and where it trains (launcher/commands.py): the launch line's account of the algorithm (name,
why, the options only it reads, as the learner will run them), and `--device` / [fleet] device, the learner's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apexrl.common.settings import SettingsError, parse_argv
from apexrl.launcher.commands import command, describe_algorithm
from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.topology import local_fleet, roles, wiring
from apexrl.learner.config import LearnerConfig
from tests.unit.launcher.fleets import fleet

RUN = Path("/run")
TD3 = "TD3 options: twin_critics on, policy_delay 2, target_noise 0.2, target_noise_clip 0.5"


def pendulum(**learner) -> dict:
    return fleet(fleet={"env": "Pendulum-v1"}, learner={"host": "m1", "port": 7100, **learner})


def test_the_algorithm_is_named_with_why_and_its_options():
    assert describe_algorithm(local_fleet(num_actors=1), "local", RUN, {}) == "dqn (auto: Discrete actions)"
    config = local_fleet(num_actors=1, env="Pendulum-v1")
    assert describe_algorithm(config, "local", RUN, {}) == f"dpg (auto: Box actions), {TD3}"
    # Named explicitly, it is still the one algorithm for the space: the same words.
    named = local_fleet(num_actors=1, env="Pendulum-v1", algorithm="dpg")
    assert describe_algorithm(named, "local", RUN, {}) == f"dpg (auto: Box actions), {TD3}"


def test_the_options_are_those_the_learner_will_run_with():
    config = parse_config(pendulum(twin_critics=False, policy_learning_rate=3e-4))
    extra = {"learner": ["--policy-delay", "1"]}
    assert describe_algorithm(config, "m1", RUN, extra) == (
        "dpg (auto: Box actions), TD3 options: policy_learning_rate 0.0003, twin_critics off, policy_delay 1, "
        "target_noise 0.2, target_noise_clip 0.5"
    )
    # A machine without the learner: its pass-through args do not reach it; the table's values do.
    assert describe_algorithm(config, "m2", RUN, extra) == (
        "dpg (auto: Box actions), TD3 options: policy_learning_rate 0.0003, twin_critics off, policy_delay 2, "
        "target_noise 0.2, target_noise_clip 0.5"
    )


def learner_argv(data: dict) -> list[str]:
    config = parse_config(data)
    learner = next(r for r in roles(config) if r.kind == "learner")
    return command(config, learner, wiring(config, "m1"), RUN)


def device_of(argv: list[str]) -> str | None:
    return argv[argv.index("--device") + 1] if "--device" in argv else None


def test_the_fleets_device_reaches_the_learner_over_its_tables():
    assert device_of(learner_argv(fleet(fleet={"device": "cuda:1"}))) == "cuda:1"
    learner = {"host": "m1", "port": 7100, "device": "cpu"}
    assert device_of(learner_argv(fleet(learner=learner))) == "cpu"  # the [learner] table's, as before
    assert device_of(learner_argv(fleet(fleet={"device": "cuda"}, learner=learner))) == "cuda"
    assert device_of(learner_argv(fleet())) is None  # auto, the learner's default
    assert local_fleet(num_actors=1, device="auto").device == "auto"


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CUDA", ""])
def test_a_device_torch_does_not_name_is_refused_by_the_fleet_and_the_learner(device):
    message = f"device ({device!r}) must be auto, cpu, cuda, mps, xpu, or one of those with an index (cuda:1)"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        local_fleet(num_actors=1, device=device)
    with pytest.raises(ConfigError, match=f"^{re.escape('[fleet]: ' + message)}$"):
        parse_config(fleet(fleet={"device": device}))
    with pytest.raises(SettingsError, match=f"^--device: {re.escape(message)}$"):
        parse_argv(LearnerConfig, ["--replay", "a:1", "--device", device], prog="apexrl learner")

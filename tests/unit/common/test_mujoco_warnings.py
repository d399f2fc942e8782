"""MuJoCo appends its warnings to MUJOCO_LOG.TXT in the working directory of every process that makes one of its
environments; apexrl's environments send them to the log instead (each distinct message once)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
from apexrl.common.environments import make_env
for _ in range(3):
    env = make_env("HalfCheetah-v5")
    env.reset(seed=0)
    env.close()
import mujoco
hook = mujoco.get_mju_user_warning()  # what MuJoCo calls with each warning
for _ in range(2):
    hook("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
"""


def test_a_mujoco_environment_writes_no_log_file_and_logs_each_warning_once(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True
    )
    assert list(tmp_path.iterdir()) == [], "MuJoCo wrote into the working directory"
    lines = [line for line in out.stderr.splitlines() if "MuJoCo: " in line]
    unstable = [line for line in lines if "QACC" in line]
    assert unstable == [
        "WARNING apexrl.environments MuJoCo: Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable."
    ]
    # Gymnasium's HalfCheetah model used a deprecated compiler attribute (MuJoCo 4.0): at most one debug line for
    # three environments.
    deprecated = [line for line in lines if "deprecated" in line]
    assert len(deprecated) <= 1 and all(line.startswith("DEBUG ") for line in deprecated), lines
    assert len(lines) == len(unstable) + len(deprecated), lines

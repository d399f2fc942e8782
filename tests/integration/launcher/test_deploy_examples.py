"""What docs/deploy-machines.md ships for bare machines: the example fleet files parse with the launcher's own
parser into the placements they describe, and every machine's role commands pass the launcher's pre-flight check;
the systemd unit passes `systemd-analyze verify` (where installed), runs an `apexrl launch` command line that the
real CLI accepts, and stops and sandboxes the launcher as documented."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apexrl.launcher.cli import build_parser
from apexrl.launcher.commands import check_commands
from apexrl.launcher.fleet_config import FleetSettings
from apexrl.launcher.fleet_file import load_config
from apexrl.launcher.main import resolve_config
from apexrl.launcher.topology import checks_target, host_names, roles, roles_on

ROOT = Path(__file__).resolve().parents[3]
FLEETS = ROOT / "examples" / "fleets"
SYSTEMD = ROOT / "examples" / "systemd"
UNIT = SYSTEMD / "apexrl-launch@.service"
INSTALLED_APEXRL = "/opt/apexrl/bin/apexrl"  # where the unit expects the install (docs/deploy-machines.md)
INSTALLED_FLEET = "/etc/apexrl/fleet.toml"


def placement(path: Path) -> dict[str, set[str]]:
    """Host -> kinds of the roles it runs."""
    config = load_config(path)
    result: dict[str, set[str]] = {}
    for role in roles(config):
        result.setdefault(role.host, set()).add(role.kind)
    return result


@pytest.mark.parametrize(
    "name", ["one_machine.toml", "three_machines.toml", "continuous_one_machine.toml", "../fleet.toml"]
)
def test_every_machine_of_an_example_fleet_passes_the_launchers_preflight(name, tmp_path):
    config = load_config(FLEETS / name)
    for host in host_names(config):
        check_commands(config, host, tmp_path / host, extra_args={})  # ConfigError names a bad setting


def test_every_example_fleet_reruns_in_a_fresh_run_directory():
    """No example fixes run_dir: a second launch of the same file must not find the first run's directory (it
    would be refused, pointing to --resume)."""
    for path in [FLEETS.parent / "fleet.toml", *sorted(FLEETS.glob("*.toml"))]:
        assert load_config(path).run_dir is None, path


def test_one_machine_example_is_the_local_fleet_on_loopback():
    config = load_config(FLEETS / "one_machine.toml")
    assert placement(FLEETS / "one_machine.toml") == {"local": {"replay", "learner", "actor", "evaluator"}}
    assert config.bind == "127.0.0.1" and checks_target(config, "local")
    args = build_parser().parse_args(["launch", "--config", str(FLEETS / "one_machine.toml")])
    assert resolve_config(args)[1] == "local"  # --host-name is optional with one host


def test_three_machines_example_puts_shards_learner_and_actors_on_their_own_machines():
    path = FLEETS / "three_machines.toml"
    config = load_config(path)
    assert placement(path) == {"m1": {"replay"}, "m2": {"learner", "evaluator"}, "m3": {"actor"}}
    assert config.bind == "0.0.0.0" and sorted(config.hosts) == ["m1", "m2", "m3"]
    assert config.run_dir is None  # each (re)start gets a fresh runs/ENV-TIMESTAMP (see the unit's Restart=)
    assert [host for host in host_names(config) if checks_target(config, host)] == ["m2"]
    # Every port another machine connects to is fixed (the launcher can only pick ports for local users).
    for role in roles(config):
        assert role.metrics_port, role
        assert role.port or role.kind in ("actor", "evaluator"), role
    # The [hosts] addresses are documentation placeholders (RFC 5737), replaced on a real deployment.
    assert all(address.startswith("192.0.2.") for address in config.hosts.values())


# --- systemd ------------------------------------------------------------------------------------------------------


def read_unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


def exec_start(unit: configparser.ConfigParser, instance: str) -> list[str]:
    return [word.replace("%i", instance) for word in shlex.split(unit["Service"]["ExecStart"])]


def test_unit_runs_apexrl_launch_with_flags_the_cli_accepts():
    unit = read_unit(UNIT)
    argv = exec_start(unit, "m2")
    assert argv[0] == INSTALLED_APEXRL and argv[1] == "launch"
    assert argv[2:] == ["--config", INSTALLED_FLEET, "--host-name", "m2"]
    launch_help = subprocess.run(
        [sys.executable, "-m", "apexrl.launcher", "launch", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in (word for word in argv[2:] if word.startswith("--")):
        assert re.search(rf"(^|\s){re.escape(flag)}\b", launch_help), flag
    # The launcher resolves exactly that command line (the installed fleet file here being the shipped example).
    args = build_parser().parse_args(
        [w.replace(INSTALLED_FLEET, str(FLEETS / "three_machines.toml")) for w in argv[1:]]
    )
    config, host = resolve_config(args)
    assert host == "m2" and {r.name for r in roles_on(config, host)} == {"learner", "evaluator"}


def test_unit_stops_the_launcher_gracefully_and_sandboxes_it():
    service = read_unit(UNIT)["Service"]
    # SIGTERM reaches the launcher alone, which stops the roles in order (two groups, each within stop_grace).
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    stop_grace = FleetSettings().stop_grace
    assert seconds(service["TimeoutStopSec"]) >= 2 * stop_grace + 20
    assert service["Restart"] == "on-failure" and set(service["RestartPreventExitStatus"].split()) == {
        "1",
        "2",
    }
    assert service["User"] == "apexrl" and service["User"] != "root"
    hardening = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
    }
    assert {key: service.get(key) for key in hardening} == hardening
    # The only writable places are the state and cache directories; the launcher runs (and writes) in the former.
    assert service["StateDirectory"] == "apexrl" and service["WorkingDirectory"] == "/var/lib/apexrl"
    assert "ReadWritePaths" not in service
    sysusers = (SYSTEMD / "apexrl.sysusers.conf").read_text()
    assert re.search(r"^u apexrl - .* /var/lib/apexrl ", sysusers, re.M)


def seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min)?", value.strip()).groups()
    return float(number) * (60 if unit == "min" else 1)


def installed_copy(tmp_path: Path) -> Path:
    """The unit as it would be installed, instantiated for m1, with ExecStart pointing at this checkout's apexrl
    when /opt/apexrl is not installed here (systemd-analyze verify checks that the program exists)."""
    text = UNIT.read_text()
    if not Path(INSTALLED_APEXRL).exists():
        apexrl = Path(sys.executable).with_name("apexrl")
        assert apexrl.exists(), f"no apexrl entry point beside {sys.executable}"
        text = text.replace(INSTALLED_APEXRL, str(apexrl))
    copy = tmp_path / "apexrl-launch@m1.service"
    copy.write_text(text)
    return copy


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    done = subprocess.run(
        ["systemd-analyze", "verify", str(installed_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), (
        done.stderr + done.stdout
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_rates_the_units_exposure_low(tmp_path):
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(installed_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip(f"this systemd-analyze has no offline security check: {done.stderr.strip()}")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert match, done.stdout[-2000:] + done.stderr
    assert float(match.group(1)) <= 2.5, done.stdout  # 0 = fully sandboxed, 10 = not at all; 1.7 when written


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed here")
def test_sysusers_file_creates_the_units_user(tmp_path):
    (tmp_path / "etc").mkdir()
    subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD / "apexrl.sysusers.conf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    entry = next(
        line for line in (tmp_path / "etc" / "passwd").read_text().splitlines() if line.startswith("apexrl:")
    )
    assert entry.split(":")[5:] == ["/var/lib/apexrl", "/usr/sbin/nologin"]

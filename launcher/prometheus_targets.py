"""Prometheus file-based service discovery for the roles `apexrl launch` runs on one machine.

`RUN_DIR/prometheus/targets.json` lists every local role's /metrics address with the labels the rules and
dashboards in monitoring/ select on:

    [{"targets": ["127.0.0.1:40123"], "labels": {"job": "apexrl-replay", "role": "shard-0", "host": "local"}}, ...]

Point a Prometheus scrape job at it with `file_sd_configs` (monitoring/prometheus/prometheus.yml is a complete
example); Prometheus re-reads the file when it changes, and a target label `job` overrides the scrape job's name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from apexrl.common.files import atomic_write
from apexrl.launcher.fleet_config import FleetConfig
from apexrl.launcher.topology import Role, address

log = logging.getLogger("apexrl.launch")

# Role kind -> Prometheus job label. A standalone `apexrl params` (not started by the launcher) is "apexrl-params".
JOBS = {
    "replay": "apexrl-replay",
    "learner": "apexrl-learner",
    "actor": "apexrl-actor",
    "evaluator": "apexrl-evaluator",
}
PARAMS_JOB = "apexrl-params"
TARGETS_FILE = Path("prometheus") / "targets.json"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def target_groups(config: FleetConfig, host: str, roles: Iterable[Role]) -> list[dict]:
    """One file-SD target group per role with a metrics port, in the fleet's start order.

    The address is the one a Prometheus server would use: loopback when the fleet listens on loopback only,
    else the machine's address from the fleet's [hosts] table (or its name)."""
    seen_from = host if config.bind in _LOOPBACK else ""  # "": another machine
    groups = []
    for role in roles:
        if not role.metrics_port or role.metrics_port < 0:
            continue
        groups.append(
            {
                "targets": [address(config, role.host, role.metrics_port, seen_from)],
                "labels": {"job": JOBS[role.kind], "role": role.name, "host": role.host},
            }
        )
    return groups


def write_targets(run_dir: Path, config: FleetConfig, host: str, roles: Iterable[Role]) -> Path:
    """Write RUN_DIR/prometheus/targets.json atomically and log how to point Prometheus at it."""
    path = atomic_write(
        Path(run_dir) / TARGETS_FILE, json.dumps(target_groups(config, host, roles), indent=2) + "\n"
    ).resolve()
    log.info(
        "Prometheus targets of this machine's roles: %s; scrape them with\n"
        "  scrape_configs: [{job_name: apexrl, scrape_interval: 5s, file_sd_configs: [{files: ['%s']}]}]\n"
        "  (rules and a complete example: monitoring/prometheus/)",
        path,
        path,
    )
    return path

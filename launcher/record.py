"""RUN_DIR/config.json: what a run records of itself, and reading it back to resume the run.

The fleet is recorded under `fleet_file` as the launcher resolved it before picking any port, in the fleet file's
own schema (`fleet_file.py`; JSON instead of TOML), so `--resume` reads it back through the same validation as a
fleet file, and a user can copy it into a fleet file of their own. Every token is redacted (never written), so a
resumed run takes its token again from --token, --token-file or APEXRL_TOKEN; a token file's path is kept.

A resume continues the recorded fleet and changes only what steers the launch (RESUMABLE): every other setting
shapes the fleet (roles, environment, algorithm, replay, seeds), and the learner's and shards' checkpoints were
written for that fleet, so a change there is a new run, not a resume: it is refused, naming the setting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apexrl.common.settings import SettingsError, settings_of
from apexrl.launcher.fleet_config import ConfigError, FleetConfig, FleetSettings
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.run_dir import CONFIG_NAME, check_resumable

RECORD_KEY = "fleet_file"
REDACTED = "<redacted>"

# FleetSettings a resume may change: when this launch stops and how it reports and waits (the fleet runs the same
# processes), and this machine's secrets and TLS files (config.json keeps no token; files may have moved).
RESUMABLE = (
    "max_seconds",
    "target_return",
    "progress_seconds",
    "stop_grace",
    "startup_timeout",
    "max_restarts",
    "restart_window",
    "token",
    "token_file",
    "open",
    "tls_cert",
    "tls_key",
    "tls_ca",
)


def redacted(value: Any) -> Any:
    """`value` (nested dicts and lists) with the value of every `token` key that is set replaced by REDACTED: the
    fleet's token, a role table's, a `--token` launch option. Paths (token_file) stay."""
    if isinstance(value, dict):
        return {k: REDACTED if k == "token" and v else redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def fleet_record(config: FleetConfig) -> dict[str, Any]:
    """`config` in the fleet file's schema, JSON values only (tokens not yet redacted: `redacted` does that)."""
    table = {
        "fleet": {s.name: _plain(getattr(config, s.name)) for s in settings_of(FleetSettings)},
        "hosts": dict(config.hosts),
        "shard": [
            _placed(s.settings, host=s.host, port=s.port or None, metrics_port=s.metrics_port)
            for s in config.shards
        ],
        "learner": _placed(
            config.learner.settings,
            host=config.learner.host,
            port=config.learner.port,
            metrics_port=config.learner.metrics_port,
        ),
        "actors": [
            _placed(
                g.settings, host=g.host, count=g.count, first_index=g.first_index, metrics_port=g.metrics_port
            )
            for g in config.actors
        ],
    }
    if config.evaluator is not None:
        table["evaluator"] = _placed(
            config.evaluator.settings, host=config.evaluator.host, metrics_port=config.evaluator.metrics_port
        )
    return table


@dataclass(frozen=True)
class RecordedRun:
    """A run read back from its config.json, with the resume's changes applied."""

    config: FleetConfig
    host: str
    extra_args: dict[str, list[str]]
    launch_options: dict[str, Any]  # of the first launch
    started_at: str | None  # the first launch's start
    resumed_at: tuple[str, ...]  # earlier resumes' start times
    needs_token: bool  # the fleet ran with a token: the resume must be given it again


def read_run(run_dir: Path, changes: Mapping[str, Any]) -> RecordedRun:
    """The run recorded in `run_dir`, to be started again with `changes` (RESUMABLE settings only); ConfigError
    naming the fault: no run there, a record that cannot be read, a setting a resume may not change."""
    check_resumable(run_dir)
    refused = [name for name in changes if name not in RESUMABLE]
    if refused:
        raise ConfigError(
            f"--resume continues the recorded fleet: {', '.join('--' + n.replace('_', '-') for n in refused)} "
            f"would change it (a resume may change only {', '.join(RESUMABLE)}); start a new run instead"
        )
    try:
        FleetSettings(**changes)
    except SettingsError as err:
        raise ConfigError(f"--resume: {err}") from None
    path = run_dir / CONFIG_NAME
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--resume: cannot read {path}: {err}") from None
    table = doc.get(RECORD_KEY) if isinstance(doc, dict) else None
    if not isinstance(table, dict) or not isinstance(table.get("fleet"), dict):
        raise ConfigError(
            f"--resume: {path} records no fleet to resume (written by an apexrl without --resume); start a new run"
        )
    for where, entry in _role_tables(table):
        if entry.get("token"):
            raise ConfigError(
                f"--resume: {path}: {where} had its own token, which config.json does not keep; give that role "
                f"a token_file in its table (a new run), or resume a fleet whose roles use the fleet's token"
            )
    fleet = dict(table["fleet"])
    needs_token = bool(fleet.get("token"))
    fleet.update({"token": None, "run_dir": str(run_dir), **changes})
    try:
        config = parse_config({**table, "fleet": fleet}, picked_ports=True)
    except SettingsError as err:
        raise ConfigError(f"--resume: {path}: {err}") from None
    host = doc.get("host_name")
    extra = doc.get("pass_through_args", {})
    if not isinstance(host, str) or not isinstance(extra, dict):
        raise ConfigError(f"--resume: {path} records no host_name or pass_through_args")
    return RecordedRun(
        config=config,
        host=host,
        extra_args={str(kind): [str(a) for a in args] for kind, args in extra.items()},
        launch_options=dict(doc.get("launch_options") or {}),
        started_at=doc.get("started_at"),
        resumed_at=tuple(doc.get("resumed_at") or ()),
        needs_token=needs_token,
    )


def write_record(path: Path, doc: Mapping[str, Any]) -> None:
    """config.json, written atomically with every token redacted."""
    from apexrl.common.files import atomic_write

    atomic_write(path, json.dumps(redacted(dict(doc)), indent=2, default=str) + "\n")


def _role_tables(table: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = [(f"[[shard]] #{i}", t) for i, t in enumerate(table.get("shard") or [])]
    found += [("[learner]", table.get("learner") or {})]
    found += [(f"[[actors]] #{i}", t) for i, t in enumerate(table.get("actors") or [])]
    if "evaluator" in table:
        found.append(("[evaluator]", table["evaluator"]))
    return [(where, t) for where, t in found if isinstance(t, Mapping)]


def _placed(settings: Mapping[str, Any], **placement: Any) -> dict[str, Any]:
    """A role's table: where it runs (keys with a value), then its own settings."""
    return {
        **{k: v for k, v in placement.items() if v is not None},
        **{k: _plain(v) for k, v in settings.items()},
    }


def _plain(value: Any) -> Any:
    """A JSON value a fleet-file key reads back as `value`: lists for tuples, the text form of other types
    (environment arguments, signatures), as `Setting.coerce` parses them."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
